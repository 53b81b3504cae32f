"""What a sandbox is asked for (`SandboxSpec`), what one exec returns (`ExecResult`), the one
error a sandbox raises (`SandboxError`) and the `Sandbox` protocol every provider implements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, Protocol, runtime_checkable
from urllib.parse import urlsplit

NetworkPolicy = Literal["none", "model-only"]


@dataclass(frozen=True)
class SandboxSpec:
    """One sandbox's image or root, contents, environment and limits.

    `memory_bytes` is RLIMIT_AS per process, `pids` the most processes (and threads) the
    sandbox may have at once, `disk_bytes` the largest file it may write (RLIMIT_FSIZE; the
    bubblewrap `/tmp` tmpfs is capped to it too), `cpu_seconds` RLIMIT_CPU per process, and
    `ttl_seconds` how long a sandbox may live before any exec on it is refused. `cpus` (cores)
    needs cgroups: the docker provider (later) takes it; bubblewrap and process refuse it.

    `network="model-only"` needs `model_url`, the host-side URL of the rollout proxy
    (`http://127.0.0.1:PORT[/path]`, or `http://HOST:PORT[/path]`): the sandbox reaches that
    and nothing else, at its own `model_url` (`http://127.0.0.1:PORT[/path]` inside, also
    in the `ATROPOS_MODEL_URL` variable of every exec).
    """

    image: str | None = None  # docker (later)
    root: Path | None = None  # bubblewrap: a directory to use as a read-only root
    files: Mapping[str, bytes] = field(default_factory=dict)  # put in at start
    env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = "/work"
    user: str | None = None  # inside the sandbox: bubblewrap maps to this uid number
    cpus: float | None = None
    memory_bytes: int | None = 1 << 30
    pids: int | None = 64
    disk_bytes: int | None = 1 << 30
    cpu_seconds: int | None = None
    network: NetworkPolicy = "none"
    model_url: str | None = None  # model-only: the rollout proxy's URL on the host
    ttl_seconds: float | None = None
    output_bytes: int = 1 << 20  # kept per stream and exec; the rest is dropped (truncated)

    def __post_init__(self) -> None:
        if self.network not in ("none", "model-only"):
            raise ValueError(f"network must be 'none' or 'model-only', not {self.network!r}")
        if self.network == "model-only":
            if self.model_url is None:
                raise ValueError(
                    "network='model-only' needs model_url, the rollout proxy's URL on the "
                    "host, e.g. model_url='http://127.0.0.1:8000/v1'"
                )
            model_target(self.model_url)
        elif self.model_url is not None:
            raise ValueError(
                f"model_url={self.model_url!r} is only used with network='model-only' "
                f"(network is {self.network!r}): set both or neither"
            )
        if not self.workdir.startswith("/"):
            raise ValueError(f"workdir must be an absolute path, not {self.workdir!r}")
        for name in ("memory_bytes", "pids", "disk_bytes", "cpu_seconds", "output_bytes"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, not {value}")


def model_target(url: str) -> tuple[str, int, str]:
    """The (host, port, path) a model-only sandbox relays to; a `ValueError` naming the fix
    for anything but a plain `http://host[:port][/path]` URL.

    >>> model_target("http://127.0.0.1:8000/v1")
    ('127.0.0.1', 8000, '/v1')
    """
    example = "e.g. 'http://127.0.0.1:8000/v1'"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise ValueError(f"model_url {url!r} is not a URL ({error}); {example}") from None
    if parts.scheme != "http":
        raise ValueError(
            f"model_url {url!r} must be http:// (the sandbox's relay passes bytes unchanged; "
            f"the proxy it reaches is plain HTTP on this host or network); {example}"
        )
    if not parts.hostname:
        raise ValueError(f"model_url {url!r} names no host; {example}")
    if port == 0:
        raise ValueError(f"model_url {url!r} has port 0; give the proxy's port")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"model_url {url!r} carries credentials; pass keys as headers")
    if parts.query or parts.fragment:
        raise ValueError(f"model_url {url!r} has a query or fragment; give a base URL only")
    return parts.hostname, 80 if port is None else port, parts.path.rstrip("/")


def inside_url(url: str) -> str:
    """The URL a model-only sandbox reaches `url` at: the same port and path on its own
    loopback, where its relay listens.

    >>> inside_url("http://proxy.internal:9000/v1")
    'http://127.0.0.1:9000/v1'
    """
    _, port, path = model_target(url)
    return f"http://127.0.0.1:{port}{path}"


@dataclass(frozen=True)
class ExecResult:
    # the command's status; killed by signal n: -n where we reap it ourselves (process),
    # 128+n where an init inside reports it as a shell does (bubblewrap, docker);
    # -9 with timed_out after a deadline, whatever the provider
    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    truncated: bool = False  # a stream went past spec.output_bytes; the rest was dropped

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class SandboxError(RuntimeError):
    """The sandbox itself failed (start, death, setup), not the command run in it: count the
    rollout failed, never score it. `reason` is a short word: start_failed, start_timeout,
    dead, closed, expired, unsupported, unavailable."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason


@runtime_checkable
class Sandbox(Protocol):
    """An isolated place to run commands; `close()` ends every process it made and removes
    every file and label (idempotent). Use it as `async with`."""

    provider: str
    spec: SandboxSpec

    async def exec(
        self,
        command: Sequence[str] | str,
        timeout: float,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult: ...

    async def put(self, path: str, data: bytes | Path) -> None: ...

    async def get(self, path: str) -> bytes: ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

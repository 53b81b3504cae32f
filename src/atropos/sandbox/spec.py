"""What a sandbox is asked for (`SandboxSpec`), what one exec returns (`ExecResult`), the one
error a sandbox raises (`SandboxError`) and the `Sandbox` protocol every provider implements."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Literal, Protocol, runtime_checkable
from urllib.parse import urlsplit

from typing_extensions import Self

NetworkPolicy = Literal["none", "model-only"]
Profile = Literal["locked", "task"]


@dataclass(frozen=True)
class SandboxSpec:
    """One sandbox's image or root, contents, environment and limits.

    `memory_bytes` is RLIMIT_AS per process, `pids` the most processes (and threads) the
    sandbox may have at once, `disk_bytes` the largest file it may write (RLIMIT_FSIZE; the
    bubblewrap `/tmp` tmpfs is capped to it too), `cpu_seconds` RLIMIT_CPU per process, and
    `ttl_seconds` how long a sandbox may live before any exec on it is refused. `cpus` (cores)
    needs cgroups: the docker provider takes it; bubblewrap and process refuse it.

    `network="model-only"` needs `model_url`, the host-side URL of the rollout proxy
    (`http://127.0.0.1:PORT[/path]`, or `http://HOST:PORT[/path]`): the sandbox reaches that
    and nothing else, at its own `model_url` (`http://127.0.0.1:PORT[/path]` inside, also
    in the `ATROPOS_MODEL_URL` variable of every exec).

    `profile` is what kind of place the sandbox is: "locked" (the default) for untrusted
    snippets (docker: a read-only root, the work dir an empty tmpfs, every capability
    dropped), "task" for an image that is a task's machine (docker: a writable root, the
    image's own work dir, Docker's default capabilities; limits and network unchanged).
    bubblewrap and process have only "locked" and refuse "task" (`SandboxError`, unsupported).

    `mounts` binds host folders or files read-only into the sandbox: `{inside path: host
    path}` (an agent program installed on the host, a venv). Inside paths are absolute and
    neither the work dir, nor under it, nor above it; host paths exist. The process provider
    sees the host's file system, so it takes only mounts whose inside path is the host path.
    """

    image: str | None = None  # docker: a local image
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
    profile: Profile = "locked"
    mounts: Mapping[str, Path] = field(default_factory=dict)  # inside path: host path, read-only

    def __post_init__(self) -> None:
        if self.profile not in ("locked", "task"):
            raise ValueError(f"profile must be 'locked' or 'task', not {self.profile!r}")
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
        object.__setattr__(self, "mounts", checked_mounts(self.mounts, self.workdir))
        for name in ("memory_bytes", "pids", "disk_bytes", "cpu_seconds", "output_bytes"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, not {value}")


def checked_mounts(mounts: Mapping[str, Path | str], workdir: str) -> dict[str, Path]:
    """`mounts` with normalized inside paths and absolute host paths; a `ValueError` naming
    the fix for a relative inside path, one that is, holds or lies under the work dir, or a
    host path that does not exist.

    >>> checked_mounts({"/opt/agent/": "/usr"}, "/work")
    {'/opt/agent': PosixPath('/usr')}
    """
    work = posixpath.normpath(workdir)
    checked: dict[str, Path] = {}
    for inside, host in mounts.items():
        if not isinstance(inside, str) or not inside.startswith("/"):
            raise ValueError(f"mounts: inside path {inside!r} must be absolute, e.g. '/opt/agent'")
        where = posixpath.normpath(inside)
        if where == "/" or where == work or f"{work}/".startswith(f"{where}/"):
            raise ValueError(
                f"mounts: inside path {inside!r} would hide the work dir {workdir!r}; mount "
                "beside it, e.g. '/opt/agent'"
            )
        if where.startswith(f"{work}/"):
            raise ValueError(
                f"mounts: inside path {inside!r} is under the work dir {workdir!r}, which is "
                "the sandbox's own; mount beside it (e.g. '/opt/agent') or put() the files"
            )
        source = Path(host).absolute()
        if not source.exists():
            raise ValueError(f"mounts: host path {str(host)!r} (for {inside!r}) does not exist")
        checked[where] = source
    return checked


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
    # the command's status; killed by signal n: -n on every provider (bubblewrap and docker
    # report 128+n, which is returned as -n: a command's own `exit 137` also reads -9);
    # -9 with timed_out after a deadline, whatever the provider
    exit_code: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    truncated: bool = False  # a stream went past spec.output_bytes; the rest was dropped

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def signal_status(code: int) -> int:
    """An exit status as `ExecResult` gives it: a shell-style 128+n (a signalled command, as
    bwrap and the Docker engine report it) is -n; anything else is itself.

    >>> signal_status(137), signal_status(1), signal_status(-9)
    (-9, 1, -9)
    """
    return 128 - code if 128 < code <= 128 + 64 else code


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


class ClosesOnExit:
    """`async with` for a provider's sandbox: entering gives the sandbox, leaving closes it
    (one definition for every provider; the class implements `close()`)."""

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

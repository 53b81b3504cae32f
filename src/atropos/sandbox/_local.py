"""The base of the providers that run on this machine (bubblewrap, process): one folder and
one dedicated uid per sandbox (root only), every exec a new process tree under that uid with
the spec's limits, files in and out as tar run as that uid, and a close that kills every
process of the uid and removes the folder.

`network="model-only"` (root only) adds a network namespace per sandbox, made at start and
held for its life, with a relay to the spec's `model_url` in it (atropos.sandbox.relay):
every exec joins it; the relay runs as the sandbox's uid, so close and sweep end it too."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from atropos.sandbox import _host
from atropos.sandbox.relay import Relay
from atropos.sandbox.spec import (
    ClosesOnExit,
    ExecResult,
    SandboxError,
    SandboxSpec,
    inside_url,
    model_target,
    signal_status,
)

_ids = itertools.count()
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}


class LocalSandbox(ClosesOnExit):
    """A sandbox of a local provider; `start()` makes it, `close()` undoes everything."""

    provider = "local"

    def __init__(self, spec: SandboxSpec) -> None:
        if spec.network == "model-only" and not _host.IS_ROOT:
            raise SandboxError(
                "unsupported",
                f"network='model-only' needs root for {self.provider} (a network namespace "
                "per sandbox, its relay run as the sandbox's own uid); run as root or use "
                "network='none'",
            )
        if spec.profile != "locked":
            raise SandboxError(
                "unsupported",
                f"{self.provider} has no profile {spec.profile!r} (a writable root and an "
                "image's own work dir need an image: the docker provider's); use "
                "profile='locked' or provider='docker'",
            )
        if spec.cpus is not None:
            raise SandboxError(
                "unsupported",
                f"{self.provider} cannot cap cores (cpus={spec.cpus}; it needs cgroups, the "
                "docker provider's); cap CPU time with cpu_seconds",
            )
        self.spec = spec
        self.root = _host.run_root()
        self.owner = _host.owner_label()
        self.folder = self.root / self.owner / f"{self.provider}-{next(_ids)}"
        self.work = self.folder / "work"
        self.uid: int | None = None
        self.relay: Relay | None = None
        self.started = 0.0
        self.closed = False

    @property
    def model_url(self) -> str | None:
        """The rollout proxy's URL inside the sandbox (model-only; None otherwise):
        `http://127.0.0.1:<the host URL's port><its path>`."""
        return None if self.spec.model_url is None else inside_url(self.spec.model_url)

    async def start(self, timeout: float = 30.0) -> LocalSandbox:
        try:
            await asyncio.wait_for(asyncio.to_thread(self._make, timeout), timeout)
            if self.spec.files:
                for path, data in self.spec.files.items():
                    await self.put(path, data)
            await self._probe(timeout)
        except BaseException as error:
            await self.close()
            if isinstance(error, asyncio.TimeoutError):
                raise SandboxError("start_timeout", f"not started in {timeout} s") from error
            if isinstance(error, (OSError, ValueError)):
                raise SandboxError("start_failed", str(error)) from error
            raise
        self.started = time.monotonic()
        return self

    def _make(self, timeout: float) -> None:
        _host.sweep_once(self.root)
        _host.make_dir(self.root)
        _host.make_dir(self.root / self.owner)
        _host.make_dir(self.folder, 0o711)
        self.uid = _host.reserve_uid(self.root, self.owner)
        (self.folder / "uid").write_text("" if self.uid is None else str(self.uid))
        self.work.mkdir(mode=0o700)
        if self.uid is not None:
            os.chown(self.work, self.uid, self.uid)
        if self.spec.model_url is not None:
            assert self.uid is not None  # model-only is refused unless root
            host, port, _ = model_target(self.spec.model_url)
            self.relay = Relay((host, port), port, self.uid, timeout, owner=self.owner)
            if self.closed:  # start timed out and close() ran while the relay started
                self.relay.close()

    async def _probe(self, timeout: float) -> None:
        result = await self.exec(["true"], timeout=timeout)
        if not result.ok:
            raise SandboxError("start_failed", result.stderr.decode(errors="replace")[-2000:])

    def limits(self) -> list[str]:
        """The `prlimit` prefix for the spec's limits (no core files ever)."""
        spec, flags = self.spec, ["--core=0"]
        if spec.memory_bytes is not None:
            flags.append(f"--as={spec.memory_bytes}")
        if spec.pids is not None and self.uid is not None:
            flags.append(f"--nproc={spec.pids + self.own_tasks}")
        if spec.disk_bytes is not None:
            flags.append(f"--fsize={spec.disk_bytes}")
        if spec.cpu_seconds is not None:
            flags.append(f"--cpu={spec.cpu_seconds}")
        return ["prlimit", *flags, "--"]

    extra_tasks = 0  # tasks of the provider's own counted against RLIMIT_NPROC
    shell_status = False  # the provider reports a signalled command as 128+n (made -n)

    @property
    def own_tasks(self) -> int:
        """Tasks of the sandbox's uid that are not its code's: the provider's per exec, and
        the relay's two threads (model-only)."""
        return self.extra_tasks + (2 if self.spec.model_url is not None else 0)

    def environment(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        model = {"ATROPOS_MODEL_URL": self.model_url} if self.model_url is not None else {}
        return {**BASE_ENV, "HOME": self.spec.workdir, **model, **self.spec.env, **(extra or {})}

    def network(self) -> list[str]:
        """The argv prefix that puts an exec in the sandbox's network: its model-only
        namespace (joined), or a new empty one (`unshare --net`, no interface up)."""
        if self.relay is not None:
            return ["nsenter", f"--net={self.relay.ns_path}", "--"]
        if _host.IS_ROOT:
            return ["unshare", "--net", "--"]
        return ["unshare", "--map-current-user", "--net", "--"]

    def command(self, argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        """The host argv and environment that run `argv` in the sandbox."""
        raise NotImplementedError

    async def exec(
        self,
        command: Sequence[str] | str,
        timeout: float,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        self._check_usable()
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        host_argv, host_env = self.command(argv, self.environment(env))
        code, out, err, timed_out, truncated = await _host.collect(
            host_argv, timeout, stdin, self.spec.output_bytes, host_env, str(self.work)
        )
        if self.closed:
            raise SandboxError("closed", f"the sandbox closed while running {argv[:1]}")
        if self.shell_status:
            code = signal_status(code)
        return ExecResult(code, out, err, timed_out, truncated)

    def _check_usable(self) -> None:
        if self.closed:
            raise SandboxError("closed", "the sandbox is closed")
        ttl = self.spec.ttl_seconds
        if ttl is not None and self.started and time.monotonic() - self.started > ttl:
            raise SandboxError("expired", f"the sandbox outlived its time to live ({ttl} s)")
        if not self.work.is_dir():
            raise SandboxError("dead", f"the sandbox's work dir {self.work} is gone")

    async def put(self, path: str, data: bytes | Path) -> None:
        """Write a file (bytes or a local file) or a local folder at `path` in the work dir."""
        self._check_usable()
        name = _host.inside(self.spec.workdir, path)
        archive = _host.tar_of(name, data)
        argv = [*_host.as_uid(self.uid), "tar", "-C", str(self.work), "-xf", "-"]
        code, _, err, _, _ = await _host.collect(argv, 60, archive, 4096)
        if code != 0:
            raise OSError(f"put {path!r}: {err.decode(errors='replace').strip()}")

    async def get(self, path: str) -> bytes:
        """A file's bytes, or a folder as a tar (names relative to the work dir)."""
        self._check_usable()
        name = _host.inside(self.spec.workdir, path)
        argv = [*_host.as_uid(self.uid), "tar", "-C", str(self.work), "-cf", "-", name]
        code, out, err, _, truncated = await _host.collect(argv, 60, None, 1 << 31)
        if code != 0:
            raise FileNotFoundError(f"get {path!r}: {err.decode(errors='replace').strip()}")
        return _host.single_file(out, name) if name != "." else out

    async def close(self) -> None:
        """Kill every process of the sandbox and remove its folder and uid (idempotent; runs
        to the end even when the caller is cancelled)."""
        if self.closed:
            return
        self.closed = True
        await asyncio.shield(asyncio.to_thread(self._release))

    def _release(self) -> None:
        if self.relay is not None:
            self.relay.close()
        _host.release(self.root, self.uid, self.folder)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.folder.name} uid={self.uid} {self.work}>"

"""The base of the providers that run on this machine (bubblewrap, process): one folder and
one dedicated uid per sandbox (root only), every exec a new process tree under that uid with
the spec's limits, files in and out as tar run as that uid, and a close that kills every
process of the uid and removes the folder."""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from atropos.sandbox import _host
from atropos.sandbox.spec import ExecResult, SandboxError, SandboxSpec

_ids = itertools.count()
BASE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": "/tmp"}


class LocalSandbox:
    """A sandbox of a local provider; `start()` makes it, `close()` undoes everything."""

    provider = "local"

    def __init__(self, spec: SandboxSpec) -> None:
        if spec.network != "none":
            raise SandboxError(
                "unsupported",
                f"network={spec.network!r} is not available yet (only 'none'); the model-only "
                "policy comes with the sandbox network work",
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
        self.started = 0.0
        self.closed = False

    async def start(self, timeout: float = 30.0) -> LocalSandbox:
        try:
            await asyncio.wait_for(asyncio.to_thread(self._make), timeout)
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

    def _make(self) -> None:
        _host.sweep_once(self.root)
        _host.make_dir(self.root)
        _host.make_dir(self.root / self.owner)
        _host.make_dir(self.folder, 0o711)
        self.uid = _host.reserve_uid(self.root, self.owner)
        (self.folder / "uid").write_text("" if self.uid is None else str(self.uid))
        self.work.mkdir(mode=0o700)
        if self.uid is not None:
            os.chown(self.work, self.uid, self.uid)

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
            flags.append(f"--nproc={spec.pids + self.extra_tasks}")
        if spec.disk_bytes is not None:
            flags.append(f"--fsize={spec.disk_bytes}")
        if spec.cpu_seconds is not None:
            flags.append(f"--cpu={spec.cpu_seconds}")
        return ["prlimit", *flags, "--"]

    extra_tasks = 0  # tasks of the provider's own counted against RLIMIT_NPROC

    def environment(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        return {**BASE_ENV, "HOME": self.spec.workdir, **self.spec.env, **(extra or {})}

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
        await asyncio.shield(asyncio.to_thread(_host.release, self.root, self.uid, self.folder))

    async def __aenter__(self) -> LocalSandbox:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.folder.name} uid={self.uid} {self.work}>"

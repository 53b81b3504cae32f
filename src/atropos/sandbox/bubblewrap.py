"""The `bubblewrap` provider: every exec is one `bwrap` process tree in fresh namespaces
(user, PID, network, IPC, UTS, cgroup), over a read-only root (the host's `/usr`, `/bin`,
`/lib*`, `/sbin`, `/etc`, or `spec.root`), a private `/proc`, a minimal `/dev`, a tmpfs `/tmp`
and the sandbox's work dir (persistent across execs, the only writable place that is).
`spec.mounts` are `--ro-bind`s after the root: a mount point inside a read-only folder
(`spec.root`, the host's `/etc` or `/usr`) must exist there, as the work dir's must (bwrap
cannot make one); elsewhere (`/opt/...`) bwrap makes it. bwrap runs as the sandbox's uid, so
the host path must be readable by it (world-readable, its parents traversable).

A signalled command is reported by bwrap as 128+n; it is returned as -n, as on docker
(`spec.signal_status`: a command's own `exit 130` also reads -2). bwrap 0.8 (Debian
bookworm) has no overlay mounts, so there is no writable root over `spec.root`: the "task"
profile is refused (unsupported).

Why one bwrap per exec rather than one long-lived bwrap running an init that takes commands
over a pipe: bwrap starts in a few milliseconds, every exec then gets a fresh PID namespace
whose end (the command's exit, a timeout, our death: `--die-with-parent`) kills everything it
started, and no in-sandbox agent exists for the code to tamper with. What persists between
execs is the work dir, not `/tmp` nor background processes.

With `network="model-only"`, bwrap runs under `nsenter --net=` into the sandbox's own
network namespace (made at start, the model relay listening on its `lo`) and keeps it
(`--share-net`); every other namespace is still new per exec.

As root, bwrap runs as the sandbox's own uid (`setpriv`), so RLIMIT_NPROC (`spec.pids`) counts
only that sandbox's tasks and a `kill -1` as that uid ends them all at close.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from atropos.sandbox import _host
from atropos.sandbox._local import LocalSandbox
from atropos.sandbox.spec import SandboxError, SandboxSpec

SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")


class BubblewrapSandbox(LocalSandbox):
    provider = "bubblewrap"
    extra_tasks = 2  # bwrap itself and the PID namespace's init
    shell_status = True  # bwrap's init reports a signalled command as 128+n

    def __init__(self, spec: SandboxSpec) -> None:
        if shutil.which("bwrap") is None:
            raise SandboxError(
                "unavailable",
                "bwrap is not installed: apt-get install -y bubblewrap (make bubblewrap)",
            )
        if spec.image is not None:
            raise SandboxError(
                "unsupported", "bubblewrap takes spec.root (a directory), not an image"
            )
        super().__init__(spec)

    def command(self, argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        spec = self.spec
        args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session"]
        if self.relay is not None:
            args.append("--share-net")  # the sandbox's model-only namespace, joined below
        args += self._root()
        args += ["--proc", "/proc", "--dev", "/dev"]
        if spec.disk_bytes is not None:
            args += ["--size", str(spec.disk_bytes)]
        args += ["--tmpfs", "/tmp", "--bind", str(self.work), spec.workdir, "--chdir", spec.workdir]
        for inside, host in spec.mounts.items():
            args += ["--ro-bind", str(host), inside]
        if spec.user is not None:
            args += ["--uid", spec.user, "--gid", spec.user]
        join = self.network() if self.relay is not None else []
        return [*join, *self.limits(), *_host.as_uid(self.uid), *args, "--", *argv], env

    def _root(self) -> list[str]:
        if self.spec.root is not None:
            return ["--ro-bind", str(self.spec.root), "/"]
        binds: list[str] = []
        for path in SYSTEM:
            host = Path(path)
            if host.is_symlink():
                binds += ["--symlink", str(host.readlink()), path]
            elif host.exists():
                binds += ["--ro-bind", path, path]
        return binds

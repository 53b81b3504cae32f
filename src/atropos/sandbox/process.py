"""The `process` provider: every exec is a plain process tree on the host, in a new network
namespace (no interface up), as the sandbox's own uid (root only) with the spec's rlimits,
in the sandbox's work dir (a host folder, mode 0700, owned by that uid). With
`network="model-only"` that namespace is the sandbox's own, joined by every exec, with the
model relay's listener on its `lo` (atropos.sandbox.relay).

It isolates less than bubblewrap: the whole host file system stays visible to the uid's
permissions (world-readable files, world-writable `/tmp` and `/dev/shm`, socket files the uid
may open), and a process that left its exec's process group (`setsid`) lives on until
`close()` (the rest of the group is killed when the exec ends). What it does hold: no
network (or only the model), no writes where that uid may not write (the system, the
caller's files, other sandboxes), no reading other sandboxes' work dirs, `spec.pids` tasks,
`memory_bytes` of address space per process, and every process gone at close or with its
owner (sweep). Not root, there is no dedicated uid: then only the network, the limits and
the session hold (and model-only is refused).

`spec.mounts` are taken only where the inside path is the host path: the file is there
already, and it is read-only only as far as the uid's permissions go (as root, a dedicated
uid cannot write a root-owned 0644 file; not root, the sandbox runs as us and can).
"""

from __future__ import annotations

from collections.abc import Mapping

from atropos.sandbox import _host
from atropos.sandbox._local import LocalSandbox
from atropos.sandbox.spec import SandboxError, SandboxSpec


class ProcessSandbox(LocalSandbox):
    provider = "process"

    def __init__(self, spec: SandboxSpec) -> None:
        for inside, host in spec.mounts.items():
            if inside not in (str(host), str(host.resolve())):
                raise SandboxError(
                    "unsupported",
                    f"process sees the host's file system and mounts nothing: mount "
                    f"{inside!r} from {str(host)!r} needs the same path on both sides "
                    f"(mounts={{{str(host)!r}: ...}}) or provider='bubblewrap'",
                )
        super().__init__(spec)

    def environment(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        return {**super().environment(extra), "HOME": str(self.work)}

    def command(self, argv: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        return [*self.network(), *self.limits(), *_host.as_uid(self.uid), *argv], env

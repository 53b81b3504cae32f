"""Linux /proc readers for tests that start process trees: which processes live (zombies do not
count), their descendants, what is in their environment, and which TCP ports they listen on.

A process that retitles itself (setproctitle, as Ray's workers and agents do) may overwrite the
memory /proc/<pid>/environ shows, so `environ_has` can miss it; `descendants` finds it by its
parent instead, as long as the parent lives.

>>> me = next(p for p in live_processes() if p.pid == os.getpid())
>>> me.pgid == os.getpgid(0)
True
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from atropos.names import is_loopback

__all__ = [
    "Listener",
    "Process",
    "descendants",
    "environ_has",
    "group_alive",
    "listeners",
    "live_processes",
]

_LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp{,6}


@dataclass(frozen=True)
class Process:
    """A live process: its pid, parent, process group, start time (clock ticks after boot;
    with the pid, it tells a process from a later one that reuses the pid) and command line
    (arguments joined by spaces)."""

    pid: int
    ppid: int
    pgid: int
    start: int
    cmdline: str


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket: the process holding it, and the address it is bound to."""

    pid: int
    host: str  # "127.0.0.1", "0.0.0.0", "::", ...; an IPv4-mapped IPv6 address as plain IPv4
    port: int

    @property
    def loopback(self) -> bool:
        """Whether only this machine can connect (127.0.0.0/8 or ::1)."""
        return is_loopback(self.host)


def _stat(pid: str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state, ppid, pgrp, ...), None
    once the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces


def _pids() -> list[str]:
    return [entry for entry in os.listdir("/proc") if entry.isdigit()]


def live_processes() -> list[Process]:
    """Every process on the machine except zombies (dead, waiting for a parent to reap them)."""
    out = []
    for pid in _pids():
        stat = _stat(pid)
        if stat is None or stat[0] in "ZX":
            continue
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        out.append(Process(int(pid), int(stat[1]), int(stat[2]), int(stat[19]), cmdline))
    return out


def descendants(roots: set[int], processes: list[Process]) -> list[Process]:
    """The processes among `processes` whose pid is in `roots` or whose parent chain reaches one."""
    children: dict[int, list[Process]] = {}
    for process in processes:
        children.setdefault(process.ppid, []).append(process)
    found = [p for p in processes if p.pid in roots]
    for process in found:  # grows while it is walked: breadth first
        found.extend(children.get(process.pid, []))
    return found


def group_alive(pgid: int) -> bool:
    """Whether a process group still has a member that is not a zombie."""
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None and int(stat[2]) == pgid and stat[0] not in "ZX":
            return True
    return False


def environ_has(pid: int, key: str, value: str) -> bool:
    """Whether a process started with `key=value` in its environment (False if unreadable)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{key}={value}".encode() in environ.split(b"\0")


def _address(hex_address: str) -> tuple[str, int]:
    host_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(host_hex)
    # the kernel prints each 32-bit word in host (little-endian) order
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    host = ipaddress.ip_address(words)
    if isinstance(host, ipaddress.IPv6Address) and host.ipv4_mapped is not None:
        host = host.ipv4_mapped
    return str(host), int(port_hex, 16)


def listeners(pids: set[int] | None = None) -> list[Listener]:
    """Listening TCP sockets (IPv4 and IPv6) held by `pids` (every process when None)."""
    bound: dict[str, tuple[str, int]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == _LISTEN:
                bound[fields[9]] = _address(fields[1])
    out = []
    for pid in pids if pids is not None else map(int, _pids()):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            inode = target[len("socket:[") : -1] if target.startswith("socket:[") else ""
            if inode in bound:
                out.append(Listener(pid, *bound[inode]))
    return sorted(set(out), key=lambda x: (x.pid, x.port))


def stop_group(process: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM the process group `process` leads (started with `start_new_session`), SIGKILL
    it if any member is alive after `grace` seconds; the leader is reaped."""
    pgid = process.pid  # start_new_session: the leader's pid is the group's id
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        end = time.monotonic() + grace
        while time.monotonic() < end:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.05)  # reaps the leader; other members are not ours
            if process.returncode is not None and not group_alive(pgid):
                return


def kill_strays(
    before: list[Process], current: list[Process], grace: float
) -> tuple[list[Process], list[Process]]:
    """SIGKILL, by pid, the processes of `before` still alive and those of `current` (found
    now) that are new; (the strays killed, those still alive after `grace` seconds)."""
    known = {(p.pid, p.start) for p in before}
    found = [p for p in live_processes() if (p.pid, p.start) in known]
    found += [p for p in current if (p.pid, p.start) not in known]
    for process in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    left = {(p.pid, p.start) for p in found}
    end = time.monotonic() + grace
    while left and time.monotonic() < end:
        left &= {(p.pid, p.start) for p in live_processes()}
        time.sleep(0.05)
    return found, [p for p in found if (p.pid, p.start) in left]

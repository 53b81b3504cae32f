"""The model-only network of a local sandbox: a network namespace of its own, with only `lo`
up, and a relay process that listens on 127.0.0.1:PORT inside it and forwards every
connection, bytes unchanged, to the one target (the rollout proxy) in the host's network.

How (stdlib only: this file is also the relay program, run as `python -I -S relay.py`):

- The owner (root) starts the relay. A thread of the relay calls `unshare(CLONE_NEWNET)`
  (namespaces are per thread), brings `lo` up and binds the listener there, then stays in
  that namespace; the main thread stays in the host's. A socket keeps the namespace it was
  made in: connections accepted on the listener are inside, sockets the main thread makes
  to dial the target are outside. No routes, no other interface: nothing else is reachable.
- The relay then drops to the sandbox's uid (no groups, not dumpable: the sandbox's code may
  kill it, which only cuts its own model access, but cannot ptrace it into dialling anywhere
  else) and prints `ready <tid>`. The owner opens that thread's `/proc/.../ns/net` and holds
  it: every exec joins it (`nsenter --net=/proc/<owner>/fd/<n>`), and a pid reused later can
  never redirect an exec into another namespace.
- It ends with the sandbox: it runs as the sandbox's uid, so `close()` and `sweep()` (which
  kill every process of that uid) end it; its stdin is a pipe only the owner holds, and its
  end (the owner's death, SIGKILL included) ends the relay at once. Its argv names its
  owner's label, and `sweep()` kills the relays of dead owners too (`_host.sweep_relays`: a
  child the owner forked may still hold that pipe; a docker relay runs as `nobody`, not as
  a uid the sweep kills).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
PR_SET_DUMPABLE = 4
CHUNK = 65_536


class Relay:
    """The owner's handle on one relay: `ns_path` is what execs join, `close()` ends it."""

    def __init__(
        self,
        target: tuple[str, int],
        port: int,
        uid: int,
        timeout: float,
        join: str | None = None,
        owner: str = "",
    ) -> None:
        """Start a relay to `target` listening on 127.0.0.1:`port` in a new network namespace,
        or in the one at `join` (a container's `/proc/<pid>/ns/net`), running as `uid`;
        `owner` (the owner's label, in its argv) lets `sweep()` find it once the owner died."""
        host, target_port = target
        argv = [sys.executable, "-I", "-S", __file__, host, str(target_port), str(port), str(uid)]
        argv += [owner or "-"] + ([join] if join is not None else [])
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        self.nsfd = -1
        try:
            tid = self._ready(timeout)
            self.nsfd = os.open(f"/proc/{self.proc.pid}/task/{tid}/ns/net", os.O_RDONLY)
        except BaseException:
            self.close()
            raise

    def _ready(self, timeout: float) -> int:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        if not line.startswith(b"ready "):
            if not ready:
                raise TimeoutError(f"the model relay was not ready in {timeout} s")
            self.proc.kill()
            err = self.proc.stderr.read().decode(errors="replace").strip()[-2000:]
            raise OSError(f"the model relay did not start: {err or 'no output'}")
        return int(line.split()[1])

    @property
    def ns_path(self) -> str:
        """The sandbox's network namespace, as a path any of our child processes can open."""
        return f"/proc/{os.getpid()}/fd/{self.nsfd}"

    def close(self) -> None:
        """End the relay (idempotent). The uid's `kill -1` at close gets it too."""
        if self.nsfd >= 0:
            os.close(self.nsfd)
            self.nsfd = -1
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


# ---- the relay program ---------------------------------------------------------------------


def _libc_call(name: str, *args: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}: {os.strerror(errno)}")


def _inside_listener(
    port: int, join: str | None, made: list[socket.socket | BaseException]
) -> None:
    """In a thread: a new network namespace (or the one at `join`), `lo` up, a listener on
    127.0.0.1:port; then stay there, so the owner can open this thread's namespace."""
    try:
        if join is None:
            _libc_call("unshare", CLONE_NEWNET)
        else:
            fd = os.open(join, os.O_RDONLY)
            try:
                _libc_call("setns", fd, CLONE_NEWNET)
            finally:
                os.close(fd)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            request = struct.pack("16sH22x", b"lo", 0)
            flags = struct.unpack("16sH22x", fcntl.ioctl(s, SIOCGIFFLAGS, request))[1]
            fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))
        listener = socket.create_server(("127.0.0.1", port), backlog=128)
        made.append(listener)
    except BaseException as error:
        made.append(error)
    while True:
        time.sleep(3600)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, each piece as it comes (streamed responses stay streamed)."""
    with contextlib.suppress(OSError):
        while chunk := await reader.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


async def _dial(
    targets: list[tuple[str, int]],
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the first of the target's addresses that answers (numeric addresses,
    resolved once at start; the socket is the main thread's: the host's network)."""
    error: OSError = OSError("no address")
    for host, port in targets:
        try:
            return await asyncio.open_connection(host, port)
        except OSError as failed:
            error = failed
    raise error


async def _serve(listener: socket.socket, targets: list[tuple[str, int]]) -> None:
    async def forward(inner_r: asyncio.StreamReader, inner_w: asyncio.StreamWriter) -> None:
        try:
            outer_r, outer_w = await _dial(targets)
        except OSError:
            inner_w.close()
            return
        try:
            await asyncio.gather(_pipe(inner_r, outer_w), _pipe(outer_r, inner_w))
        finally:
            inner_w.close()
            outer_w.close()

    loop = asyncio.get_running_loop()
    server = await asyncio.start_server(forward, sock=listener)
    owner_gone = asyncio.Event()
    loop.add_reader(0, owner_gone.set)  # stdin: readable (EOF) once the owner is gone
    async with server:
        await owner_gone.wait()


def main(argv: list[str]) -> None:
    host, target_port, port, uid = argv[0], int(argv[1]), int(argv[2]), int(argv[3])
    join = argv[5] if len(argv) > 5 else None  # argv[4]: the owner's label, for sweep()
    found = socket.getaddrinfo(host, target_port, type=socket.SOCK_STREAM)
    targets = [(str(info[4][0]), int(info[4][1])) for info in found]
    made: list[socket.socket | BaseException] = []
    thread = threading.Thread(target=_inside_listener, args=(port, join, made), daemon=True)
    thread.start()
    while not made:
        time.sleep(0.001)
    if isinstance(made[0], BaseException):
        raise made[0]
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)  # every thread (glibc applies it to all)
    _libc_call("prctl", PR_SET_DUMPABLE, 0, 0, 0, 0)
    sys.stdout.write(f"ready {thread.native_id}\n")
    sys.stdout.flush()
    asyncio.run(_serve(made[0], targets))


if __name__ == "__main__":
    main(sys.argv[1:])
    os._exit(0)  # the namespace thread never returns

"""What the local providers (bubblewrap, process) share: the run root and its labels, a
dedicated uid per sandbox, the sweep of dead owners' leftovers, running one command with a
deadline and bounded output, and files in and out as tar (read and written as the sandbox's
uid, so a symlink the sandbox planted never reaches the host's files).

Layout of the run root (`$ATROPOS_SANDBOX_ROOT`, default `/tmp/atropos-sandboxes`):
`owner-<pid>-<start time>/<sandbox id>/work` (the work dir, owned by the sandbox's uid, 0700)
and `uids/<uid>` (the uid's reservation, naming its owner). The owner's pid and start time
are the label: `sweep()` kills every process of a dead owner's uids and removes its folders.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path

from atropos.sandbox import relay

UID_BASE = 2_000_000  # far above any uid a distribution hands out
UID_SLOTS = 65_536
IS_ROOT = os.geteuid() == 0
_swept: set[Path] = set()


def run_root() -> Path:
    return Path(os.environ.get("ATROPOS_SANDBOX_ROOT", "/tmp/atropos-sandboxes"))


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (None when it is gone): with the
    pid, it names one process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return stat.rsplit(b")", 1)[-1].split()[19].decode()


def owner_label(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"owner-{pid}-{start_time(pid)}"


def owner_alive(label: str) -> bool:
    parts = label.split("-")
    if len(parts) != 3 or not parts[1].isdigit():
        return False
    return start_time(int(parts[1])) == parts[2]


def make_dir(path: Path, mode: int = 0o711) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(mode)
    return path


def reserve_uid(root: Path, owner: str) -> int | None:
    """A uid no live sandbox uses, reserved for one sandbox (None when not root: then the
    sandbox runs as us)."""
    if not IS_ROOT:
        return None
    uids = make_dir(root / "uids", 0o700)
    start = (os.getpid() * 7919 + time.monotonic_ns()) % UID_SLOTS
    for step in range(UID_SLOTS):
        uid = UID_BASE + (start + step) % UID_SLOTS
        try:
            fd = os.open(uids / str(uid), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            continue
        os.write(fd, owner.encode())
        os.close(fd)
        return uid
    raise RuntimeError(f"no free sandbox uid under {uids}")


def as_uid(uid: int | None) -> list[str]:
    """The argv prefix that runs a command as `uid` (no groups, no new privileges)."""
    if uid is None:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs"]


def tasks_of(uid: int) -> list[int]:
    """The live processes of `uid` (zombies are dead: an init that does not reap keeps them)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if os.stat(f"/proc/{name}").st_uid != uid:
                    continue
                stat = Path(f"/proc/{name}/stat").read_bytes()
                if stat.rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                    found.append(int(name))
    return found


def kill_uid(uid: int, wait: float = 5.0) -> bool:
    """SIGKILL every process of `uid` (a `kill -1` run as that uid reaches exactly them, in
    any namespace it made) and wait until none is left. Returns whether none is."""
    deadline = time.monotonic() + wait
    while True:
        if not tasks_of(uid):
            return True
        if time.monotonic() > deadline:
            return False
        # subprocess, not os.spawn*: a Python-level fork in a threaded process can deadlock
        argv = [*as_uid(uid), "kill", "-KILL", "-1"]
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        time.sleep(0.005)


def release(root: Path, uid: int | None, folder: Path) -> None:
    """Kill the sandbox's processes, remove its folder, then free its uid."""
    if uid is not None:
        kill_uid(uid)
    shutil.rmtree(folder, ignore_errors=True)
    if uid is not None:
        with contextlib.suppress(FileNotFoundError):
            (root / "uids" / str(uid)).unlink()


def sweep(root: Path | None = None) -> int:
    """Remove what sandboxes of dead owners left (their processes, folders, uids); returns
    how many sandboxes that was. Runs once per root and process on the first sandbox, and
    whenever called."""
    root = run_root() if root is None else root
    removed = 0
    for owner in sorted(root.glob("owner-*")):
        if not owner_alive(owner.name):
            for box in owner.iterdir():
                removed += 1
                uid_file = box / "uid"
                uid = int(uid_file.read_text()) if uid_file.exists() else None
                if uid is not None:
                    kill_uid(uid)
            shutil.rmtree(owner, ignore_errors=True)
    for reservation in sorted((root / "uids").glob("*")) if (root / "uids").exists() else []:
        if not owner_alive(reservation.read_text()):
            kill_uid(int(reservation.name))
            reservation.unlink(missing_ok=True)
    sweep_relays()
    _swept.add(root)
    return removed


def sweep_relays() -> int:
    """SIGKILL the model relays (atropos.sandbox.relay) whose owner is dead, found by their
    argv (`python -I -S relay.py HOST PORT PORT UID OWNER [JOIN]`); returns how many."""
    program, killed = os.fsencode(relay.__file__), 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            args = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(args) > 8 and args[3] == program and args[8] != b"-":
            if not owner_alive(args[8].decode(errors="replace")):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(name), signal.SIGKILL)
                    killed += 1
    return killed


def sweep_once(root: Path) -> None:
    if root not in _swept:
        sweep(root)


async def collect(
    argv: Sequence[str],
    timeout: float,
    stdin: bytes | None,
    cap: int,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    pass_fds: Sequence[int] = (),
) -> tuple[int, bytes, bytes, bool, bool]:
    """Run `argv` in a new session; keep at most `cap` bytes of each stream; SIGKILL its
    process group at the deadline or on cancellation. Returns (exit code, stdout, stderr,
    timed out, truncated)."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
        env=env,
        cwd=cwd,
        pass_fds=tuple(pass_fds),
    )
    assert proc.stdout is not None and proc.stderr is not None
    cut = [False]
    kept = (bytearray(), bytearray())  # filled as read: what a cancelled reader read stays
    readers = [
        asyncio.ensure_future(_read(stream, cap, cut, into))
        for stream, into in zip((proc.stdout, proc.stderr), kept, strict=True)
    ]
    # stdin is fed beside the wait, so a command that never reads it cannot hold the exec
    # past its deadline (a full pipe would block drain() forever)
    feeder = asyncio.ensure_future(_feed(proc.stdin, stdin)) if stdin is not None else None
    timed_out = False
    try:
        timed_out = not await _exited(proc, timeout)
        # the exec's group ends with it; one that left the group (setsid) may hold the pipes
        # until close: wait for them briefly, not forever (what they sent so far is kept)
        _kill_group(proc.pid)
        await asyncio.wait(readers, timeout=0.5)
    finally:
        _kill_group(proc.pid)
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.shield(proc.wait())
        for task in (*readers, feeder):
            if task is not None:
                task.cancel()
    code = -signal.SIGKILL if timed_out or proc.returncode is None else proc.returncode
    return code, bytes(kept[0]), bytes(kept[1]), timed_out, cut[0]


async def _feed(pipe: asyncio.StreamWriter | None, data: bytes) -> None:
    assert pipe is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        pipe.write(data)
        await pipe.drain()
        pipe.close()


async def _exited(proc: asyncio.subprocess.Process, timeout: float) -> bool:
    """Whether `proc` exited within `timeout` (SIGKILLed otherwise). Polled: asyncio's
    `wait()` also waits for the pipes, which a background descendant may hold."""
    deadline, pause = time.monotonic() + timeout, 0.0005
    while proc.returncode is None:
        if time.monotonic() >= deadline:
            _kill_group(proc.pid)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            while proc.returncode is None:
                await asyncio.sleep(0.005)
            return False
        await asyncio.sleep(pause)
        pause = min(pause * 2, 0.01)
    return True


async def _read(stream: asyncio.StreamReader, cap: int, cut: list[bool], kept: bytearray) -> None:
    while chunk := await stream.read(65_536):
        room = cap - len(kept)
        if len(chunk) > room:
            cut[0] = True
        kept += chunk[: max(room, 0)]


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def inside(workdir_inside: str, path: str) -> str:
    """`path` (absolute under the sandbox's work dir, or relative to it) as a relative path
    with no `..`; anything else is refused: only the work dir is the sandbox's to fill."""
    if path.startswith("/"):
        if path != workdir_inside and not path.startswith(workdir_inside.rstrip("/") + "/"):
            raise ValueError(f"{path!r} is outside the sandbox's work dir {workdir_inside}")
        path = path[len(workdir_inside) :].lstrip("/")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"{path!r} leaves the sandbox's work dir")
    return "/".join(parts) or "."


def tar_of(name: str, data: bytes | Path) -> bytes:
    """One file (bytes, or a local file) or a local folder, as a tar that unpacks to `name`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        if isinstance(data, bytes):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        else:
            tar.add(str(data), arcname=name)
    return buffer.getvalue()


def single_file(archive: bytes, name: str) -> bytes:
    """The bytes of `name` when the tar holds one regular file; the tar itself otherwise."""
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        members = tar.getmembers()
        if len(members) == 1 and members[0].isfile():
            extracted = tar.extractfile(members[0])
            assert extracted is not None
            return extracted.read()
    return archive

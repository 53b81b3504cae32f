"""The sandbox's supervisor: the trusted code inside a sandbox process, around the untrusted code.

`sandbox` (beside it) runs this file as `python -I -S _supervisor.py CONFIG` in a
fresh temporary directory; it is never imported there, and uses the standard library only. It
isolates the network, unshares mount and PID namespaces and lays out the run's private root (a
read-only tmpfs with read-only binds of the system and the Python installation, and the run's
directory writable; failing that, every mount read-only but the run's directory), forks the
child that runs `main.py` (privileges dropped, resource limits set, audit hook installed)
through a first process of the PID namespace that mounts its own /proc and `pivot_root`s into
the private root, enforces the wall-clock limit, and kills every descendant at the end. With
tests, the child is the judge of `_harness.py` (loaded by path before the private root exists,
which does not show this package).
What it does and does not protect against is in `sandbox.py`'s docstring.
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import signal
import sys
import time
from typing import Any

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
CLONE_NEWPID = 0x20000000
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
SETUP_FAILED = 125  # the child's exit code when the sandbox itself could not be set up
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT = 1, 2, 4, 8, 32
MS_NOATIME, MS_NODIRATIME, MS_BIND, MS_REC = 1024, 2048, 4096, 16384
MS_PRIVATE, MS_RELATIME = 1 << 18, 1 << 21
MNT_DETACH = 2
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41}  # syscall numbers (no libc wrapper)
ST_TO_MS = {2: MS_NOSUID, 4: MS_NODEV, 8: MS_NOEXEC, 1024: MS_NOATIME, 2048: MS_NODIRATIME}
ST_TO_MS[4096] = MS_RELATIME  # statvfs's f_flag bits -> mount flags
PRIVATE_ROOT = "read-only private root: the system, Python and the run's directory (writable)"
DEVICES = ("null", "zero", "full", "random", "urandom")
DEVICE_LINKS = {"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0"}
DEVICE_LINKS |= {"stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"}
MOUNT_FLAGS = {  # per-mount options kept when a mount is remounted read-only
    "nosuid": MS_NOSUID,
    "nodev": MS_NODEV,
    "noexec": MS_NOEXEC,
    "noatime": MS_NOATIME,
    "nodiratime": MS_NODIRATIME,
    "relatime": MS_RELATIME,
}

# Imported before privileges are dropped when the dedicated uid cannot read the interpreter's
# files (e.g. a Python under /root, as `preload` says); they cover what solutions import.
PRELOAD = (
    "encodings.idna encodings.latin_1 encodings.unicode_escape"  # codecs str.encode may load
    " abc array base64 binascii bisect calendar cmath collections collections.abc"
    " concurrent.futures contextlib copy csv dataclasses datetime decimal difflib enum fnmatch"
    " fractions functools glob hashlib heapq inspect io itertools json keyword locale math"
    " numbers operator pathlib pprint queue random re select selectors shutil signal socket"
    " statistics string struct subprocess tempfile textwrap threading time traceback types"
    " typing unicodedata warnings weakref zlib"
).split()

PROCESS_EVENTS = frozenset(
    {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system"}
    | {"subprocess.Popen"}
)
# audited filesystem changes -> the positions of their path arguments
PATH_EVENTS = {
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.link": (0, 1),
    "os.mkdir": (0,),
    "os.remove": (0,),
    "os.rename": (0, 1),
    "os.rmdir": (0,),
    "os.symlink": (1,),
    "os.truncate": (0,),
    "os.utime": (0,),
    "shutil.rmtree": (0,),
}
WRITABLE_DEVICES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _errno_text() -> str:
    import ctypes

    return os.strerror(ctypes.get_errno())


def count_tasks(uid: int) -> int:
    """How many tasks (processes and threads) have real uid `uid`: what RLIMIT_NPROC counts."""
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status", "rb") as f:
                fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
            if int(fields[b"Uid"].split()[0]) == uid:
                total += int(fields.get(b"Threads", b"1"))
        except (OSError, KeyError, ValueError):
            continue  # it ended while we looked
    return total


def children() -> list[int]:
    """The pids whose parent is this process (adopted orphans included: we are a subreaper)."""
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(b")", 1)[-1].split()
        if len(fields) > 1 and int(fields[1]) == me:
            found.append(int(name))
    return found


def kernel_at_least(major: int, minor: int) -> bool:
    """Whether the running Linux kernel is at least `major.minor`."""
    found = re.match(r"(\d+)\.(\d+)", os.uname().release)
    if found is None:
        return False
    return (int(found.group(1)), int(found.group(2))) >= (major, minor)


def isolate_network(libc: Any, is_root: bool) -> str:
    """Move this process into a new, empty network namespace if the kernel lets us."""
    if libc.unshare(CLONE_NEWNET) == 0:
        return "namespace"
    ids = os.getuid(), os.getgid()
    if not is_root and libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        map_own_ids(*ids)
        return "user+network namespace"
    return f"audit hook only (no network namespace: {_errno_text()})"


def map_own_ids(uid: int, gid: int) -> None:
    """In a new user namespace: our `uid` and `gid` (read before it) map to themselves, so files
    we create in the private root's tmpfs (which belongs to this namespace) have an owner;
    unmapped, creating one fails with EOVERFLOW. Best effort: without it, only the private root
    is lost (and reported)."""
    maps = {"setgroups": "deny", "uid_map": f"{uid} {uid} 1", "gid_map": f"{gid} {gid} 1"}
    for name, text in maps.items():
        try:
            with open(f"/proc/self/{name}", "w", encoding="ascii") as f:
                f.write(text)
        except OSError:
            return


def mount_points() -> list[tuple[str, int]]:
    """This mount namespace's mount points, in order, with their per-mount flags."""
    found = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
            flags = sum(MOUNT_FLAGS.get(option, 0) for option in fields[5].split(","))
            found.append((point, flags))
    return found


def isolate_filesystem(libc: Any, cfg: dict[str, Any]) -> tuple[bool, str]:
    """Unshare mount and PID namespaces (children of this process start a new PID namespace);
    then lay out the run's private root (`build_root`; the first process of the PID namespace
    enters it), or, failing that, make every mount read-only but the run's directory.
    Returns whether the namespaces exist, and what the filesystem is like."""
    if libc.unshare(CLONE_NEWNS | CLONE_NEWPID) != 0:
        return False, f"shared (no mount namespace: {_errno_text()})"
    if libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        return True, f"shared (mounts not private: {_errno_text()})"
    root = os.path.realpath(cfg["workdir"])
    layout = cfg.get("root")
    why = build_root(libc, layout, root) if layout else "not asked for"
    if why is None:
        return True, PRIVATE_ROOT
    return True, f"{remount_read_only(libc, root)} (no private root: {why})"


def remount_read_only(libc: Any, root: str) -> str:
    """Make every mount read-only, except the run's directory `root`, bound onto itself."""
    if libc.mount(os.fsencode(root), os.fsencode(root), None, MS_BIND, None) != 0:
        return f"shared (cannot bind the run's directory: {_errno_text()})"
    os.chdir(root)  # the cwd now goes through the writable bind mount
    failed = []
    for point, flags in mount_points():
        if point == root:
            continue
        remount = MS_REMOUNT | MS_BIND | MS_RDONLY | flags
        if libc.mount(None, os.fsencode(point), None, remount, None) != 0:
            failed.append(point)
    if failed:
        return f"read-only but the run's directory, except {' '.join(failed[:5])}"
    return "read-only but the run's directory"


def build_root(libc: Any, layout: dict[str, Any], workdir: str) -> str | None:
    """Mount a tmpfs at `layout["dir"]` and lay out the run's private root in it: `links`
    (symlinks), `binds` (read-only), a few devices, empty `/tmp` and `/dev/shm`, a mount point
    for /proc, the run's directory (writable), and an empty tmpfs over each of `hide` that a
    bind shows; then make it read-only. None when done, else why not (and nothing is left)."""
    if platform.machine() not in PIVOT_ROOT:
        return f"no pivot_root number for {platform.machine()}"
    new = os.path.realpath(layout["dir"])
    if libc.mount(b"tmpfs", os.fsencode(new), b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755") != 0:
        return f"tmpfs: {_errno_text()}"
    umask = os.umask(0o022)
    try:
        why = populate_root(libc, new, layout, workdir)
    except OSError as e:
        why = str(e)
    finally:
        os.umask(umask)
    read_only = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
    if why is None and libc.mount(None, os.fsencode(new), None, read_only, None) != 0:
        why = f"read-only root: {_errno_text()}"
    if why is not None:
        libc.umount2(os.fsencode(new), MNT_DETACH)
    return why


def populate_root(libc: Any, new: str, layout: dict[str, Any], workdir: str) -> str | None:
    """The contents of `build_root`'s new root at `new`; None, or what failed."""
    links = dict(layout["links"])
    links.update({f"/dev/{name}": target for name, target in DEVICE_LINKS.items()})
    for link, target in links.items():
        os.makedirs(os.path.dirname(new + link), exist_ok=True)
        os.symlink(target, new + link)
    for path in ("/tmp", "/dev/shm", "/proc", workdir, *layout["binds"]):
        os.makedirs(new + path, exist_ok=True)
    steps = [(path, new + path, False) for path in layout["binds"]]
    for name in DEVICES:
        with open(os.open(new + f"/dev/{name}", os.O_CREAT | os.O_WRONLY, 0o644), "wb"):
            pass
        steps.append((f"/dev/{name}", new + f"/dev/{name}", False))
    for source, target, writable in [*steps, (workdir, new + workdir, True)]:
        if (why := bind(libc, source, target, writable)) is not None:
            return why
    for path in layout["hide"]:
        target = new + path
        if os.path.isdir(target) and os.path.realpath(target) == target:
            flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
            if libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", flags, b"size=4k") != 0:
                return f"hide {path}: {_errno_text()}"
    return None


def bind(libc: Any, source: str, target: str, writable: bool) -> str | None:
    """Bind `source` onto `target`, read-only unless `writable`; None, or why it failed."""
    if libc.mount(os.fsencode(source), os.fsencode(target), None, MS_BIND, None) != 0:
        return f"bind {source}: {_errno_text()}"
    if writable:
        return None
    kept = os.statvfs(target).f_flag  # the source's locked flags must stay (user namespace)
    flags = sum(ms for st, ms in ST_TO_MS.items() if kept & st)
    remount = MS_REMOUNT | MS_BIND | MS_RDONLY | flags
    if libc.mount(None, os.fsencode(target), None, remount, None) != 0:
        return f"read-only {source}: {_errno_text()}"
    return None


class RootNotEntered(OSError):
    """`pivot_root` refused (a chroot, an odd root mount): the old root is still ours."""


def enter_root(libc: Any, new: str, workdir: str) -> str:
    """As the first process of the new PID namespace: mount its /proc in the private root at
    `new` (or, if the kernel refuses, bind the host's), make that root ours (`pivot_root`),
    detach the old one and enter the run's directory. What /proc is, as `mount_own_proc`."""
    pids = mount_own_proc(libc, new + "/proc")
    if pids != "namespace":
        proc = os.fsencode(new + "/proc")
        libc.mount(b"/proc", proc, None, MS_BIND | MS_REC, None)
    os.chdir(new)
    if libc.syscall(PIVOT_ROOT[platform.machine()], b".", b".") != 0:
        raise RootNotEntered(f"pivot_root: {_errno_text()}")
    if libc.umount2(b".", MNT_DETACH) != 0:
        raise OSError(f"detaching the old root: {_errno_text()}")
    os.chdir(workdir)
    return pids


def mount_own_proc(libc: Any, target: str = "/proc") -> str:
    """In a new PID namespace (as its first process): a /proc that shows only its processes."""
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if libc.mount(b"proc", os.fsencode(target), b"proc", flags, None) != 0:
        return f"namespace, but /proc is the host's ({_errno_text()})"
    return "namespace"


def drop_privileges(uid: int | None, caller: int) -> str:
    """Become the dedicated `uid` (when given; we are root); describe who we run as."""
    if uid is None:
        return f"same as the caller (uid {caller})"
    try:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    except OSError as e:
        return f"same as the caller (uid {caller}): setuid({uid}) failed: {e}"
    return f"dedicated uid {uid}"


def drop_capabilities(libc: Any) -> None:
    """Give up every capability, now and across exec (root without a dedicated uid, or any uid
    in a new user namespace holds them all): no ptrace of the undumpable judge, no mounts."""
    import ctypes

    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break  # past the kernel's last capability
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
        raise OSError(ctypes.get_errno(), f"capset: {_errno_text()}")


def set_limits(cfg: dict[str, Any], nproc: int | None) -> None:
    """Resource limits of the child (inherited by anything it starts)."""
    cpu = max(1, int(cfg["cpu_seconds"] + 0.999))
    limits = {
        resource.RLIMIT_CORE: (0, 0),
        resource.RLIMIT_CPU: (cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL at the hard
        resource.RLIMIT_AS: (cfg["memory_bytes"], cfg["memory_bytes"]),
        resource.RLIMIT_FSIZE: (cfg["file_size_bytes"], cfg["file_size_bytes"]),
        resource.RLIMIT_NOFILE: (cfg["open_files"], cfg["open_files"]),
    }
    if nproc is not None:
        limits[resource.RLIMIT_NPROC] = (nproc, nproc)
    for which, (soft, hard) in limits.items():
        _, old_hard = resource.getrlimit(which)
        if old_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, old_hard), min(hard, old_hard)
        resource.setrlimit(which, (soft, hard))


def install_guard(workdir: str, block_processes: bool) -> None:
    """An audit hook refusing sockets, ctypes, writes outside `workdir`, reading other
    processes' /proc entries and (when `block_processes`) starting processes.

    Defence in depth only: code that reaches C (or a process it execs) is not audited.

    Long because the hook and its path checks are closures over the sandbox's root and local
    aliases of `os` (bound before any user code runs), so every rule reads in one place.
    """
    realpath, fsdecode, getpid = os.path.realpath, os.fsdecode, os.getpid
    root = realpath(workdir)
    inside_prefix = root + os.sep
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def allowed_target(path: Any) -> bool:
        if isinstance(path, int):
            return True  # an open descriptor: checked when it was opened
        text = fsdecode(path)
        if text in WRITABLE_DEVICES:
            return True
        real = realpath(text)
        return real == root or real.startswith(inside_prefix)

    def other_process(path: Any) -> bool:
        if isinstance(path, int):
            return False
        text = fsdecode(path)
        if "proc" not in text:
            return False
        parts = realpath(text).split("/")
        return (
            len(parts) > 2
            and parts[1] == "proc"
            and parts[2].isdigit()
            and (int(parts[2]) != getpid())
        )

    def refuse(event: str) -> None:
        raise PermissionError(f"sandbox: {event} is not allowed")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event.startswith(("socket.", "ctypes.")):
            refuse(event)
        elif event == "import":
            name = args[0]
            if name in ("ctypes", "_ctypes") or name.startswith("ctypes."):
                refuse(f"import {name}")
        elif event == "open":
            path = args[0]
            mode = args[1] if len(args) > 1 else None
            flags = args[2] if len(args) > 2 else 0
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or bool(
                isinstance(flags, int) and flags & write_flags
            )
            if writing and not allowed_target(path):
                refuse(f"writing {path!r}")
            if other_process(path):
                refuse(f"reading {path!r}")
        elif event in PATH_EVENTS:
            for i in PATH_EVENTS[event]:
                if i < len(args) and args[i] is not None and not allowed_target(args[i]):
                    refuse(f"{event} {args[i]!r}")
        elif block_processes and event in PROCESS_EVENTS:
            refuse(event)

    sys.addaudithook(hook)
    for name in [m for m in sys.modules if m in ("ctypes", "_ctypes") or m.startswith("ctypes.")]:
        del sys.modules[name]


def add_exit_builtins() -> None:
    """`exit` and `quit`, which `site` adds and -S skips."""
    import builtins

    def leave(code: object = None) -> None:
        raise SystemExit(code)

    for name in ("exit", "quit"):
        if not hasattr(builtins, name):
            setattr(builtins, name, leave)


def run_program(path: str) -> int:
    """Run `path` as `__main__`; its exit code (1 and a traceback on an uncaught exception)."""
    import traceback
    import types

    add_exit_builtins()
    module = types.ModuleType("__main__")
    module.__file__ = path
    sys.modules["__main__"] = module
    try:
        with open(path, encoding="utf-8") as f:
            source = f.read()
        exec(compile(source, path, "exec"), module.__dict__)
        code = 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException as e:  # the traceback without this function's frame
        traceback.print_exception(type(e), e, e.__traceback__ and e.__traceback__.tb_next)
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        code = code or 1
    return code


def judge_tests(
    cfg: dict[str, Any], libc: Any, harness: Any, tests: str, block_processes: bool
) -> int:
    """Fork the candidate process running `main.py`, run `tests` against it here, and report
    the verdict (see `_harness`); the exit code: 0 when every test passed."""
    report_fd = cfg["report_fd"]
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the candidate (same uid) cannot read our memory
    request_read, request_write = os.pipe()
    reply_read, reply_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the candidate: nothing it could report with, nothing secret
        code = 1
        try:
            for fd in (report_fd, request_write, reply_read):
                os.close(fd)
            install_guard(cfg["workdir"], block_processes)
            add_exit_builtins()
            with open("main.py", encoding="utf-8") as f:
                source = f.read()
            code = harness.serve(request_read, reply_write, source, "main.py")
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        os._exit(code)
    os.close(request_read)
    os.close(reply_write)
    install_guard(cfg["workdir"], block_processes)
    passed, reason = harness.judge(harness.Peer(request_write, reply_read), tests, "tests.py")
    verdict = {"tests": "passed" if passed else (reason or "failed")}
    os.write(report_fd, json.dumps(verdict).encode() + b"\n")
    os.close(report_fd)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        passed = False
    return 0 if passed else 1


def child(
    cfg: dict[str, Any], libc: Any, base_tasks: int, caller: int, harness: Any, namespaced: bool
) -> None:
    """The forked child: set up the jail, then run the untrusted `main.py` (or, with a harness,
    judge it against the tests); never returns."""
    report_fd, supervisor = cfg["report_fd"], os.getppid()
    tests = None
    try:
        os.setpgid(0, 0)  # its own group, so the supervisor can kill it and its children at once
        stdin = os.open("input.txt", os.O_RDONLY)
        os.dup2(stdin, 0)
        os.close(stdin)
        if harness is not None:  # read while privileged, and gone before the candidate starts
            with open("tests.py", encoding="utf-8") as f:
                tests = f.read()
            os.unlink("tests.py")
        for name in PRELOAD if cfg["preload"] else ():
            try:
                __import__(name)
            except ImportError:
                pass
        user = drop_privileges(cfg["uid"] if caller == 0 else None, caller)
        enforced = os.getuid() != 0  # root ignores RLIMIT_NPROC
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
        if os.getppid() != supervisor:
            os._exit(SETUP_FAILED)  # the supervisor died before the line above
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # no setuid binaries (sudo) from here on
        if not user.startswith("dedicated"):
            drop_capabilities(libc)
            user += ", no capabilities"
        nproc = base_tasks + 1 + cfg["max_processes"] + (tests is not None)
        set_limits(cfg, nproc if enforced else None)
        processes = f"RLIMIT_NPROC {nproc}" if enforced else "audit hook (root ignores NPROC)"
        line: dict[str, Any] = {"pid": os.getpid(), "user": user, "processes": processes}
        if not namespaced:  # the caller's backstop kills this group (a pid it can see)
            line["group"] = os.getpid()
        os.write(report_fd, json.dumps(line).encode() + b"\n")
        sys.dont_write_bytecode = True
        if tests is None:
            os.close(report_fd)
            install_guard(cfg["workdir"], block_processes=not enforced)
    except BaseException as e:
        print(f"sandbox setup failed: {e!r}", file=sys.stderr)
        os._exit(SETUP_FAILED)
    if tests is not None:
        os._exit(judge_tests(cfg, libc, harness, tests, block_processes=not enforced))
    os._exit(run_program("main.py"))


def kill_descendants(group: int) -> None:
    """SIGKILL the child's process group, then every process adopted by us, until none is left."""
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
    for _ in range(10_000):
        kids = children()
        if not kids:
            return
        for pid in kids:
            try:
                os.killpg(pid, signal.SIGKILL)  # its group too, if it made one
            except OSError:
                pass
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in kids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


STOP: list[int] = []  # set by SIGTERM: the caller wants the run ended (e.g. too much output)


def supervise(pid: int, wall: float) -> dict[str, Any]:
    """Wait for the child at most `wall` seconds (or until SIGTERM), reaping adopted orphans."""
    deadline = time.monotonic() + wall
    while True:
        if STOP:
            return {"timed_out": False, "stopped": True, "exit_code": None, "signal": None}
        try:
            done, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return {"timed_out": False, "exit_code": None, "signal": None, "cpu": 0.0}
        if done == pid:
            return {
                "timed_out": False,
                "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                "cpu": usage.ru_utime + usage.ru_stime,
            }
        if done == 0:
            if time.monotonic() >= deadline:
                return {"timed_out": True, "exit_code": None, "signal": None, "cpu": None}
            time.sleep(0.005)


def load_harness() -> Any:
    """`_harness.py` beside this file, loaded by path (this directory is not on sys.path)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_harness.py")
    spec = importlib.util.spec_from_file_location("atropos_sandbox_harness", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_child(
    cfg: dict[str, Any], libc: Any, base_tasks: int, caller: int, harness: Any, namespaced: bool
) -> dict[str, Any]:
    """Fork the child, supervise it, kill what is left; the outcome."""
    pid = os.fork()
    if pid == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        child(cfg, libc, base_tasks, caller, harness, namespaced)
    outcome = supervise(pid, cfg["wall_seconds"])
    kill_descendants(pid)
    return outcome


def enter_namespace(libc: Any, cfg: dict[str, Any], private_root: bool) -> dict[str, str]:
    """The first process of the PID namespace: its /proc, and the private root when built (if
    `pivot_root` refuses, every mount read-only but the run's directory instead). Its report
    fields: `pids`, and `filesystem` when that changed; never returns when setting up failed
    half-way (no outcome: the run is a `sandbox_error`)."""
    if not private_root:
        return {"pids": mount_own_proc(libc)}
    new, workdir = os.path.realpath(cfg["root"]["dir"]), os.path.realpath(cfg["workdir"])
    try:
        return {"pids": enter_root(libc, new, workdir)}
    except RootNotEntered as e:
        libc.umount2(os.fsencode(new), MNT_DETACH)
        filesystem = f"{remount_read_only(libc, workdir)} (no private root: {e})"
        return {"pids": mount_own_proc(libc), "filesystem": filesystem}
    except BaseException as e:
        print(f"sandbox setup failed: {e!r}", file=sys.stderr)
        os._exit(SETUP_FAILED)


def main(argv: list[str]) -> int:
    cfg = json.loads(argv[1])
    sys.dont_write_bytecode = True
    libc = _libc()
    caller = os.getuid()
    is_root = caller == 0
    target_uid = cfg["uid"] if is_root and cfg["uid"] is not None else caller
    base_tasks = count_tasks(target_uid)  # before a user namespace would hide the real uids
    network = isolate_network(libc, is_root) if cfg["network_namespace"] else "audit hook only"
    if network.startswith("user") and kernel_at_least(5, 14):
        base_tasks = 1  # NPROC now counts per user namespace: only us in this new one
    harness = load_harness() if cfg["harness"] else None
    namespaced, filesystem = False, "shared (namespaces off)"
    if cfg["namespaces"]:
        namespaced, filesystem = isolate_filesystem(libc, cfg)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    signal.signal(signal.SIGTERM, lambda *_: STOP.append(1))
    line = {"network": network, "filesystem": filesystem}
    if not namespaced:
        outcome = run_child(cfg, libc, base_tasks, caller, harness, namespaced)
        outcome.update(line, pids="shared")
        os.write(cfg["report_fd"], json.dumps(outcome).encode() + b"\n")
        return 0
    os.write(cfg["report_fd"], json.dumps(line).encode() + b"\n")  # the init's lines follow
    init = os.fork()  # the first process of the new PID namespace: supervises the child there
    if init == 0:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        fields = enter_namespace(libc, cfg, filesystem == PRIVATE_ROOT)
        tasks = base_tasks + (not is_root)  # this process counts for a non-root NPROC
        outcome = run_child(cfg, libc, tasks, caller, harness, namespaced)
        outcome.update(fields)
        os.write(cfg["report_fd"], json.dumps(outcome).encode() + b"\n")
        os._exit(0)
    signal.signal(signal.SIGTERM, lambda *_: os.kill(init, signal.SIGTERM))
    if STOP:
        os.kill(init, signal.SIGTERM)
    os.waitpid(init, 0)  # its end ends every process in the namespace
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""A local sandbox for model-written Python: a separate, limited process per run.

Each run gets a fresh temporary directory (its cwd, removed afterwards) holding the program,
and a process `python -I -S _supervisor.py` (isolated mode, no site-packages, environment
scrubbed to PATH, HOME, TMPDIR and LANG). The supervisor forks the child that runs the
program and kills every descendant when it ends; in a new PID namespace a first process there
does this (its end ends every process of the namespace). With `tests`, the child is a judge
that runs the tests against the program, which it forks into another process (`_harness`).
Where a mount namespace is allowed, that first process also moves the run into a private root
(`pivot_root`; see "The file system" below). The supervisor and the harness are loaded before
it, so the package's own directory need not be (and is not) visible there.

Threat model. The sandbox is for *accidents and sloppiness* of generated code during RL: it
stops the usual failure modes from hurting the trainer or the machine.

What it protects against:

- **Endless or slow code**: RLIMIT_CPU (SIGXCPU, then SIGKILL) and a wall-clock limit, after
  which the child's process group and every process it left behind are SIGKILLed (the
  supervisor is a child subreaper, so orphans, even ones that called `setsid`, come back to it).
- **Fork bombs**: RLIMIT_NPROC, so a run adds at most `max_processes` tasks. As root (which
  the kernel exempts from NPROC) the child first becomes a dedicated uid, one per concurrency
  slot (`uid_base + slot`), so the limit counts only that run's processes; without the private
  root such a uid may be unable to read the interpreter's files (a Python under /root), and
  then common standard modules are imported before the switch and others cannot be. Not root:
  NPROC is the user's current task count plus `max_processes` (inside a new user namespace on
  Linux >= 5.14, which counts its own tasks: 2 plus `max_processes`). If root cannot drop
  privileges, an audit hook refuses `os.fork`, `subprocess`, `os.exec*`, `os.system` and
  `posix_spawn` instead.
- **Memory bombs**: RLIMIT_AS (a `MemoryError`, or death). **Huge files**: RLIMIT_FSIZE per
  file. **Huge output**: at most `max_output_bytes` is kept per stream; past that the run is
  killed (status `output_limit`), so output never grows our memory.
- **Network**: the supervisor unshares a new network namespace (root, or an unprivileged user
  namespace where the kernel allows one) in which no interface is up, and in every case an
  audit hook refuses creating sockets (`socket.*` events). Unix-domain socket *files* are not
  network: the private root (below) hides them. `SandboxResult.isolation` says which
  layers applied (`network`, `filesystem`, `pids`, `user`, `processes`); a weaker setup than
  asked for is logged once per `Sandbox` as a warning.
- **The file system** (kernel-enforced where namespaces are allowed: root, or an unprivileged
  user namespace): the run gets a private root, a read-only tmpfs holding only read-only binds
  of the system directories (`/usr`, `/bin`, `/sbin`, `/lib*`, `/etc`) and of the Python
  installation (`sys.base_prefix`, the standard library, the real interpreter; a venv's
  `sys.executable` is a symlink to it), the devices `null`, `zero`, `full`, `random` and
  `urandom`, empty read-only `/tmp` and `/dev/shm`, its own `/proc`, and the run's directory,
  the only writable place. The old root is detached. So no process of the run, exec'd programs
  and native code included:
  - reaches a **Unix-domain socket outside the run** by path (no `/var/run/docker.sock`,
    `/run`, SSH agent's socket or `/tmp/.X11-unix` exists there; abstract sockets belong to
    the network namespace, below);
  - reads **the environment's data**: the project, `/home`, `/root`, `/var` and caches are not
    bound, and where a bind would show site-packages, this package (with its datasets) or a
    dataset cache (`~/.cache`, `HF_HOME`), an empty tmpfs covers it. The held-out items and
    their reference solutions are out of reach;
  - creates, links, renames or changes anything outside the run's directory (`os.mknod` and
    `os.mkfifo` fail with EROFS; writing to devices such as `/dev/null` still works).

  When the private root cannot be built (`isolation["filesystem"]` says why, and a warning is
  logged once), the mount namespace still makes every mount read-only but the run's directory
  (so the last point holds), while reading and socket files are as below. Always, as defence in
  depth, the audit hook refuses Python-level opening for writing, removing, renaming, chmod-ing
  and linking outside the directory; it cannot see `os.mknod` and `os.mkfifo` (no audit
  events), so without namespaces only a dedicated uid's permissions stop those, and not in
  world-writable places.
- **Other processes** (kernel-enforced with namespaces): a new PID namespace with its own /proc,
  so the run sees only its own processes: no other process's cmdline, environ or fds. Without
  it, a dedicated uid cannot read other users' `environ`, `fd` or `mem` (owner-only) but can
  read any process's `cmdline`; the audit hook refuses Python-level opening of
  `/proc/<other pid>/` either way. The environment is scrubbed.
- **The invoking user's files**: a dedicated uid reads only what any user may, so files of mode
  0600 (an API's store) are out of reach. Without one, the code runs as the invoking user.
- **Capabilities**: root without a dedicated uid, or any uid in a new user namespace, gives up
  every capability (bounding set and capset) and `PR_SET_NO_NEW_PRIVS` stops setuid binaries
  (`sudo`) from gaining privileges.
- **Forged test verdicts** (`run(..., tests=...)`): the tests run in a separate, undumpable
  process that alone can report; the code under test gets no marker, file or descriptor to
  forge the verdict with (see `_harness`).
- **Objects that compare equal to everything** (`run(..., tests=...)`): what decides a test
  (`==`, `!=`, ordering, truth, `in`) and arithmetic (`abs(x - expected) < 1e-6`) run in the
  judge process, on its decoded copies of plain data (None, bool, int, float, complex, str,
  bytes, list, tuple, set, dict, Fraction, Decimal); comparing, testing, searching or computing
  with any other object of the code fails the test. The code's `__eq__` or `__sub__` is never
  asked (see `_harness`). Always, namespaces or not.

What it does NOT protect against (it is not a security boundary; use a VM or gVisor, or a
service such as Modal, for code written to attack you):

- Same kernel: a kernel exploit escapes everything. Without a dedicated uid the code runs as
  the caller's user and may signal, trace or write whatever that user can, bypassing Python.
- Audit hooks are a Python-level guard. Native code bypasses them (ctypes is refused and its
  import blocked, but C extensions, `/proc/self/mem`, or any process the code `exec`s, such as
  `bash`, are not audited). With a network namespace the network stays closed for those too;
  without one it does not. Socket files and the dataset stay out of their reach only with the
  private root.
- Without the private root (no mount namespace, or it could not be built): the file system
  stays readable as far as the uid's permissions go (world-readable files, the environment's
  dataset with its held-out reference solutions when it is such a file; everything the caller
  can read, without a dedicated uid), and an exec'd program or native code can connect to any
  Unix-domain socket file the uid may open (a Docker daemon's, an SSH agent's, X11's); the
  network namespace does not cover those. Without namespaces, a dedicated uid can also create
  files in world-writable places (`/tmp`, `/dev/shm`) through `os.mknod`/`os.mkfifo` or an
  exec'd program.
- With it, the run still reads the system directories and the Python installation (world-
  readable files there, `/etc/passwd` included), and sees the mount table (`/proc/self/mounts`,
  paths only).
- Reward hacking inside the rules: hard-coding the answers to the tests shown in the prompt;
  shadowing a built-in the tests call (`def abs(x): return 0`) when the item names no entry
  point (with one, `problems.jobs_for` gives the tests the built-ins back).
- Disk: RLIMIT_FSIZE caps each file, not their number, inside the directory. CPU: each process
  gets its own RLIMIT_CPU, so a capped fork tree may use up to `max_processes` CPU-seconds
  budgets before the wall clock stops it.
- Cleanup relies on the supervisor: if it is killed (SIGKILL from outside), the child dies with
  it (PR_SET_PDEATHSIG) and the caller kills the groups and (dedicated uid) every process of
  the uid, but a same-user orphan that left the process group may survive.

>>> with Sandbox(SandboxLimits(wall_seconds=5)) as box:
...     result = box.run("print(sum(range(10)))")
>>> result.status, result.stdout
('ok', '45\\n')
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import pwd
import queue
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT_UID_BASE", "Sandbox", "SandboxLimits", "SandboxResult"]

SUPERVISOR = str(Path(__file__).with_name("_supervisor.py"))
DEFAULT_UID_BASE = 1_500_000_000  # far above the uids of real users and of container maps
log = logging.getLogger(__name__)
SETUP_FAILED = 125  # `_supervisor.SETUP_FAILED`
GRACE_SECONDS = 3.0  # the supervisor's start and cleanup, beyond the wall-clock limit
# what the private root shows of the system (read-only), besides the Python installation
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")


@dataclass(frozen=True)
class SandboxLimits:
    """The limits of one run (each process of it, for CPU, memory and file size)."""

    wall_seconds: float = 10.0
    cpu_seconds: float = 5.0
    memory_bytes: int = 1024 * 2**20
    max_processes: int = 16
    file_size_bytes: int = 16 * 2**20
    max_output_bytes: int = 2**20
    open_files: int = 128

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not value > 0:
                raise ValueError(f"SandboxLimits.{name} must be positive, got {value!r}")


@dataclass
class SandboxResult:
    """What one run did.

    `status` is one of: `ok` (exit code 0), `error` (another exit code), `timeout` (wall
    clock), `cpu_limit`, `output_limit`, `file_limit` (RLIMIT_FSIZE), `killed` (another
    signal) or `sandbox_error` (the sandbox itself failed; `stderr` says why).
    """

    status: str
    exit_code: int | None
    signal: int | None
    stdout: str
    stderr: str
    duration: float
    isolation: dict[str, str] = field(default_factory=dict)
    tests: str | None = None  # `run(..., tests=...)`: "passed", "error" or "exited_early"

    @property
    def ok(self) -> bool:
        """Whether the program ran to the end and exited with 0."""
        return self.status == "ok"


class Sandbox:
    """Runs Python programs in limited, isolated processes, at most `max_concurrency` at once.

    Args:
        limits: per-run limits.
        max_concurrency: runs at once; more wait for a slot (`run` blocks, `arun` awaits).
        network_namespace: unshare a network namespace when the kernel allows it.
        namespaces: unshare mount and PID namespaces when the kernel allows it: a private,
            read-only root showing only the system directories, the Python installation and
            the run's directory (writable); a /proc showing only the run's processes.
        drop_privileges: when running as root, run as a dedicated uid per slot.
        uid_base: the first dedicated uid (uids `uid_base` .. `uid_base + max_concurrency - 1`
            must belong to nobody: every process they own is killed after a run).
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        max_concurrency: int = 4,
        network_namespace: bool = True,
        namespaces: bool = True,
        drop_privileges: bool = True,
        uid_base: int = DEFAULT_UID_BASE,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self.limits = limits or SandboxLimits()
        self.max_concurrency = max_concurrency
        self.network_namespace = network_namespace
        self.namespaces = namespaces
        self._warned = False
        self._uids: list[int] | None = None
        if drop_privileges and os.geteuid() == 0:
            self._uids = [uid_base + i for i in range(max_concurrency)]
            for uid in self._uids:
                try:
                    taken = pwd.getpwuid(uid).pw_name
                except KeyError:
                    continue
                raise ValueError(f"uid {uid} belongs to {taken!r}; choose another uid_base")
        # a dedicated uid that cannot read the standard library gets common modules preloaded
        self._preload = self._uids is not None and not _world_readable(_stdlib_dirs())
        self._slots: queue.Queue[int] = queue.Queue()
        for slot in range(max_concurrency):
            self._slots.put(slot)
        self._executor: ThreadPoolExecutor | None = None

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker threads of `arun` (runs in progress finish first)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def run(self, program: str, stdin: str = "", tests: str | None = None) -> SandboxResult:
        """Run `program` (Python source) with `stdin`; block until a slot is free and it ends.

        With `tests` (Python source: asserts), `program` is the code under test and `tests` run
        against its names in another process (`_harness`); `SandboxResult.tests` is the verdict,
        which the program cannot forge.
        """
        slot = self._slots.get()
        start = time.monotonic()
        try:
            uid = self._uids[slot] if self._uids is not None else None
            options = {
                "network_namespace": self.network_namespace,
                "namespaces": self.namespaces,
                "preload": self._preload,
            }
            result = _execute(program, stdin, tests, self.limits, uid, options)
        except OSError as e:  # no process, no temporary directory: a failed run, not a crash
            return SandboxResult("sandbox_error", None, None, "", repr(e), time.monotonic() - start)
        finally:
            self._slots.put(slot)
        self._warn_once(result)
        return result

    async def arun(self, program: str, stdin: str = "", tests: str | None = None) -> SandboxResult:
        """`run` in a worker thread, so many runs proceed concurrently (bounded)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self.max_concurrency, "atropos-sandbox")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.run, program, stdin, tests)

    def _warn_once(self, result: SandboxResult) -> None:
        """Log once when the kernel refused the namespaces (or the private root) we asked for."""
        isolation = result.isolation
        if self._warned or not self.namespaces or "filesystem" not in isolation:
            return
        filesystem, pids = isolation["filesystem"], isolation.get("pids", "?")
        if filesystem.startswith("read-only") and pids == "namespace":
            if filesystem.startswith("read-only private root"):
                return
            self._warned = True
            log.warning(
                "sandbox: no private root on this machine (filesystem: %s): the code can read "
                "what its uid may (the dataset included) and connect to Unix sockets outside "
                "its directory",
                filesystem,
            )
            return
        self._warned = True
        log.warning(
            "sandbox: weaker isolation on this machine (filesystem: %s; pids: %s): the code "
            "may write to world-writable places and see other processes",
            filesystem,
            pids,
        )


def _write_files(
    workdir: str, program: str, stdin: str, tests: str | None, uid: int | None
) -> None:
    """The program and its input into `workdir` (owned by `uid` when set), and the tests,
    which stay ours (0600): the harness reads and removes them as root."""
    for name, text in (("main.py", program), ("input.txt", stdin)):
        Path(workdir, name).write_text(text, encoding="utf-8")
        if uid is not None:
            os.chown(Path(workdir, name), uid, uid)
    if tests is not None:
        descriptor = os.open(Path(workdir, "tests.py"), os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as f:
            f.write(tests)
    if uid is not None:
        os.chown(workdir, uid, uid)


def _execute(
    program: str,
    stdin: str,
    tests: str | None,
    limits: SandboxLimits,
    uid: int | None,
    options: dict[str, bool],
) -> SandboxResult:
    start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="atropos-sandbox-")
    root_dir = tempfile.mkdtemp(prefix="atropos-sandbox-root-") if options["namespaces"] else None
    read_fd = -1
    proc: subprocess.Popen[bytes] | None = None
    lines: list[dict[str, Any]] = []
    try:
        _write_files(workdir, program, stdin, tests, uid)
        read_fd, write_fd = os.pipe()
        config = {
            "workdir": workdir,
            "uid": uid,
            "report_fd": write_fd,
            "harness": tests is not None,
            "root": {"dir": root_dir, **_root_layout()} if root_dir else None,
            **options,
            "wall_seconds": limits.wall_seconds,
            "cpu_seconds": limits.cpu_seconds,
            "memory_bytes": limits.memory_bytes,
            "max_processes": limits.max_processes,
            "file_size_bytes": limits.file_size_bytes,
            "open_files": limits.open_files,
        }
        env = {"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"}
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", SUPERVISOR, json.dumps(config)],
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                pass_fds=(write_fd,),
            )
        finally:
            os.close(write_fd)
        deadline = start + limits.wall_seconds + GRACE_SECONDS
        out, err, cut = _collect(proc, deadline, limits.max_output_bytes)
    finally:
        if proc is not None:
            _stop(proc)
        if read_fd >= 0:
            lines = _read_report(read_fd)
        if proc is not None:
            _backstop([line["group"] for line in lines if "group" in line], uid)
        _remove(workdir)
        if root_dir is not None:
            _remove_mount_point(root_dir)
    return _result(lines, out, err, cut, time.monotonic() - start, limits)


def _root_layout() -> dict[str, Any]:
    """What the private root shows (`_supervisor.build_root`): the system directories and the
    Python installation, read-only; `hide`: what they must not show (site-packages, this
    package and its datasets, caches), covered by an empty tmpfs there."""
    links = {d: os.readlink(d) for d in SYSTEM_DIRS if os.path.islink(d)}
    found = [d for d in SYSTEM_DIRS if os.path.isdir(d) and d not in links]
    executable = os.path.realpath(sys.executable)
    python = [sys.base_prefix, *_stdlib_dirs(), os.path.dirname(executable)]
    for path in sorted({os.path.realpath(p) for p in python}, key=len):
        if path != "/" and not _under(path, found):  # "/" would show everything
            found.append(path)
    if os.path.abspath(sys.executable) != executable:  # a venv's python: a link to the real one
        links[os.path.abspath(sys.executable)] = executable
    hide = {os.path.realpath(p) for p in _private_paths()}
    return {"links": links, "binds": found, "hide": sorted(p for p in hide if _under(p, found))}


def _private_paths() -> list[str]:
    """Directories the code must not read: where packages are installed (this one, with its
    datasets, included) and the dataset caches."""
    import site
    import sysconfig

    home = os.path.expanduser("~")
    paths = [*site.getsitepackages(), site.getusersitepackages(), str(Path(__file__).parents[2])]
    paths += [sysconfig.get_path(name) for name in ("purelib", "platlib")]
    paths += [os.path.join(home, ".cache")]
    paths += [os.environ[k] for k in ("HF_HOME", "HF_DATASETS_CACHE") if k in os.environ]
    return paths


def _under(path: str, directories: list[str]) -> bool:
    """Whether `path` is one of `directories` or inside one."""
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in directories)


def _remove_mount_point(directory: str) -> None:
    try:
        os.rmdir(directory)
    except OSError:
        pass  # still a mount point in a namespace not yet gone: an empty directory is left


def _stdlib_dirs() -> list[str]:
    """Where the standard library's modules and extension modules live."""
    stdlib = os.path.dirname(os.__file__)
    dynload = os.path.join(stdlib, "lib-dynload")
    return [stdlib, dynload] if os.path.isdir(dynload) else [stdlib]


def _world_readable(directories: list[str]) -> bool:
    """Whether any user may list `directories` and reach them (o+rx on each, o+x above)."""
    for directory in directories:
        path = Path(directory).resolve()
        try:
            if path.stat().st_mode & 0o005 != 0o005:
                return False
            if any(parent.stat().st_mode & 0o001 == 0 for parent in path.parents):
                return False
        except OSError:
            return False
    return True


def _collect(proc: subprocess.Popen[bytes], deadline: float, cap: int) -> tuple[bytes, bytes, str]:
    """Read stdout and stderr (at most `cap` bytes each) until both close or the supervisor is
    gone (then the third value is ""), a stream overflows ("output_limit") or the deadline
    passes ("timeout")."""
    assert proc.stdout is not None and proc.stderr is not None
    buffers = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray()}
    overflow = False
    with selectors.DefaultSelector() as selector:
        for stream in (proc.stdout, proc.stderr):
            selector.register(stream, selectors.EVENT_READ)
        while selector.get_map() and not overflow:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ready = selector.select(min(remaining, 0.1))
            for key, _ in ready:
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer = buffers[key.fd]
                room = cap - len(buffer)
                buffer += chunk[:room]
                overflow = overflow or len(chunk) > room
            if not ready and proc.poll() is not None:
                break  # the supervisor has ended and nothing more is coming
    cut = "output_limit" if overflow else ("timeout" if time.monotonic() >= deadline else "")
    return bytes(buffers[proc.stdout.fileno()]), bytes(buffers[proc.stderr.fileno()]), cut


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Make sure the supervisor is gone and reaped: asked first (SIGTERM: it then kills what the
    program started, and reports), then SIGKILLed with its group."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            _killpg(proc.pid)
            proc.wait()
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def _read_report(fd: int) -> list[dict[str, Any]]:
    """The JSON lines the supervisor and the child wrote to the report pipe."""
    data = bytearray()
    os.set_blocking(fd, False)
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    except BlockingIOError:
        pass  # a writer is still alive (a lost supervisor): take what is there
    finally:
        os.close(fd)
    lines = []
    for raw in data.splitlines():
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict):
            lines.append(line)
    return lines


def _backstop(child_pids: list[int], uid: int | None) -> None:
    """Kill what a lost supervisor may have left: the child's group and, for a dedicated uid,
    every process of that uid (`kill -9 -1` run as the uid)."""
    for pid in child_pids:
        _killpg(pid)
    if uid is None or not _has_tasks(uid):
        return
    kill = shutil.which("kill", path="/usr/bin:/bin")
    if kill is None:
        return
    for _ in range(5):
        subprocess.run(
            [kill, "-9", "-1"],
            user=uid,
            group=uid,
            extra_groups=[],
            env={},
            cwd="/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
            timeout=10,
        )
        if not _has_tasks(uid):
            return


def _has_tasks(uid: int) -> bool:
    """Whether any process has real uid `uid`."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/status", "rb") as f:
                    for line in f:
                        if line.startswith(b"Uid:"):
                            if int(line.split()[1]) == uid:
                                return True
                            break
            except (OSError, ValueError):
                continue
    return False


def _remove(workdir: str) -> None:
    """Remove the run's directory, even if the program took permissions away inside it."""

    def fix(function: Any, path: str, _: Any) -> None:
        try:
            os.chmod(os.path.dirname(path), 0o700)
            os.chmod(path, 0o700)
        except OSError:
            pass
        function(path)

    try:
        shutil.rmtree(workdir, onerror=fix)
    except OSError:
        shutil.rmtree(workdir, ignore_errors=True)


def _result(
    lines: list[dict[str, Any]],
    out: bytes,
    err: bytes,
    cut: str,
    duration: float,
    limits: SandboxLimits,
) -> SandboxResult:
    """The result, from the report lines (the child's, then the supervisor's) and the output."""
    report: dict[str, Any] = {}
    for line in lines:
        report.update(line)
    isolation: dict[str, str] = {
        k: str(report[k])
        for k in ("network", "filesystem", "pids", "user", "processes")
        if k in report
    }
    exit_code, sig = report.get("exit_code"), report.get("signal")
    stdout = out.decode("utf-8", "replace")
    stderr = err.decode("utf-8", "replace")
    if cut:  # we ended the run: too much output, or the supervisor overran the deadline
        status = cut
    elif report.get("timed_out"):
        status = "timeout"
    elif "timed_out" not in report:  # the supervisor failed before its report
        status = "sandbox_error"
    elif "pid" not in report and exit_code == SETUP_FAILED:
        status = "sandbox_error"
    elif sig == signal.SIGXCPU or (sig == signal.SIGKILL and _over_cpu(report, limits)):
        status = "cpu_limit"
    elif sig == signal.SIGXFSZ:
        status = "file_limit"
    elif sig is not None:
        status = "killed"
    else:
        status = "ok" if exit_code == 0 else "error"
    tests = report.get("tests")
    tests = str(tests) if tests is not None else None
    return SandboxResult(status, exit_code, sig, stdout, stderr, duration, isolation, tests)


def _over_cpu(report: dict[str, Any], limits: SandboxLimits) -> bool:
    """Whether a SIGKILLed child had used its CPU time (the hard RLIMIT_CPU sends SIGKILL)."""
    cpu = report.get("cpu")
    return isinstance(cpu, (int, float)) and cpu >= math.ceil(limits.cpu_seconds) - 0.05

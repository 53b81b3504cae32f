"""What runs inside the sandbox: `python3 -I -S -c <this file> MODE HARNESS CPU FILES`.

`sandbox.CodeRunner` passes this file's text and `_harness.py`'s as arguments (no file of the
package is put into the sandbox) and the job on stdin: `<length>\\n`, the program, then the
rest (the program's own stdin, or the tests). Standard library only; it runs under the
sandbox's system `python3` (the image's, for docker), never imported by the package.

It adds, inside the provider's isolation (network, uid, rlimits, deadline, output cap):

- RLIMIT_CPU's soft limit one second under the provider's hard one, so an endless loop dies
  of SIGXCPU (`cpu_limit`), not of a SIGKILL that could be anything; RLIMIT_NOFILE 128;
- an audit hook (defence in depth, Python-level only): no sockets, no ctypes, no writes,
  removals, renames or chmods outside the work dir, no reading other processes' `/proc`
  entries, and no new processes where RLIMIT_NPROC does not hold (root inside, or no
  dedicated uid: the provider could not cap the process count);
- `exit` and `quit` (which `site` adds and `-S` skips);
- MODE `tests`: the judge of `_harness` in this process and the code under test in a forked
  one. The tests are read from stdin only after the fork, and the candidate's stdin is
  `/dev/null`: they are never in its files or memory. The verdict is this process's exit code
  (0 passed, 1 a test failed, 3 the code under test ended before the tests did), which the
  candidate cannot set; it is not dumpable, so the candidate (same uid) cannot trace it.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import types
from typing import Any

SETUP_FAILED = 125
EXIT_CODES = {"": 0, "error": 1, "exited_early": 3}  # the judge's reason -> its exit code
PR_SET_DUMPABLE = 4
PROCESS_EVENTS = frozenset(
    {"os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system"}
    | {"subprocess.Popen"}
)
PATH_EVENTS = {  # audited filesystem changes -> the positions of their path arguments
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


def read_exactly(size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = os.read(0, min(left, 1 << 20))
        if not chunk:
            raise EOFError("the job ended early")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_program() -> str:
    """The program, from the head of stdin; what follows it stays unread."""
    header = b""
    while not header.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte or len(header) > 20:
            raise EOFError("no job header")
        header += byte
    return read_exactly(int(header)).decode("utf-8", "replace")


def read_rest() -> str:
    chunks = []
    while chunk := os.read(0, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def set_limits(cpu_seconds: int) -> None:
    """A soft RLIMIT_CPU under the provider's hard one (SIGXCPU first); few files; no cores."""
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard == resource.RLIM_INFINITY or cpu_seconds < hard:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, hard))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(128, hard), min(128, hard)))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def processes_capped() -> bool:
    """Whether RLIMIT_NPROC holds here (set, and we are not root, whom it exempts)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    return os.getuid() != 0 and soft != resource.RLIM_INFINITY


def install_guard(workdir: str, block_processes: bool) -> None:
    """The audit hook of the module docstring. Its checks are closures over local aliases of
    `os`, bound before any of the code runs."""
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
        if isinstance(path, int) or "proc" not in fsdecode(path):
            return False
        parts = realpath(fsdecode(path)).split("/")
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
    import builtins

    def leave(code: object = None) -> None:
        raise SystemExit(code)

    for name in ("exit", "quit"):
        if not hasattr(builtins, name):
            setattr(builtins, name, leave)


def run_program(source: str) -> int:
    """Run `source` as `__main__` (file name main.py); its exit code (1 and a traceback on an
    uncaught exception)."""
    import traceback

    module = types.ModuleType("__main__")
    module.__file__ = "main.py"
    sys.modules["__main__"] = module
    try:
        exec(compile(source, "main.py", "exec"), module.__dict__)
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


def load_harness(source: str) -> Any:
    module = types.ModuleType("atropos_sandbox_harness")
    sys.modules[module.__name__] = module  # dataclasses and pickle look modules up by name
    exec(compile(source, "_harness.py", "exec"), module.__dict__)
    return module


def judge(program: str, harness: Any, block_processes: bool) -> int:
    """Fork the candidate running `program`; read the tests and run them here; the exit code
    says the verdict (`EXIT_CODES`)."""
    import ctypes

    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the candidate cannot read our memory
    workdir = os.getcwd()
    request_read, request_write = os.pipe()
    reply_read, reply_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the candidate: no tests, nothing to report with
        code = 1
        try:
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            for fd in (null, request_write, reply_read):
                os.close(fd)
            install_guard(workdir, block_processes)
            add_exit_builtins()
            code = harness.serve(request_read, reply_write, program, "main.py")
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        os._exit(code)
    os.close(request_read)
    os.close(reply_write)
    tests = read_rest()
    install_guard(workdir, block_processes)
    passed, reason = harness.judge(harness.Peer(request_write, reply_read), tests, "tests.py")
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        passed = False
    return 0 if passed else EXIT_CODES.get(reason, 1)


def main(argv: list[str]) -> int:
    try:
        mode, harness_source, cpu = argv[1], argv[2], int(argv[3])
        sys.dont_write_bytecode = True
        program = read_program()
        set_limits(cpu)
        block = not processes_capped()
        harness = load_harness(harness_source) if mode == "tests" else None
    except BaseException as e:
        print(f"sandbox setup failed: {e!r}", file=sys.stderr)
        return SETUP_FAILED
    if harness is not None:
        return judge(program, harness, block)
    install_guard(os.getcwd(), block)
    add_exit_builtins()
    return run_program(program)


if __name__ == "__main__":
    os._exit(main(sys.argv))

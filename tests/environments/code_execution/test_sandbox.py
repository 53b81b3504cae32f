"""The local sandbox: ordinary runs, and adversarial code it must contain (fork bombs, endless
loops, huge output, memory bombs, network access, stray writes, reading secrets)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import time
import uuid
from pathlib import Path

import pytest

from atropos.environments.code_execution._supervisor import kernel_at_least
from atropos.environments.code_execution.sandbox import (
    DEFAULT_UID_BASE,
    GRACE_SECONDS,
    Sandbox,
    SandboxLimits,
)

LIMITS = SandboxLimits(
    wall_seconds=2.0,
    cpu_seconds=1.0,
    memory_bytes=256 * 2**20,
    max_processes=8,
    max_output_bytes=64 * 1024,
)
CONCURRENCY = 2


@pytest.fixture(scope="module")
def box():
    with Sandbox(LIMITS, max_concurrency=CONCURRENCY) as sandbox:
        yield sandbox


def supervisors() -> list[int]:
    """Processes still running our supervisor script (forked children share its cmdline)."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            except OSError:
                continue
            if b"_supervisor.py" in cmdline:
                found.append(int(name))
    return found


def tasks_of_sandbox_uids() -> list[int]:
    """Processes owned by one of the dedicated uids (when running as root)."""
    uids = {DEFAULT_UID_BASE + i for i in range(CONCURRENCY)}
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                status = Path(f"/proc/{name}/status").read_text()
            except OSError:
                continue
            uid_line = next((line for line in status.splitlines() if line.startswith("Uid:")), "")
            if uid_line and int(uid_line.split()[1]) in uids:
                found.append(int(name))
    return found


def assert_nothing_left() -> None:
    assert supervisors() == []
    assert tasks_of_sandbox_uids() == []


# ----- ordinary runs ----------------------------------------------------------------------------


def test_a_program_runs_with_stdin_and_reports_how_it_was_isolated(box):
    result = box.run("import sys\nprint(sys.stdin.read().upper(), end='')", stdin="hi\n")
    assert result.ok and result.stdout == "HI\n" and result.exit_code == 0
    assert set(result.isolation) == {"network", "filesystem", "pids", "user", "processes"}
    if os.geteuid() == 0:
        assert result.isolation["user"].startswith("dedicated uid")


def test_errors_and_syntax_errors_are_failed_runs(box):
    result = box.run("raise ValueError('boom')")
    assert result.status == "error" and result.exit_code == 1
    assert "ValueError: boom" in result.stderr
    result = box.run("def f(:\n    pass")
    assert result.status == "error" and "SyntaxError" in result.stderr
    assert box.run("import sys; sys.exit(3)").exit_code == 3


def test_runs_are_concurrent_but_bounded(box):
    program = "import time\nstart = time.time()\ntime.sleep(0.4)\nprint(start, time.time())"

    async def main():
        return await asyncio.gather(*(box.arun(program) for _ in range(4)))

    results = asyncio.run(main())
    assert all(r.ok for r in results)
    spans = [tuple(map(float, r.stdout.split())) for r in results]
    busiest = max(sum(s <= t < e for s, e in spans) for t, _ in spans)
    assert busiest == CONCURRENCY


def test_a_sandbox_failure_is_a_failed_run(box, monkeypatch):
    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("tempfile.mkdtemp", refuse)
    result = box.run("print(1)")
    assert (result.status, result.ok) == ("sandbox_error", False)
    assert "No space left" in result.stderr


def test_limits_are_checked():
    with pytest.raises(ValueError, match="wall_seconds must be positive"):
        SandboxLimits(wall_seconds=0)
    with pytest.raises(ValueError, match="max_concurrency"):
        Sandbox(max_concurrency=0)


# ----- adversarial code -------------------------------------------------------------------------

FORK_BOMB = """
import os
while True:
    try:
        os.fork()
    except OSError:
        pass
"""


def test_a_fork_bomb_is_capped_stopped_and_leaves_nothing_behind(box):
    start = time.monotonic()
    result = box.run(FORK_BOMB)
    assert time.monotonic() - start < LIMITS.wall_seconds + GRACE_SECONDS
    assert not result.ok and result.status in ("timeout", "cpu_limit")
    assert_nothing_left()


PROCESS_COUNT = """
import os, time
children = 0
try:
    for _ in range(200):
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        children += 1
except (OSError, PermissionError) as e:
    print("refused after", children, type(e).__name__)
"""


@pytest.mark.parametrize("drop_privileges", [True, False])
def test_process_count_is_capped(box, drop_privileges):
    """As root without a dedicated uid the audit hook refuses every fork instead."""
    sandbox = box if drop_privileges else Sandbox(LIMITS, max_concurrency=1, drop_privileges=False)
    start = time.monotonic()
    result = sandbox.run(PROCESS_COUNT)
    assert result.ok, result.stderr
    words = result.stdout.split()
    assert words[:2] == ["refused", "after"]
    own_namespace = "user+" in result.isolation["network"] and kernel_at_least(5, 14)
    own_count = "dedicated" in result.isolation["user"] or own_namespace
    if "audit hook" in result.isolation["processes"]:
        assert words[2:] == ["0", "PermissionError"]
    elif own_count:  # NPROC counts only this run's tasks
        assert words[2:] == [str(LIMITS.max_processes), "BlockingIOError"]
    else:  # NPROC counts all the user's tasks, which may come and go meanwhile
        assert 0 < int(words[2]) <= 2 * LIMITS.max_processes
    assert time.monotonic() - start < LIMITS.wall_seconds  # the sleepers were killed, not awaited
    assert_nothing_left()


def test_orphans_in_their_own_session_are_killed_too(box):
    if "audit hook" in box.run("pass").isolation["processes"]:
        pytest.skip("root without a dedicated uid: the audit hook refuses fork")
    program = """
import os, time
for _ in range(3):
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(60)
        os._exit(0)
print("spawned")
"""
    result = box.run(program)
    assert result.ok and result.stdout == "spawned\n"
    assert_nothing_left()


def test_an_endless_loop_hits_the_cpu_limit():
    limits = SandboxLimits(wall_seconds=8, cpu_seconds=1)  # room for a busy machine
    with Sandbox(limits, max_concurrency=1) as sandbox:
        start = time.monotonic()
        result = sandbox.run("while True:\n    pass")
    assert result.status == "cpu_limit" and not result.ok
    assert time.monotonic() - start < limits.wall_seconds


def test_a_sleeping_program_hits_the_wall_clock(box):
    start = time.monotonic()
    result = box.run("import time\nprint('started', flush=True)\ntime.sleep(60)")
    assert result.status == "timeout" and result.stdout == "started\n"
    assert time.monotonic() - start < LIMITS.wall_seconds + GRACE_SECONDS
    assert_nothing_left()


def test_huge_output_is_capped_and_the_run_stopped(box):
    program = "import os, time\nif os.fork() == 0:\n    time.sleep(60)\n"  # a child to clean up
    program += "while True:\n    print('x' * 10000)"
    result = box.run(program)
    assert result.status == "output_limit"
    assert len(result.stdout) <= LIMITS.max_output_bytes
    result = box.run("import sys\nwhile True:\n    sys.stderr.write('e' * 10000)")
    assert result.status == "output_limit" and len(result.stderr) <= LIMITS.max_output_bytes
    assert_nothing_left()


def test_a_memory_bomb_fails_inside_the_limit(box):
    result = box.run("blocks = []\nwhile True:\n    blocks.append(bytearray(32 * 2**20))")
    assert not result.ok and "MemoryError" in result.stderr
    result = box.run("x = bytearray(2**34)")
    assert not result.ok and "MemoryError" in result.stderr


def test_a_big_file_hits_the_file_size_limit():
    limits = SandboxLimits(wall_seconds=2, file_size_bytes=2**20)
    with Sandbox(limits, max_concurrency=1) as small:
        result = small.run("open('big.bin', 'wb').write(b'x' * 2**21)")
    # Python ignores SIGXFSZ, so the write fails with EFBIG instead of killing the process
    assert result.status in ("file_limit", "error") and "File too large" in result.stderr


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


def connections(server: socket.socket) -> int:
    seen = 0
    while True:
        try:
            conn, _ = server.accept()
        except BlockingIOError:
            return seen
        conn.close()
        seen += 1


def test_python_sockets_are_refused(box, listener):
    port = listener.getsockname()[1]
    program = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)"
    for sandbox in (box, Sandbox(LIMITS, max_concurrency=1, network_namespace=False)):
        result = sandbox.run(program)
        assert not result.ok and "PermissionError: sandbox: socket" in result.stderr
    assert connections(listener) == 0


def test_the_network_namespace_stops_code_the_audit_hook_cannot_see(box, listener):
    """`bash` is another program: no audit hook; only the namespace keeps it off the network."""
    if "namespace" not in box.run("pass").isolation["network"]:
        pytest.skip("no network namespace here (the audit hook is the only network guard)")
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    port = listener.getsockname()[1]
    program = (
        "import subprocess\n"
        f"r = subprocess.run([{bash!r}, '-c', 'echo hi > /dev/tcp/127.0.0.1/{port}'])\n"
        "print('exit', r.returncode)"
    )
    result = box.run(program)
    assert result.stdout != "exit 0\n"
    assert connections(listener) == 0


def test_writes_outside_the_temporary_directory_are_refused(box, tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("mine")
    outside = [tmp_path / "escape.txt", Path("/tmp") / f"atropos-escape-{uuid.uuid4().hex}"]
    program = f"""
import os
print(os.getcwd())
open("inside.txt", "w").write("fine")
for path in {[str(p) for p in outside]!r}:
    try:
        open(path, "w").write("escaped")
    except OSError as e:
        print("refused", type(e).__name__)
for action in (lambda: os.remove({str(keep)!r}), lambda: os.rename({str(keep)!r}, "stolen")):
    try:
        action()
    except OSError as e:
        print("refused", type(e).__name__)
"""
    result = box.run(program)
    assert result.ok, result.stderr
    workdir, *lines = result.stdout.splitlines()
    assert lines == ["refused PermissionError"] * 4
    assert not any(p.exists() for p in outside) and keep.read_text() == "mine"
    assert not os.path.exists(workdir)  # the temporary directory is gone


def test_secrets_of_the_parent_are_not_visible(box, monkeypatch):
    monkeypatch.setenv("ATROPOS_TEST_SECRET", "hunter2")
    program = f"""
import os
print(sorted(os.environ))
for pid in ({os.getpid()}, os.getppid()):
    try:
        print(open(f"/proc/{{pid}}/environ").read())
    except OSError as e:
        print("refused", type(e).__name__)
"""
    result = box.run(program)
    assert result.ok, result.stderr
    assert "hunter2" not in result.stdout
    first, *rest = result.stdout.splitlines()
    assert first == "['HOME', 'LANG', 'PATH', 'TMPDIR']"
    assert all(line.startswith("refused") for line in rest)


def test_ctypes_is_refused(box):
    result = box.run("import ctypes")
    assert not result.ok and "import ctypes is not allowed" in result.stderr

"""Hostile code against the sandbox's private root: what an exec'd, unaudited program reaches by
path (Unix-domain sockets outside the run), and the environment's own dataset.

The attacker's route is the one the audit hook cannot see: `subprocess` (allowed where
RLIMIT_NPROC holds) starting a fresh interpreter, which has no audit hook, so only the kernel
(the mount namespace and its new root) stands in the way.
"""

from __future__ import annotations

import ast
import os
import socket
import stat
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from atropos.environments.code_execution import sandbox as sandbox_module
from atropos.environments.code_execution.problems import check_solution
from atropos.environments.code_execution.sandbox import Sandbox, SandboxLimits
from atropos.environments.common.data_loading import data_path

LIMITS = SandboxLimits(wall_seconds=8, cpu_seconds=4, memory_bytes=512 * 2**20)
PRIVATE_ROOT = "private root"


@pytest.fixture(scope="module")
def box():
    with Sandbox(LIMITS, max_concurrency=2) as sandbox:
        yield sandbox


def private_root(box: Sandbox) -> bool:
    return PRIVATE_ROOT in box.run("pass").isolation["filesystem"]


def can_exec(result_isolation: dict[str, str]) -> bool:
    """Whether the code may start processes (the audit hook refuses them as undropped root)."""
    return "audit hook" not in result_isolation["processes"]


class Listener:
    """A Unix-domain socket in a world-reachable directory outside any run (an SSH agent's, a
    Docker daemon's), recording what connects."""

    def __init__(self) -> None:
        self.directory = tempfile.mkdtemp(prefix="atropos-agent-")
        os.chmod(self.directory, 0o777)
        self.path = os.path.join(self.directory, "agent.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        os.chmod(self.path, 0o777)
        self.server.listen(8)
        self.server.settimeout(0.2)
        self.received: list[bytes] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    self.received.append(conn.recv(100))
                except OSError:
                    self.received.append(b"")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.server.close()
        os.unlink(self.path)
        os.rmdir(self.directory)


@pytest.fixture
def listener():
    agent = Listener()
    yield agent
    agent.close()


def connecting_program(path: str) -> str:
    """An attacker's program: an unaudited interpreter (exec'd) connects to `path`."""
    inner = (
        "import socket; s = socket.socket(socket.AF_UNIX); "
        f"s.connect({path!r}); s.sendall(b'pwned'); print('connected')"
    )
    return f"""
import os, subprocess, sys
exe = next((e for e in (sys.executable, "/usr/bin/python3") if os.access(e, os.X_OK)), "none")
r = subprocess.run([exe, "-c", {inner!r}], capture_output=True, text=True)
print("exit", r.returncode, r.stdout.strip(), r.stderr.strip().splitlines()[-1:])
"""


def test_an_exec_d_program_cannot_reach_a_unix_socket_outside_the_run(box, listener):
    if not private_root(box):
        pytest.skip("no private root here (no mount namespace): path sockets stay reachable")
    result = box.run(connecting_program(listener.path))
    assert result.ok, result.stderr
    assert "connected" not in result.stdout and "exit 0" not in result.stdout, result.stdout
    assert "FileNotFoundError" in result.stdout, result.stdout
    assert listener.received == []


def test_without_the_private_root_the_same_attack_connects(listener):
    """The control: the attack is real, and only the private root stops it."""
    with Sandbox(LIMITS, max_concurrency=1, namespaces=False) as shared:
        result = shared.run(connecting_program(listener.path))
    if not can_exec(result.isolation) or not result.ok:
        pytest.skip(f"the code may not start an interpreter here: {result.stderr[-300:]}")
    assert "exit 0 connected" in result.stdout, result.stdout
    assert listener.received == [b"pwned"]


FIND_SOCKETS = """
import os, stat
found = []
for top, dirs, files in os.walk("/", onerror=lambda e: None):
    if top == "/proc":
        dirs[:] = []
        continue
    for name in files + dirs:
        path = os.path.join(top, name)
        try:
            if stat.S_ISSOCK(os.lstat(path).st_mode):
                found.append(path)
        except OSError:
            pass
print("sockets", found)
paths = ("/run", "/var/run", "/var", "/home", "/tmp/.X11-unix")
print("absent", [p for p in paths if not os.path.lexists(p)])
print("tmp", os.listdir("/tmp"))
"""


def test_no_socket_file_is_visible_outside_the_run(box, listener):
    """The whole visible tree holds no socket at all: nothing like /var/run/docker.sock, an SSH
    agent's socket in /tmp or /tmp/.X11-unix (abstract sockets belong to the network namespace)."""
    if not private_root(box):
        pytest.skip("no private root here")
    result = box.run(FIND_SOCKETS)
    assert result.ok, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "sockets []", lines[0]
    assert lines[1] == "absent ['/run', '/var/run', '/var', '/home', '/tmp/.X11-unix']"
    # in /tmp: the run's own folder, and the path to the interpreter's link when the venv lies
    # under /tmp (a checkout in /tmp/ci: the private root holds /tmp/ci/.venv/bin/python alone)
    seen = ast.literal_eval(lines[2].removeprefix("tmp "))
    runs = [name for name in seen if name.startswith("atropos-sandbox-")]
    exe = Path(sys.executable)
    links = {exe.parts[2]} if exe.parts[1:2] == ("tmp",) else set()
    assert len(runs) == 1 and set(seen) - set(runs) <= links, seen


def dataset_files() -> list[Path]:
    return sorted(Path(str(data_path("code_execution"))).glob("*.jsonl"))


READ_DATASET = """
import os, subprocess
for path in PATHS:
    try:
        print("python", path, len(open(path).read()))
    except OSError as e:
        print("python refused", path, type(e).__name__)
    r = subprocess.run(["/bin/cat", path], capture_output=True, text=True)
    print("cat", path, r.returncode, len(r.stdout))
print("listing", os.path.exists(PACKAGE))
"""


def test_the_environments_dataset_is_unreadable_from_inside(box):
    """A solution that opens the held-out file (its absolute path known to the attacker) to copy
    another item's reference solution finds nothing, from Python or an exec'd `cat`."""
    files = dataset_files()
    assert files, "the shipped dataset is missing"
    package = str(Path(sandbox_module.__file__).resolve().parents[2])
    program = f"PATHS = {[str(f) for f in files]!r}\nPACKAGE = {package!r}\n" + READ_DATASET
    if not private_root(box):
        pytest.skip("no private root here: the dataset is as readable as its file mode says")
    result = box.run(program)
    assert result.ok, result.stderr
    for path in files:
        assert f"python refused {path} FileNotFoundError" in result.stdout, result.stdout
        assert f"cat {path} 0 " not in result.stdout
    assert "listing False" in result.stdout
    assert '"solution"' not in result.stdout and "task_id" not in result.stdout


def test_a_solution_copying_a_held_out_reference_fails(box):
    """The end-to-end attack: read test.jsonl, find this item, exec its reference solution."""
    if not private_root(box):
        pytest.skip("no private root here")
    path = str(dataset_files()[0])
    item = {
        "task_id": "t/add",
        "prompt": "",
        "tests": ["assert add(1, 2) == 3"],
        "preamble": "",
    }
    code = f"""
import json
try:
    rows = [json.loads(line) for line in open({path!r})]
except OSError:
    rows = []
def add(a, b):
    for row in rows:
        if "add" in row.get("solution", ""):
            exec(row["solution"], globals())
            return globals()["add"](a, b)
    return -1
"""
    verdict = check_solution(box, item, f"```python\n{code}\n```\n")
    assert not verdict.passed


def test_a_directory_listed_as_private_is_hidden_under_a_bound_one(box, monkeypatch):
    """A package installed under /usr (site-packages of a system Python) would be shown by the
    /usr bind: each such private directory gets an empty tmpfs over it."""
    if not private_root(box):
        pytest.skip("no private root here")
    hidden = "/usr/share" if os.path.isdir("/usr/share") else "/usr/lib"
    assert os.listdir(hidden)
    layout = sandbox_module._root_layout()
    monkeypatch.setattr(
        sandbox_module, "_root_layout", lambda: {**layout, "hide": [*layout["hide"], hidden]}
    )
    result = box.run(f"import os\nprint(os.listdir({hidden!r}))\nprint(os.listdir('/usr'))")
    assert result.ok, result.stderr
    assert result.stdout.splitlines()[0] == "[]"
    assert "bin" in result.stdout.splitlines()[1]


def test_the_private_root_still_runs_what_programs_need(box):
    """The interpreter, an exec'd interpreter and shell, the devices, /proc and the cwd."""
    if not private_root(box):
        pytest.skip("no private root here")
    program = """
import os, subprocess, sys, json, decimal, sqlite3
print(os.getcwd() == os.environ["HOME"], os.listdir("."))
open("out.txt", "w").write("kept")
print(open("/dev/urandom", "rb").read(4).__len__(), open("/dev/null", "w").write("x"))
r = subprocess.run([sys.executable, "-c", "import math; print(math.factorial(5))"],
                   capture_output=True, text=True)
print(r.returncode, r.stdout.strip())
r = subprocess.run(["/bin/sh", "-c", "echo shell; cat out.txt"], capture_output=True, text=True)
print(r.stdout.split())
print(sorted(p for p in os.listdir("/proc") if p.isdigit())[:1])
"""
    result = box.run(program)
    assert result.ok, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "True ['main.py', 'input.txt']"
    assert lines[1:4] == ["4 1", "0 120", "['shell', 'kept']"]
    assert lines[4] == "['1']"
    assert stat.S_ISDIR(os.stat("/tmp").st_mode)  # and the host's /tmp is untouched


def test_when_pivot_root_is_refused_the_run_falls_back_to_read_only_mounts(
    box, monkeypatch, tmp_path
):
    """A kernel (or a chroot) refusing `pivot_root` costs the private root, not the run: every
    mount is made read-only but the run's directory, and `isolation` says why."""
    if not private_root(box):
        pytest.skip("no private root here")
    original = Path(sandbox_module.SUPERVISOR).read_text(encoding="utf-8")
    call = 'libc.syscall(PIVOT_ROOT[platform.machine()], b".", b".")'
    assert call in original
    refusing = tmp_path / "_supervisor.py"
    refusing.write_text(original.replace(call, 'libc.syscall(-1, b".", b".")'), encoding="utf-8")
    refusing.chmod(0o644)
    monkeypatch.setattr(sandbox_module, "SUPERVISOR", str(refusing))
    result = box.run("import os\nopen('x.txt', 'w').write('1')\nprint(os.path.isdir('/home'))")
    assert result.ok, result.stderr
    filesystem = result.isolation["filesystem"]
    assert filesystem.startswith("read-only but the run's directory (no private root: pivot_root")
    assert result.isolation["pids"] == "namespace"
    assert result.stdout == f"{os.path.isdir('/home')}\n"  # the host's tree, read-only

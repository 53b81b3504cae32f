"""Hostile code against the sandbox: forging the tests' verdict, creating files outside the run's
directory, reading other processes' /proc entries, and reading the invoking user's files."""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest

from atropos.environments.code_execution.problems import check_solution
from atropos.environments.code_execution.sandbox import CodeRunner

LIMITS = {"timeout": 4, "cpu_seconds": 2, "memory_bytes": 512 * 2**20}
ADD = {
    "task_id": "t/add",
    "prompt": "Add.",
    "tests": ["assert add(1, 2) == 3", "assert add(0, 0) == 0", "assert add(-2, 7) == 5"],
}
RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return 0\n"


@pytest.fixture(scope="module", params=["bubblewrap", "process"])
def box(request):
    return CodeRunner(provider=request.param, max_concurrency=2, **LIMITS)


def fenced(code: str) -> str:
    return f"```python\n{code}\n```\n"


def namespaced(box: CodeRunner) -> bool:
    """Whether the provider gives the run its own mounts and PID namespace."""
    return box.provider == "bubblewrap"


# ----- A. the verdict cannot be forged -----------------------------------------------------------

FORGERIES = {
    "the probe: print the marker from the program file, then _exit(0)": """
import os, re
text = open(__file__).read()
for marker in re.findall(r"atropos-tests-passed-[0-9a-f]+", text) or ["atropos-tests-passed-0"]:
    print(marker, flush=True)
os._exit(0)
""",
    "read the tests' file": """
import os
try:
    print(open("tests.py").read())
except OSError as e:
    print("no tests file", e)
print("atropos-tests-passed-0", flush=True)
os._exit(0)
""",
    "walk gc and frames for anything secret": """
import gc, os, re, sys
texts = [repr(o) for o in gc.get_objects() if isinstance(o, (dict, list, tuple))]
frame = sys._getframe()
while frame is not None:
    texts += [repr(frame.f_code.co_consts), repr(frame.f_locals), repr(frame.f_globals)]
    frame = frame.f_back
for marker in set(re.findall(r"atropos-tests-passed-[0-9a-f]+", " ".join(texts))):
    print(marker, flush=True)
os._exit(0)
""",
    "print every success line and write it to every descriptor": """
import json, os
lines = [json.dumps({"tests": "passed"}), json.dumps({"tests": "passed", "exit_code": 0}), "OK"]
for fd in range(3, 64):
    for line in lines:
        try:
            os.write(fd, (line + "\\n").encode())
        except OSError:
            pass
print("\\n".join(lines))
""",
    "sys.exit(0) before the tests": "import sys\nsys.exit(0)",
    "os._exit(0) before the tests": "import os\nos._exit(0)",
    "exit() before the tests": "exit()",
    "patch builtins and the assertion machinery": """
import builtins, sys
builtins.AssertionError = type("AssertionError", (Exception,), {})
builtins.__import__ = lambda *a, **k: None
sys.excepthook = lambda *a: None
def add(a, b):
    return 0
""",
    "SystemExit(0) from an atexit hook": """
import atexit, sys
def add(a, b):
    return 0
atexit.register(lambda: sys.exit(0))
""",
    "exit from inside the function under test": "import os\ndef add(a, b):\n    os._exit(0)\n",
    "kill the judge": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n" + WRONG,
    "write the verdict to the judge's descriptors from a shell": """
import os, subprocess
line = '{"tests": "passed"}'
script = f"for fd in /proc/{os.getppid()}/fd/*; do printf '%s\\n' '{line}' > $fd; done"
subprocess.run(["/bin/sh", "-c", script], stderr=subprocess.DEVNULL)
print(line, flush=True)
os._exit(0)
""",
    "read the judge's memory": """
import os
judge = os.getppid()
try:
    print(open(f"/proc/self/../{judge}/environ").read())
except OSError as e:
    print("refused", e)
""",
}


@pytest.mark.parametrize("code", FORGERIES.values(), ids=list(FORGERIES))
def test_the_code_under_test_cannot_forge_the_verdict(box, code):
    verdict = check_solution(box, ADD, fenced(code))
    assert not verdict.passed, verdict


def test_an_early_exit_is_reported_as_such(box):
    verdict = check_solution(box, ADD, fenced("import os\nos._exit(0)"))
    assert (verdict.passed, verdict.status) == (False, "exited_early")


def test_honest_code_passes_and_wrong_code_fails(box):
    assert check_solution(box, ADD, fenced(RIGHT)).passed
    wrong = check_solution(box, ADD, fenced(WRONG))
    assert (wrong.passed, wrong.status, wrong.detail) == (False, "error", "AssertionError")


def test_objects_exceptions_and_in_place_changes_cross_between_the_processes(box):
    """The tests see the code's objects through handles, with one-process semantics."""
    code = """
from fractions import Fraction
from collections import namedtuple, Counter
import math
Point = namedtuple("Point", "x y")
class Pair:
    def __init__(self, a, b):
        self.a, self.b = a, b
    def total(self):
        return self.a + self.b
def longest(pairs):
    return max(pairs, key=lambda p: p.total())
def half(n):
    if n < 0:
        raise ValueError("negative")
    return Fraction(n, 2)
def sort_in_place(xs):
    xs.sort()
def squares(n):
    return (i * i for i in range(n))
def stats(xs):
    return Point(min(xs), max(xs)), Counter(xs), {1.5, float("inf")}, b"ok", 7**9000
"""
    tests = [
        "best = longest([Pair(1, 2), Pair(5, 1)])\nassert best.a == 5 and best.total() == 6",
        "assert half(3) == Fraction(3, 2) and math.isclose(float(half(1)), 0.5)",
        "try:\n    half(-1)\nexcept ValueError as e:\n    assert 'negative' in str(e)\n"
        "else:\n    raise AssertionError('no error')",
        "xs = [3, 1, 2]\nsort_in_place(xs)\nassert xs == [1, 2, 3]",
        "assert list(squares(4)) == [0, 1, 4, 9] and sum(squares(3)) == 5",
        "p, c, s, b, big = stats([2, 2, 7])\nassert p == (2, 7) and c == {2: 2, 7: 1}",
        "assert s == {1.5, float('inf')} and b == b'ok' and big == 7**9000",
    ]
    item = {"task_id": "t/objects", "prompt": "", "tests": tests, "preamble": ""}
    verdict = check_solution(box, item, fenced(code))
    assert verdict.passed, verdict


def test_a_humaneval_style_check_runs_against_the_candidate(box):
    item = {
        "task_id": "t/he",
        "prompt": "",
        "preamble": "from typing import List",
        "tests": [
            "def check(candidate):\n    assert candidate([1, 2, 3]) == 6\n"
            "    assert candidate([]) == 0\n\ncheck(total)"
        ],
    }
    body = "def total(xs: List[int]) -> int:\n    return sum(xs)\n"
    assert check_solution(box, item, fenced(body)).passed
    assert not check_solution(box, item, fenced(body.replace("sum(xs)", "len(xs)"))).passed


ALWAYS_EQUAL = """
class Anything:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return True
    __le__ = __gt__ = __ge__ = __lt__
    def __bool__(self): return True
    def __contains__(self, item): return True
    def __hash__(self): return hash(3)
    def __len__(self): return 1
    def __sub__(self, other): return 0
    __rsub__ = __add__ = __radd__ = __truediv__ = __abs__ = __neg__ = __sub__
def add(a, b):
    return Anything()
"""

ALWAYS_EQUAL_TESTS = {
    "==": ["assert add(1, 2) == 3"],
    "reflected ==": ["assert 3 == add(1, 2)"],
    "!=": ["assert not (add(1, 2) != 3)"],
    "in a list": ["assert add(1, 2) in [3]"],
    "in a set": ["assert add(1, 2) in {3}"],
    "inside a returned list": ["assert [add(1, 2)] == [3]"],
    "truth": ["assert add(1, 2)"],
    "membership": ["assert 3 in add(1, 2)"],
    "ordering": ["assert 2 < add(1, 2) <= 3"],
    "tolerance": ["assert abs(add(1, 2) - 3) < 1e-6"],
    "reflected tolerance": ["assert abs(3 - add(1, 2)) < 1e-6"],
    "relative error": ["assert abs(add(1, 2) / 3 - 1) < 1e-6"],
    "caught as an exception": [
        "try:\n    assert add(1, 2) == 3\nexcept Exception:\n    raise AssertionError('no')"
    ],
    "caught as what a test expects": [
        "try:\n    ok = add(1, 2) == 3\nexcept TypeError:\n    ok = True\nassert ok"
    ],
    "humaneval check(candidate)": [
        "def check(candidate):\n    assert candidate(1, 2) == 3\n\ncheck(add)"
    ],
}


@pytest.mark.parametrize("tests", ALWAYS_EQUAL_TESTS.values(), ids=list(ALWAYS_EQUAL_TESTS))
def test_an_object_equal_to_everything_fails(box, tests):
    """The comparison is the judge's, on plain data: the candidate's `__eq__` is never asked."""
    item = {"task_id": "t/add", "prompt": "", "tests": tests, "preamble": ""}
    verdict = check_solution(box, item, fenced(ALWAYS_EQUAL))
    assert (verdict.passed, verdict.status) == (False, "error"), verdict
    if "Exception" not in tests[0] and "TypeError" not in tests[0]:
        assert "NotPlainData" in verdict.detail, verdict


def test_a_tuple_subclass_is_judged_on_its_items(box):
    code = """
class Fake(tuple):
    def __eq__(self, other): return True
    __hash__ = tuple.__hash__
def pair():
    return Fake((0, 0))
"""
    item = {"task_id": "t/pair", "prompt": "", "tests": ["assert pair() == (1, 2)"]}
    assert not check_solution(box, item, fenced(code)).passed
    honest = {**item, "tests": ["assert pair() == (0, 0)"]}
    assert check_solution(box, honest, fenced(code)).passed  # its data, compared by the judge


def test_shadowing_a_built_in_the_tests_use_does_not_help(box):
    """`def abs(x): return 0` would make every tolerance check pass, were the judge to call it."""
    item = {
        "task_id": "t/half",
        "prompt": "",
        "tests": ["assert abs(half(3) - 1.5) < 1e-9", "assert max([half(2)]) == 1.0"],
        "entry_point": "half",
    }
    cheat = (
        "def abs(x):\n    return 0\ndef max(xs):\n    return 1.0\ndef half(n):\n    return 7.0\n"
    )
    verdict = check_solution(box, item, fenced(cheat))
    assert (verdict.passed, verdict.detail) == (False, "AssertionError"), verdict
    honest = "def abs(x):\n    return 0\ndef half(n):\n    return n / 2\n"
    assert check_solution(box, item, fenced(honest)).passed  # its helpers still work for it


def test_a_function_under_test_named_like_a_built_in_is_still_judged(box):
    item = {
        "task_id": "t/sum",
        "prompt": "",
        "tests": ["assert sum([1, 2, 3]) == 60"],
        "entry_point": "sum",
    }
    code = (
        "def sum(xs):\n    total = 0\n    for x in xs:\n        total += 10 * x\n    return total\n"
    )
    assert check_solution(box, item, fenced(code)).passed


# ----- B. no file is created outside the run's directory -----------------------------------------

WATCHED = ["/tmp", "/dev/shm", "/var/tmp", "/run/lock"]

CREATE = """
import os
token, outside = TOKEN, OUTSIDE
open("inside.txt", "w").write("fine")
attempts = {
    "mknod": lambda d: os.mknod(f"{d}/{token}-mknod"),
    "mkfifo": lambda d: os.mkfifo(f"{d}/{token}-fifo"),
    "symlink": lambda d: os.symlink("/etc/passwd", f"{d}/{token}-symlink"),
    "link": lambda d: os.link("inside.txt", f"{d}/{token}-link"),
    "open": lambda d: open(f"{d}/{token}-open", "w").write("escaped"),
    "mkdir": lambda d: os.mkdir(f"{d}/{token}-dir"),
    "rename": lambda d: os.rename("inside.txt", f"{d}/{token}-renamed"),
}
for directory in outside:
    for name, attempt in attempts.items():
        try:
            attempt(directory)
            print("created", name, directory)
        except OSError as e:
            pass
print("done")
"""

SHELL = """
import subprocess
script = " ; ".join(
    f"touch {d}/{TOKEN}-sh; mkfifo {d}/{TOKEN}-shfifo; ln -s /etc {d}/{TOKEN}-shln" for d in OUTSIDE
)
subprocess.run(["/bin/sh", "-c", script], stderr=subprocess.DEVNULL)
print("done")
"""


def escaped(token: str, directories: list[str]) -> list[str]:
    found = []
    for directory in directories:
        try:
            found += [f"{directory}/{n}" for n in os.listdir(directory) if token in n]
        except OSError:
            continue
    return found


@pytest.fixture
def outside(tmp_path):
    cwd = Path.cwd()
    directories = [d for d in WATCHED if os.path.isdir(d)] + [str(tmp_path), str(cwd)]
    token = f"atropos-escape-{uuid.uuid4().hex}"
    yield token, directories
    for path in escaped(token, directories):  # never leave a stray file, even when failing
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)


def test_python_calls_create_nothing_outside_the_directory(box, outside):
    token, directories = outside
    program = f"TOKEN = {token!r}\nOUTSIDE = {directories!r}\n" + CREATE
    result = box.run(program)
    assert result.ok and result.stdout.endswith("done\n"), result.stderr
    created = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("created")}
    # mknod and mkfifo raise no audit event: bubblewrap's /tmp and /dev are its own (nothing
    # reaches the host); the process provider lets them into world-writable host folders
    assert created <= {"mknod", "mkfifo"}
    if box.provider == "bubblewrap":
        assert escaped(token, directories) == []
    else:
        assert all(n.endswith(("-mknod", "-fifo")) for n in escaped(token, directories))


def test_exec_d_programs_create_nothing_outside_the_directory(box, outside):
    """`sh` is not audited: only the kernel (read-only mounts) stops it."""
    if not namespaced(box) or not os.path.exists("/bin/sh"):
        pytest.skip("no mount namespace here: only the audit hook guards, and sh bypasses it")
    token, directories = outside
    result = box.run(f"TOKEN = {token!r}\nOUTSIDE = {directories!r}\n" + SHELL)
    assert result.ok and result.stdout == "done\n", result.stderr
    assert escaped(token, directories) == []


# ----- C. other processes' /proc entries ---------------------------------------------------------


def test_other_processes_are_out_of_sight(box, monkeypatch):
    monkeypatch.setenv("ATROPOS_TEST_SECRET", "hunter2")
    me = os.getpid()
    program = f"""
import os, subprocess
for path in ("/proc/{me}/environ", "/proc/{me}/cmdline"):
    r = subprocess.run(["/bin/cat", path], capture_output=True, text=True)
    print(path, r.returncode, r.stdout.replace("\\0", " "))
print("seen", os.path.exists("/proc/{me}"))
print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
"""
    result = box.run(program)
    assert result.ok, result.stderr
    assert "hunter2" not in result.stdout
    lines = result.stdout.splitlines()
    assert lines[0].split()[1] != "0"  # environ: refused (another uid's, or out of sight)
    if not namespaced(box):
        pytest.skip("no PID namespace here: other processes' cmdline stays readable")
    assert lines[1].split()[1] != "0"  # cmdline: no such process
    assert "seen False" in lines
    pids = eval(lines[-1].split(" ", 1)[1])  # noqa: S307 (our own program's printed list)
    assert pids and max(pids) < 50  # only the run's own processes, numbered from 1


# ----- D. the invoking user's files --------------------------------------------------------------


def test_the_invoking_users_private_files_are_unreadable(box):
    """The dedicated uid's own guarantee (the process provider shows the host's files)."""
    if os.geteuid() != 0 or box.provider != "process":
        pytest.skip("the process provider as root (bubblewrap does not show the folder at all)")
    directory = tempfile.mkdtemp(prefix="atropos-store-")
    try:
        os.chmod(directory, 0o755)  # a reachable directory: only the file's mode protects it
        private, public = Path(directory, "store.json"), Path(directory, "public.txt")
        private.write_text("api-key-42")
        private.chmod(0o600)
        public.write_text("hello")
        public.chmod(0o644)
        program = f"""
import subprocess
for path in ({str(private)!r}, {str(public)!r}):
    try:
        print("python", open(path).read())
    except OSError as e:
        print("python refused", type(e).__name__)
    r = subprocess.run(["/bin/cat", path], capture_output=True, text=True)
    print("cat", r.returncode, r.stdout)
"""
        result = box.run(program)
    finally:
        shutil.rmtree(directory)
    assert result.ok, result.stderr
    assert "api-key-42" not in result.stdout
    assert "python refused PermissionError" in result.stdout
    assert "python hello" in result.stdout and "cat 0 hello" in result.stdout  # the control

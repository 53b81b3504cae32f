"""Project rules a green run must keep: module size, docstrings, light imports, CI, the lock."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "src" / "atropos").rglob("*.py"))
MAX_LINES = 800  # STYLE P1: split by concept past this


def test_modules_stay_small():
    big = {p.name: n for p in SOURCES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"


def test_every_module_opens_with_a_docstring():
    missing = [
        str(p.relative_to(ROOT)) for p in SOURCES if not ast.get_docstring(ast.parse(p.read_text()))
    ]
    assert not missing


def test_importing_atropos_pulls_in_nothing_heavy():
    code = (
        "import sys, atropos, atropos.api, atropos.wire; "
        "heavy = {'torch', 'transformers', 'numpy', 'wandb'} & set(sys.modules); "
        "print(sorted(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_ci_runs_exactly_make_test():
    script = (ROOT / ".ci" / "run").read_text()
    commands = [
        line for line in script.splitlines() if line and not line.startswith(("#", "set ", "cd "))
    ]
    assert commands == ["make test"]


def _lock_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            pins[canonicalize_name(name)] = version
    return pins


def test_the_lock_pins_every_requirement_make_test_installs_within_its_range():
    """A requirement added to pyproject.toml without `make lock` would install unpinned."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    makefile = (ROOT / "Makefile").read_text()
    extras = re.search(r"^EXTRAS := (\S+)$", makefile, re.MULTILINE)
    assert extras, "the Makefile names the extras `make test` installs as EXTRAS := a,b"
    wanted = [Requirement(r) for r in project["dependencies"]]
    for extra in extras.group(1).split(","):
        wanted += [Requirement(r) for r in project["optional-dependencies"][extra]]
    # `make lock` and `make test-latest` point this at the lock they are about to write
    locks = Path(os.environ.get("ATROPOS_LOCK_DIR") or ROOT / "requirements")
    problems = _unpinned(wanted, locks / "lock.txt")
    assert not problems, "run `make lock`: " + "; ".join(problems)


def _unpinned(wanted: list[Requirement], lock: Path) -> list[str]:
    """The requirements `lock` does not pin, or pins outside their range."""
    pins = _lock_pins(lock)
    problems = []
    for req in wanted:
        if req.marker is not None and not req.marker.evaluate():
            continue
        version = pins.get(canonicalize_name(req.name))
        if version is None:
            problems.append(f"{req.name}: not in requirements/{lock.name}")
        elif not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req.name}=={version} is outside {req}")
    return problems


def test_the_verifiers_lock_pins_the_core_and_the_verifiers_extra_within_range():
    """The verifiers venv (scripts/upstream_venv.py verifiers) installs from its own lock."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    wanted += [Requirement(r) for r in project["optional-dependencies"]["verifiers"]]
    locks = Path(os.environ.get("ATROPOS_LOCK_DIR") or ROOT / "requirements")
    problems = _unpinned([*wanted, Requirement("uv")], locks / "verifiers.txt")
    assert not problems, "run `make lock`: " + "; ".join(problems)


def test_every_install_goes_through_the_lock():
    makefile = (ROOT / "Makefile").read_text()
    installs = [line for line in makefile.splitlines() if "pip install" in line]
    own_lock = ("$(PIN)", "PIP_CONSTRAINT=$(INTEROP_LOCK)")  # a venv of its own: its own lock
    assert installs and all(line.strip().startswith(own_lock) for line in installs), installs
    assert re.search(r"^LOCK \?= requirements/lock.txt$", makefile, re.MULTILINE)

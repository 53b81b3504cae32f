"""Project rules a green run must keep: module size, docstrings, light imports, CI entry."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

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

"""No function in `src/atropos` runs past 60 lines unless its docstring says why.

A long function is split where the parts read better on their own; one that reads better whole
(a table of flags, a loop whose steps share many locals) keeps its length and says so with a
docstring line starting `Long because`.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src" / "atropos"
MAX_LINES = 60
REASON = "Long because"


def long_functions() -> list[str]:
    """`path:line name (N lines)` for every function over MAX_LINES without a stated reason."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            lines = (node.end_lineno or node.lineno) - node.lineno + 1
            if lines <= MAX_LINES:
                continue
            if REASON not in (ast.get_docstring(node) or ""):
                found.append(f"{relative}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_is_long_without_a_reason() -> None:
    found = long_functions()
    assert not found, (
        f"functions over {MAX_LINES} lines: split them, or say in the docstring why one reads"
        f" better whole ('{REASON} ...'): " + "; ".join(found)
    )

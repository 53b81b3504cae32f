"""SEARCH/REPLACE edit blocks for `swe_patch`: reading them, applying them to a file, and how
close the result comes to the oracle's.

A block is a line `<<<<<<< SEARCH`, the lines to find, a line `=======`, the lines to put in
their place, and a line `>>>>>>> REPLACE`; the line before it may name the file (code fences
around blocks are passed over).

Blocks apply in order, each to the file as the blocks before it left it; a block applies when
its SEARCH text is not blank and occurs exactly once (whitespace and all), and names the task's
file or none. The reward compares results, not patches: 1.0 when the file comes out as the
oracle's does, else difflib's ratio between the two changes (the lines each one removes and
adds, against the original), and 0.0 for no blocks, a malformed or unappliable one, or no
change.

>>> code = "a = 1\\nb = 2\\n"
>>> edits = read_edits("<<<<<<< SEARCH\\nb = 2\\n=======\\nb = 3\\n>>>>>>> REPLACE")
>>> apply_edits(code, edits, "x.py")
'a = 1\\nb = 3\\n'
>>> similarity(code, "a = 1\\nb = 3\\n", "a = 1\\nb = 3\\n"), similarity(code, code, "a = 2\\n")
(1.0, 0.0)
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

__all__ = [
    "DIVIDER",
    "REPLACE",
    "SEARCH",
    "Edit",
    "Outcome",
    "apply_edits",
    "changes",
    "judge_edits",
    "read_edits",
    "similarity",
]

SEARCH, DIVIDER, REPLACE = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"


@dataclass(frozen=True)
class Edit:
    """One SEARCH/REPLACE block: the path it names (None: none), what it finds, what it puts."""

    path: str | None
    search: str
    replace: str


def _path_before(lines: list[str], index: int) -> str | None:
    """The path named on the line before a block (code fences passed over), if any."""
    for line in reversed(lines[:index]):
        text = line.strip()
        if text.startswith("```"):
            continue
        looks_like_a_path = re.fullmatch(r"[\w./\\-]+", text) and re.search(r"[./]", text)
        return text if looks_like_a_path else None
    return None


def read_edits(text: str) -> list[Edit] | None:
    """The blocks of `text`, in order ([] for none); None when a block is not closed."""
    lines = text.splitlines(keepends=True)
    markers = [line.rstrip() for line in lines]
    edits, at = [], 0
    while at < len(lines):
        if markers[at] != SEARCH:
            at += 1
            continue
        try:
            divider = markers.index(DIVIDER, at + 1)
            end = markers.index(REPLACE, divider + 1)
        except ValueError:
            return None
        if SEARCH in markers[at + 1 : end]:
            return None
        search, replace = "".join(lines[at + 1 : divider]), "".join(lines[divider + 1 : end])
        edits.append(Edit(_path_before(lines, at), search, replace))
        at = end + 1
    return edits


def _same_file(named: str, path: str) -> bool:
    named = named.removeprefix("./")
    return named == path or named.endswith("/" + path)


def apply_edits(code: str, edits: list[Edit], path: str) -> str | None:
    """`code` after `edits`, or None when one of them does not apply."""
    for edit in edits:
        if edit.path is not None and not _same_file(edit.path, path):
            return None
        if not edit.search.strip() or code.count(edit.search) != 1:
            return None
        code = code.replace(edit.search, edit.replace, 1)
    return code


def changes(before: str, after: str) -> list[str]:
    """The lines `after` removes (`-`) from and adds (`+`) to `before`, in order."""
    diff = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]


def similarity(original: str, result: str, oracle: str) -> float:
    """How close `result` comes to `oracle`, both made from `original`: 1.0 when equal, else
    the ratio of their changes (0.0 when `result` changes nothing)."""
    if result == oracle:
        return 1.0
    mine, gold = changes(original, result), changes(original, oracle)
    if not mine:
        return 0.0
    return difflib.SequenceMatcher(None, "\n".join(mine), "\n".join(gold), autojunk=False).ratio()


@dataclass(frozen=True)
class Outcome:
    """One answer judged: `status` is "exact", "applied", "unchanged", "unappliable",
    "malformed" or "no_edits"; `score` the reward."""

    status: str
    score: float


def judge_edits(text: str | None, code: str, path: str, oracle: str) -> Outcome:
    """The outcome of the edits in `text` (None: no answer) on `code`, against `oracle`."""
    edits = None if text is None else read_edits(text)
    if edits is None:
        return Outcome("malformed" if text is not None else "no_edits", 0.0)
    if not edits:
        return Outcome("no_edits", 0.0)
    result = apply_edits(code, edits, path)
    if result is None:
        return Outcome("unappliable", 0.0)
    if result == code:
        return Outcome("unchanged", 0.0)
    return Outcome("exact" if result == oracle else "applied", similarity(code, result, oracle))

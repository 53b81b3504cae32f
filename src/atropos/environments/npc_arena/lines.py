"""Player lines for NPC Arena: rows from the shipped JSONL, a JSONL file, or a hub dataset.

A row holds the player's line (`line`) and, optionally, the key of the one character it is
meant for (`character`, a sheet's file stem). A line for no particular character becomes one
item per character; a line for a character that is not loaded is skipped (and logged, with a
"did you mean" when the key looks like a typo).

>>> to_items([{"line": "Hi!"}, {"line": "Sing!", "character": "lyra"}], ["kaelen", "lyra"])
[{'character': 'kaelen', 'line': 'Hi!'}, {'character': 'lyra', 'line': 'Hi!'}, \
{'character': 'lyra', 'line': 'Sing!'}]
"""

from __future__ import annotations

import difflib
import logging
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from atropos.environments.common.data_loading import data_path, load_hub, read_jsonl

__all__ = ["load_rows", "to_items"]

log = logging.getLogger("atropos.env.npc_arena")


def load_rows(
    path: str | Path | None = None, dataset: str | None = None, split: str = "train"
) -> tuple[list[dict[str, Any]], str]:
    """(rows, where they came from): the hub `dataset` when named, else the JSONL file at `path`,
    else the shipped player lines."""
    if dataset:
        return load_hub(dataset, split), f"{dataset} ({split})"
    file = Path(path) if path else data_path("npc_arena", "player_lines.jsonl")
    if not file.is_file():
        raise ValueError(f"{file}: no such player lines file (JSONL, one {{'line': ...}} per row)")
    return read_jsonl(file), str(file)


def to_items(
    rows: Sequence[Mapping[str, Any]],
    characters: Collection[str],
    where: str = "player lines",
    line_field: str = "line",
    character_field: str = "character",
) -> list[dict[str, str]]:
    """One item (`character`, `line`) per row and addressed character; rows for unknown
    characters are skipped and logged.

    Raises:
        ValueError: a row has no line text, or no item is left (the message says where).
    """
    items: list[dict[str, str]] = []
    unknown: Counter[str] = Counter()
    for n, row in enumerate(rows, 1):
        line = row.get(line_field)
        if not isinstance(line, str) or not line.strip():
            raise ValueError(f"{where} row {n}: expected a non-empty string in {line_field!r}")
        key = row.get(character_field)
        if key in (None, ""):
            items.extend({"character": c, "line": line.strip()} for c in characters)
        elif str(key) in characters:
            items.append({"character": str(key), "line": line.strip()})
        else:
            unknown[str(key)] += 1
    if unknown:
        notes = []
        for key, count in sorted(unknown.items()):
            near = difflib.get_close_matches(key, list(characters), n=1)
            notes.append(f"{key!r} x{count}" + (f" (did you mean {near[0]!r}?)" if near else ""))
        log.warning("%s: skipped lines for characters not loaded: %s", where, ", ".join(notes))
    if not items:
        raise ValueError(
            f"{where}: no usable player lines for the characters loaded ({', '.join(characters)})"
        )
    return items

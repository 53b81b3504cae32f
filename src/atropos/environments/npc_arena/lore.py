"""World lore for NPC Arena: documents on disk, game events from a tailed file, one index.

Lore documents are markdown files (each `## Title` section is one entry) or JSONL rows
(`{"title": ..., "text": ...}`) in a directory. Game events arrive while the environment runs:
the game appends JSON lines to an events file (`{"text": ..., "title": ...}` or a JSON string),
and every `LoreIndex.lookup` first reads what was appended since the last one, so an event is
retrievable by the very next item. A line without its newline yet is left for the next read; a
file that shrinks or is replaced is read again from its start.

>>> split_markdown("# World\\n\\n## Greywater\\nA rainy port.\\n\\n## Millford\\nA village.\\n")
[('Greywater', 'A rainy port.'), ('Millford', 'A village.')]
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from atropos.environments.common.data_loading import read_jsonl
from atropos.environments.common.retrieval import LoreDoc, Retriever

__all__ = ["EventFeed", "LoreIndex", "load_lore", "split_markdown"]

log = logging.getLogger("atropos.env.npc_arena")


def split_markdown(text: str) -> list[tuple[str, str]]:
    """(title, text) per `## ` section of a markdown document; other headings end a section."""
    entries: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            entries.append((line[3:].strip(), []))
        elif line.startswith("#"):
            entries.append(("", []))  # a section we do not index
        elif entries:
            entries[-1][1].append(line.strip())
    return [(title, " ".join(" ".join(body).split())) for title, body in entries if title]


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def load_lore(directory: str | Path) -> list[LoreDoc]:
    """Every entry of the `*.md` and `*.jsonl` files in `directory`, files in name order.

    Raises:
        ValueError: the directory is missing or has no entry, or an entry has no text (the
            message names the file and the entry).
    """
    folder = Path(directory)
    if not folder.is_dir():
        raise ValueError(f"{folder}: no such directory of lore documents")
    docs: list[LoreDoc] = []
    for file in sorted(folder.iterdir()):
        if file.suffix == ".md":
            for title, body in split_markdown(file.read_text(encoding="utf-8")):
                if not body:
                    raise ValueError(f"{file}: the entry {title!r} has no text")
                docs.append(LoreDoc(f"{file.stem}/{_slug(title)}", title, body))
        elif file.suffix == ".jsonl":
            for n, row in enumerate(read_jsonl(file), 1):
                name, text = row.get("title"), row.get("text")
                if not isinstance(name, str) or not isinstance(text, str) or not text.strip():
                    raise ValueError(f"{file}:{n}: a lore row needs 'title' and 'text' strings")
                docs.append(LoreDoc(str(row.get("id") or f"{file.stem}/{n}"), name, text.strip()))
    if not docs:
        raise ValueError(f"{folder}: no lore entries (## sections in *.md, rows in *.jsonl)")
    return docs


class EventFeed:
    """Tails a JSONL file of game events; `poll()` returns the events appended since last time.

    The file need not exist yet. Malformed lines are skipped, logged and counted (`bad`).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.read = 0  # events returned so far
        self.bad = 0
        self._offset = 0
        self._line = 0
        self._inode: int | None = None

    def poll(self) -> list[LoreDoc]:
        """The complete lines appended since the last poll, as event documents."""
        try:
            stat = os.stat(self.path)
        except FileNotFoundError:
            return []
        if self._inode is not None and (stat.st_ino != self._inode or stat.st_size < self._offset):
            log.warning("events file %s was replaced or truncated: reading it again", self.path)
            self._offset = self._line = 0
        self._inode = stat.st_ino
        if stat.st_size <= self._offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read(stat.st_size - self._offset)
        end = data.rfind(b"\n")
        if end < 0:
            return []  # the game is still writing this line
        self._offset += end + 1
        events = []
        for raw in data[:end].split(b"\n"):
            self._line += 1
            if raw.strip():
                event = self._parse(raw)
                if event is not None:
                    events.append(event)
        return events

    def _parse(self, raw: bytes) -> LoreDoc | None:
        try:
            row = json.loads(raw)
        except ValueError:
            row = None
        if isinstance(row, str):
            row = {"text": row}
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("text"), str)
            or not row["text"].strip()
        ):
            self.bad += 1
            where = f"{self.path}:{self._line}"
            log.warning("%s: skipped: an event is a JSON string or an object with 'text'", where)
            return None
        text = row["text"].strip()
        self.read += 1
        title = row.get("title")
        event_id = row.get("id") or f"event/{self.read}"
        return LoreDoc(str(event_id), str(title) if title else "Event", text, "event")


class LoreIndex:
    """Lore documents and game events behind one retriever.

    Args:
        retriever: where documents are indexed (`retrieval.make_retriever`).
        docs: the lore documents.
        feed: the game's events file, read on every lookup (None: no events).
    """

    def __init__(
        self, retriever: Retriever, docs: list[LoreDoc], feed: EventFeed | None = None
    ) -> None:
        self.retriever = retriever
        self.feed = feed
        self.events: list[LoreDoc] = []
        retriever.add(docs)
        self.refresh()

    def refresh(self) -> int:
        """Index the events appended since the last refresh; how many there were."""
        if self.feed is None:
            return 0
        new = self.feed.poll()
        if new:
            self.retriever.add(new)
            self.events.extend(new)
        return len(new)

    def lookup(self, query: str, k: int, recent: int = 0) -> list[LoreDoc]:
        """The `k` documents best matching `query` (events included), then the `recent` latest
        events not already among them (newest first)."""
        self.refresh()
        found = [doc for doc, _ in self.retriever.search(query, k)]
        for event in reversed(self.events[-recent:] if recent > 0 else []):
            if event not in found:
                found.append(event)
        return found

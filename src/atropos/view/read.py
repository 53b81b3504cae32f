"""Reading groups for the page: JSONL files (bad lines counted, never fatal) and API records.

A line is a group when it is a JSON object with a `scores` list and a `tokens` or `messages`
list; a line holding a JSON list of such objects gives each of them. Anything else (invalid
JSON, another value, a group without scores) is a bad line: counted, and the first few are
kept with their line number and reason for the page's banner.

>>> import io
>>> lines = io.StringIO('{"tokens": [[1]], "masks": [[1]], "scores": [1]}\\nnot json\\n\\n[1]\\n')
>>> found = Collection(limit=10)
>>> found.add_lines("run.jsonl", lines)
>>> len(found.entries), found.bad, [b.reason for b in found.bad_examples]
(1, 2, ['invalid JSON', 'not a group: a list of something else'])
>>> found.entries[0].where
'run.jsonl:1'
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

BAD_EXAMPLES = 20
"""How many bad lines the page lists (all are counted)."""


@dataclass
class Entry:
    """One group and where it came from."""

    group: dict[str, Any]
    source: str  # a file name, or the API's URL
    where: str  # "file:line", or "seq N"
    received: float | None = None  # the API's acceptance time (seconds since the epoch)
    shown: dict[str, Any] | None = None  # what the page shows, when prepared as it was read


@dataclass
class BadLine:
    """A line that is no group."""

    source: str
    line: int
    reason: str


@dataclass
class Source:
    """What one file (or API) gave."""

    name: str
    groups: int = 0
    bad: int = 0


@dataclass
class Collection:
    """The groups for one page, at most `limit` of them.

    With `prepare`, each group is turned into what the page shows as it is added and the raw
    group is dropped: a page of 2,000 groups of 8 x 512 tokens then holds one raw line at a
    time instead of every token id as a Python int (benchmarks/view_page.py).
    """

    limit: int
    prepare: Callable[[Entry], dict[str, Any]] | None = field(default=None, repr=False)
    entries: list[Entry] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    bad: int = 0
    bad_examples: list[BadLine] = field(default_factory=list)
    unread: int = 0  # non-blank lines left unread once `limit` groups were found
    notes: list[str] = field(default_factory=list)

    @property
    def full(self) -> bool:
        return len(self.entries) >= self.limit

    def add_file(self, path: Path) -> None:
        """Read `path` (`.gz` is decompressed). An unreadable file is one bad entry."""
        try:
            with _open(path) as f:
                self.add_lines(path.name, f)
        except (OSError, EOFError, UnicodeDecodeError) as err:
            self._source(path.name)
            self._bad(path.name, 0, f"unreadable: {type(err).__name__}: {err}")

    def add_lines(self, name: str, lines: Iterable[str]) -> None:
        """Add the groups of these JSONL lines, read as source `name`."""
        self._source(name)
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            if self.full:
                self.unread += 1
                continue
            try:
                value = json.loads(line)
            except ValueError:
                self._bad(name, number, "invalid JSON")
                continue
            groups, reason = _groups_of(value)
            if reason:
                self._bad(name, number, reason)
                continue
            for k, group in enumerate(groups):
                where = f"{name}:{number}" + (f"[{k}]" if len(groups) > 1 else "")
                self.add(Entry(group, name, where))

    def add(self, entry: Entry) -> None:
        """Add one group (dropped, and counted as unread, once the collection is full)."""
        if self.full:
            self.unread += 1
            return
        if self.prepare is not None:
            entry.shown, entry.group = self.prepare(entry), {}
        self.entries.append(entry)
        self._source(entry.source).groups += 1

    def _source(self, name: str) -> Source:
        for s in self.sources:
            if s.name == name:
                return s
        self.sources.append(Source(name))
        return self.sources[-1]

    def _bad(self, name: str, line: int, reason: str) -> None:
        self.bad += 1
        self._source(name).bad += 1
        if len(self.bad_examples) < BAD_EXAMPLES:
            self.bad_examples.append(BadLine(name, line, reason))


def _open(path: Path) -> IO[str]:
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def group_problem(value: Any) -> str | None:
    """Why `value` is no group for the page, or None when it is one.

    >>> group_problem({"tokens": [[1, 2]], "scores": [0.5]}) is None
    True
    >>> group_problem({"tokens": [[1, 2]]})
    'not a group: no scores list'
    >>> group_problem({"messages": [], "scores": "high"})
    'not a group: no scores list'
    """
    if not isinstance(value, dict):
        return f"not a group: {_kind(value)}"
    if not isinstance(value.get("scores"), list):
        return "not a group: no scores list"
    if not isinstance(value.get("tokens"), list) and not isinstance(value.get("messages"), list):
        return "not a group: neither tokens nor messages"
    return None


def _groups_of(value: Any) -> tuple[list[dict[str, Any]], str | None]:
    if isinstance(value, list) and value:
        if all(group_problem(v) is None for v in value):
            return value, None
        return [], "not a group: a list of something else"
    problem = group_problem(value)
    return ([value], None) if problem is None else ([], problem)


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "a number"
    return names.get(type(value), type(value).__name__)


def recorded_tokenizer(jsonl: Path) -> str | None:
    """The tokenizer the run that wrote `jsonl` used, as process mode records it: `env:
    tokenizer_name` in `<stem>.config.yaml` beside it; None without that file or name.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> _ = (d / "run.config.yaml").write_text("env:\\n  tokenizer_name: tiny\\n")
    >>> recorded_tokenizer(d / "run.jsonl"), recorded_tokenizer(d / "other.jsonl")
    ('tiny', None)
    """
    import yaml

    config = Path(jsonl).with_suffix(".config.yaml")
    try:
        doc = yaml.safe_load(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    env = doc.get("env") if isinstance(doc, dict) else None
    name = env.get("tokenizer_name") if isinstance(env, dict) else None
    return name if isinstance(name, str) and name else None

"""The rollout viewer: one self-contained HTML page of scored groups.

`atropos view FILE.jsonl ...` and `view-run` (groups read from a running API) both come here,
and so does process mode's page beside its JSONL. The page carries its data as escaped JSON
and builds everything with `textContent`: model text is always shown as text (atroposlib 0.4.0
rendered completions as unsanitised markdown, so model output could run script in the page).
Search, filters and sorting run in the page's own script; nothing is fetched.

Modules: `read` (JSONL and API records into a `Collection`, bad lines counted), `data` (each
group reduced to what the page shows), `tokens` (token pieces and mask runs for the
trained-token highlighting), `page` (the HTML), `live` (the API's read-only `/rollouts`).

>>> import json, tempfile
>>> from pathlib import Path
>>> d = Path(tempfile.mkdtemp())
>>> group = {"tokens": [[1, 2]], "masks": [[-100, 2]], "scores": [1.0],
...          "messages": [[{"role": "assistant", "content": "<b>hi</b>"}]]}
>>> _ = (d / "run.jsonl").write_text(json.dumps(group) + "\\nnot json\\n")
>>> out = write_page([d / "run.jsonl"], d / "run.html")
>>> text = out.read_text()
>>> "<b>hi</b>" in text, "\\\\u003cb\\\\u003ehi" in text
(False, True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from atropos.view.data import Budget, group_data, page_data
from atropos.view.page import render
from atropos.view.read import Collection, Entry, recorded_tokenizer

__all__ = [
    "DEFAULT_LIMIT",
    "Collection",
    "build_page",
    "page_of_files",
    "read_files",
    "recorded_tokenizer",
    "write_page",
]

DEFAULT_LIMIT = 2000
"""Groups on one page unless `--limit` says otherwise."""


def read_files(
    paths: Sequence[Path],
    limit: int = DEFAULT_LIMIT,
    prepare: Callable[[Entry], dict[str, Any]] | None = None,
) -> Collection:
    """The first `limit` groups of these JSONL files (bad lines counted); with `prepare`, each
    kept as what the page shows of it (see `Collection`)."""
    found = Collection(limit=limit, prepare=prepare)
    for path in paths:
        found.add_file(Path(path))
    return found


def page_of_files(
    paths: Sequence[Path],
    title: str,
    tokenizer: Any = None,
    tokenizer_name: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> tuple[str, Collection]:
    """The HTML page of these JSONL files and what was read (counts); each group is prepared
    for the page as it is read, so no raw group outlives its line."""
    budget = Budget()
    found = read_files(paths, limit, lambda e: group_data(e, tokenizer, budget))
    recorded = recorded_tokenizer(Path(paths[0])) if paths and tokenizer is None else None
    return build_page(found, title, tokenizer, tokenizer_name, budget, recorded), found


def build_page(
    found: Collection,
    title: str,
    tokenizer: Any = None,
    tokenizer_name: str | None = None,
    budget: Budget | None = None,
    recorded: str | None = None,
) -> str:
    """The HTML page of `found`. With a tokenizer the trained tokens are highlighted; without,
    the page names the `recorded` one (the run's, `read.recorded_tokenizer`) when known."""
    name = tokenizer_name or (getattr(tokenizer, "name_or_path", None) if tokenizer else None)
    return render(page_data(found, title, tokenizer, name, budget, recorded))


def write_page(
    paths: Sequence[Path],
    out: Path,
    *,
    title: str | None = None,
    tokenizer: Any = None,
    tokenizer_name: str | None = None,
    limit: int = DEFAULT_LIMIT,
) -> Path:
    """Write the page of these JSONL files to `out` (parents created); return `out`."""
    title = title or ", ".join(Path(p).name for p in paths) or "rollouts"
    text, _ = page_of_files(paths, title, tokenizer, tokenizer_name, limit)
    return write_text(out, text)


def write_text(out: Path, text: str) -> Path:
    """Write `text` to `out` through a temporary file, so a reader never sees half a page."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(out)
    return out

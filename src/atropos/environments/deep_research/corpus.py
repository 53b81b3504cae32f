"""The document collection a rollout searches and reads: documents, a BM25 index, snippets, pages.

A collection is read from a JSONL file (one document per line: `id`, `title`, `text`; `doc_id`
and `contents`/`body` are read too), from a folder of `.txt`/`.md` files (the id is the file's
name without its suffix, the title its first line when that is a `# ` heading, else the name),
or built from rows in code (`Corpus(docs)`). Search is the shared pure-Python BM25
(`common.retrieval`) over title and text; each hit shows the sentence that shares the most
words with the query as its snippet.

>>> corpus = Corpus([Document("a", "Mithril", "Dwarves mine it. Mithril is mined in Moria."),
...                  Document("b", "Moonpetal", "Moonpetal grows in the Whisperwood.")])
>>> [(h.doc_id, h.snippet) for h in corpus.search("where is mithril mined?", k=2)]
[('a', 'Mithril is mined in Moria.')]
>>> paged("abcdefgh", page=2, size=3)
('def', 3)
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atropos.environments.common.data_loading import read_jsonl
from atropos.environments.common.retrieval import BM25, LoreDoc, terms

__all__ = ["Corpus", "Document", "Hit", "clip", "load_corpus", "paged", "snippet", "to_document"]

_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_TEXT_SUFFIXES = (".txt", ".md")


@dataclass(frozen=True)
class Document:
    """One document: its id (what `open` and citations name), title, text and, for a web
    result, where it came from."""

    id: str
    title: str
    text: str
    url: str | None = None


@dataclass(frozen=True)
class Hit:
    """One search result as the policy sees it."""

    doc_id: str
    title: str
    snippet: str
    url: str | None = None

    def as_dict(self) -> dict[str, str]:
        """The result's fields for the tool message (no `url` when there is none)."""
        found = {"doc_id": self.doc_id, "title": self.title, "snippet": self.snippet}
        return found | ({"url": self.url} if self.url else {})


def clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters at a word boundary, with `…` when cut.

    >>> clip("one two three", 9), clip("short", 9)
    ('one two…', 'short')
    """
    if len(text) <= limit:
        return text
    cut = text[: max(1, limit - 1)]
    if " " in cut:
        cut = cut.rsplit(" ", 1)[0]
    return cut + "…"


def snippet(text: str, query: str, limit: int) -> str:
    """The sentence of `text` sharing the most words with `query` (the first on a tie), clipped
    to `limit` characters."""
    sentences = [s for s in _SENTENCE.split(text.strip()) if s] or [text]
    wanted = set(terms(query))
    best = max(sentences, key=lambda s: len(wanted & set(terms(s))))
    return clip(best, limit)


def paged(text: str, page: int, size: int) -> tuple[str, int]:
    """(page `page` of `text`, counting from 1, in pages of `size` characters; the number of
    pages). A page past the end is ""."""
    pages = max(1, math.ceil(len(text) / size))
    return text[(page - 1) * size : page * size], pages


class Corpus:
    """Documents by id, searchable with BM25.

    Raises:
        ValueError: two documents share an id, or there is none.
    """

    def __init__(self, docs: Iterable[Document]) -> None:
        self.docs: dict[str, Document] = {}
        for doc in docs:
            if doc.id in self.docs:
                raise ValueError(f"two documents have the id {doc.id!r}; ids must be unique")
            self.docs[doc.id] = doc
        if not self.docs:
            raise ValueError("the collection has no documents")
        self._index = BM25()
        self._index.add([LoreDoc(d.id, d.title, d.text) for d in self.docs.values()])

    def __len__(self) -> int:
        return len(self.docs)

    def get(self, doc_id: str) -> Document | None:
        """The document with this id, or None."""
        return self.docs.get(doc_id)

    def search(self, query: str, k: int, snippet_chars: int = 240) -> list[Hit]:
        """The `k` best documents for `query` (BM25 score above 0), best first."""
        found = self._index.search(query, k)
        return [
            Hit(d.id, d.title, snippet(self.docs[d.id].text, query, snippet_chars))
            for d, _ in found
        ]


def to_document(row: dict[str, Any], where: str) -> Document:
    """A document from a row with `id` (or `doc_id`), `text` (or `contents`, `body`) and an
    optional `title` (default: the id); `where` names the row in errors."""
    ident = row.get("id", row.get("doc_id"))
    text = next((row[k] for k in ("text", "contents", "body") if k in row), None)
    if not isinstance(ident, (str, int)) or str(ident).strip() == "":
        raise ValueError(f"{where}: a document needs an 'id' (a non-empty string)")
    if not isinstance(text, str):
        raise ValueError(f"{where}: document {ident!r} needs a 'text' string")
    title = row.get("title")
    return Document(str(ident), str(title) if title else str(ident), text, row.get("url"))


def _from_folder(folder: Path) -> list[Document]:
    docs = []
    for path in sorted(p for p in folder.rglob("*") if p.suffix in _TEXT_SUFFIXES):
        text = path.read_text(encoding="utf-8")
        first, _, rest = text.partition("\n")
        if first.startswith("# "):
            docs.append(Document(path.stem, first[2:].strip(), rest.strip()))
        else:
            docs.append(Document(path.stem, path.stem, text.strip()))
    return docs


def load_corpus(path: str | Path) -> list[Document]:
    """The documents of a JSONL file or of a folder of `.txt`/`.md` files.

    Raises:
        FileNotFoundError: nothing is at `path`.
        ValueError: a row is not a document (the file and line named), or the folder holds no
            text files.
    """
    where = Path(path).expanduser()
    if where.is_dir():
        docs = _from_folder(where)
        if not docs:
            raise ValueError(f"{where}: no .txt or .md files: nothing to search")
        return docs
    if not where.is_file():
        raise FileNotFoundError(f"--env.corpus {where}: no such file or folder")
    return [to_document(row, f"{where} row {n}") for n, row in enumerate(read_jsonl(where), 1)]

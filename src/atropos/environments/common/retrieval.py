"""Retrievers over short documents: Okapi BM25 in pure Python (default), or sentence embeddings.

Shared by `npc_arena` (world lore, whose game events join the index while it runs) and
`deep_research` (a document collection). Both index `LoreDoc`s (id, title, text) incrementally
(`add`) and answer `search(query, k)` with the best documents first. The embeddings
retriever needs `sentence-transformers`, imported only when it is chosen.

>>> index = BM25()
>>> index.add([LoreDoc("a", "Mithril", "Mithril is mined in Emberdeep."),
...            LoreDoc("b", "Moonpetal", "Moonpetal grows in the Whisperwood.")])
>>> [doc.id for doc, _ in index.search("where is mithril mined?", k=2)]
['a']
"""

from __future__ import annotations

import difflib
import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from atropos.install import install_hint

__all__ = [
    "BM25",
    "RETRIEVERS",
    "EmbeddingRetriever",
    "LoreDoc",
    "Retriever",
    "RetrieverUnavailable",
    "make_retriever",
    "terms",
]

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
STOPWORDS = frozenset(
    "a an and are as at be but by can do does for from had has have he her him his how i if in"
    " into is it its me my no not of on or our she so than that the their them then there they"
    " this to up was we were what when where which who why will with would you your".split()
)


def _fold(word: str) -> str:
    """A crude plural fold ("hammers" -> "hammer"), so singular and plural match."""
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def terms(text: str) -> list[str]:
    """Lower-cased words of `text` without stopwords, possessive 's or plural s.

    >>> terms("Where's the Amulet of Eldoria’s keeper? Two hammers, one glass.")
    ['amulet', 'eldoria', 'keeper', 'two', 'hammer', 'one', 'glass']
    """
    words = (w.removesuffix("'s") for w in _WORD.findall(text.lower().replace("’", "'")))
    return [_fold(w) for w in words if w not in STOPWORDS]


@dataclass(frozen=True)
class LoreDoc:
    """One retrievable piece of world knowledge: a lore entry, or a game event."""

    id: str
    title: str
    text: str
    source: str = "lore"  # or "event"

    def line(self) -> str:
        """The document as one prompt line."""
        tag = " (recent event)" if self.source == "event" else ""
        return f"- {self.title}{tag}: {self.text}"


class Retriever(Protocol):
    """What the lore index needs from a retriever."""

    def add(self, docs: Sequence[LoreDoc]) -> None:
        """Index more documents."""

    def search(self, query: str, k: int) -> list[tuple[LoreDoc, float]]:
        """The `k` best documents for `query` (score > 0 only), best first."""


class BM25:
    """Okapi BM25 over title and text (k1 = 1.5, b = 0.75; idf = ln(1 + (N - df + .5)/(df + .5)),
    never negative). Ties keep the order documents were added in."""

    def __init__(self, k1: float = 1.5, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.docs: list[LoreDoc] = []
        self._tf: list[Counter[str]] = []
        self._len: list[int] = []
        self._postings: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return len(self.docs)

    def add(self, docs: Sequence[LoreDoc]) -> None:
        for doc in docs:
            counts = Counter(terms(f"{doc.title} {doc.text}"))
            index = len(self.docs)
            self.docs.append(doc)
            self._tf.append(counts)
            self._len.append(sum(counts.values()))
            for term in counts:
                self._postings.setdefault(term, []).append(index)

    def search(self, query: str, k: int) -> list[tuple[LoreDoc, float]]:
        n = len(self.docs)
        if not n or k <= 0:
            return []
        mean_len = sum(self._len) / n or 1.0
        scores: dict[int, float] = {}
        for term in set(terms(query)):
            postings = self._postings.get(term, [])
            idf = math.log(1 + (n - len(postings) + 0.5) / (len(postings) + 0.5))
            for i in postings:
                tf = self._tf[i][term]
                norm = tf + self.k1 * (1 - self.b + self.b * self._len[i] / mean_len)
                scores[i] = scores.get(i, 0.0) + idf * tf * (self.k1 + 1) / norm
        best = sorted(scores.items(), key=lambda pair: (-pair[1], pair[0]))[:k]
        return [(self.docs[i], score) for i, score in best if score > 0]


class RetrieverUnavailable(RuntimeError):
    """The chosen retriever cannot run here (a missing optional package, an unknown name)."""


class EmbeddingRetriever:
    """Cosine similarity of `sentence-transformers` embeddings (normalised, so a dot product).

    Raises:
        RetrieverUnavailable: `sentence-transformers` is not installed.
    """

    def __init__(self, model_name: str) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise RetrieverUnavailable(
                "--env.retriever embeddings needs the sentence-transformers package:"
                f" {install_hint('embeddings')} (or use the default --env.retriever bm25)"
            ) from None
        self.model: Any = SentenceTransformer(model_name)
        self.docs: list[LoreDoc] = []
        self._vectors: list[list[float]] = []

    def __len__(self) -> int:
        return len(self.docs)

    def _embed(self, texts: list[str]) -> list[list[float]]:
        vectors = self.model.encode(texts, normalize_embeddings=True)
        return [[float(x) for x in v] for v in vectors]

    def add(self, docs: Sequence[LoreDoc]) -> None:
        if docs:
            self._vectors += self._embed([f"{d.title}. {d.text}" for d in docs])
            self.docs += docs

    def search(self, query: str, k: int) -> list[tuple[LoreDoc, float]]:
        if not self.docs or k <= 0:
            return []
        [q] = self._embed([query])
        scores = [sum(a * b for a, b in zip(q, v, strict=True)) for v in self._vectors]
        best = sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:k]
        return [(self.docs[i], scores[i]) for i in best if scores[i] > 0]


RETRIEVERS = ("bm25", "embeddings")


def make_retriever(kind: str, model_name: str = "all-MiniLM-L6-v2") -> Retriever:
    """A retriever by name: "bm25", or "embeddings" (with `model_name`).

    >>> try:
    ...     make_retriever("bm52")
    ... except RetrieverUnavailable as e:
    ...     print(e)
    unknown retriever 'bm52' (did you mean 'bm25'?); known: bm25, embeddings
    """
    if kind == "bm25":
        return BM25()
    if kind == "embeddings":
        return EmbeddingRetriever(model_name)
    near = difflib.get_close_matches(kind, RETRIEVERS, n=1)
    hint = f" (did you mean {near[0]!r}?)" if near else ""
    raise RetrieverUnavailable(f"unknown retriever {kind!r}{hint}; known: {', '.join(RETRIEVERS)}")

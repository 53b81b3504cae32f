"""Lore: BM25 ranking, the optional embeddings retriever, lore files, the tailed events file."""

from __future__ import annotations

import json
import math
import re
import sys
import types
from pathlib import Path

import pytest

from atropos.environments.common.data_loading import data_path
from atropos.environments.npc_arena import (
    BM25,
    EmbeddingRetriever,
    EventFeed,
    LoreDoc,
    LoreIndex,
    RetrieverUnavailable,
    load_lore,
    make_retriever,
)
from atropos.install import install_hint

CORPUS = [
    LoreDoc("forge", "Emberdeep", "The dwarves of Emberdeep forge hammers and mine mithril."),
    LoreDoc("wood", "Whisperwood", "Sprites dance in the Whisperwood where moonpetal grows."),
    LoreDoc("port", "Greywater", "Greywater is a rainy port; smugglers trade at Pier Nine."),
    LoreDoc("mith", "Mithril", "Mithril mithril mithril: the rarest metal of the deep mines."),
    LoreDoc(
        "long", "Travels", "A long tale of roads " + "and roads " * 40 + "and one mithril coin."
    ),
]


def test_bm25_ranks_by_term_frequency_rarity_and_length():
    index = BM25()
    index.add(CORPUS)
    ranked = [doc.id for doc, _ in index.search("Where is mithril?", k=5)]
    assert ranked == ["mith", "forge", "long"]  # frequent beats once; a long doc pays for length
    assert [d.id for d, _ in index.search("moonpetal sprites", k=1)] == ["wood"]
    assert index.search("nothing matches zzz", k=3) == [] and index.search("mithril", 0) == []
    # a rare term outweighs a common one
    both = [d.id for d, _ in index.search("smugglers mithril", k=1)]
    assert both == ["port"]


def test_bm25_scores_match_the_formula():
    index = BM25(k1=1.2, b=0.75)
    docs = [LoreDoc("a", "x", "apple apple pear"), LoreDoc("b", "y", "pear plum")]
    index.add(docs)
    [(doc, score)] = index.search("apple", 1)
    lengths = [4, 3]  # title words count too: "x apple apple pear", "y pear plum"
    idf = math.log(1 + (2 - 1 + 0.5) / (1 + 0.5))
    expected = idf * 2 * 2.2 / (2 + 1.2 * (1 - 0.75 + 0.75 * lengths[0] / 3.5))
    assert doc.id == "a" and score == pytest.approx(expected)


def test_the_shipped_lore_loads_and_answers_questions():
    docs = load_lore(data_path("npc_arena", "lore"))
    assert len(docs) >= 24 and len({d.id for d in docs}) == len(docs)
    index = LoreIndex(make_retriever("bm25"), docs)
    assert index.lookup("Where can I sell sky-shards?", 3)[0].id in {
        "items/sky-shards",
        "factions/the-merchants-guild",
    }
    assert "places/old-tether" in {d.id for d in index.lookup("How do I ride the Sky Lift?", 2)}


def test_lore_files_markdown_and_jsonl(tmp_path):
    (tmp_path / "a.md").write_text("# Ignored\nintro\n\n## Bridge\nIt is old.\n\n## Tower\nTall.\n")
    (tmp_path / "b.jsonl").write_text(json.dumps({"title": "Moon", "text": "Round."}) + "\n")
    docs = load_lore(tmp_path)
    assert [(d.id, d.title, d.text) for d in docs] == [
        ("a/bridge", "Bridge", "It is old."),
        ("a/tower", "Tower", "Tall."),
        ("b/1", "Moon", "Round."),
    ]
    (tmp_path / "c.md").write_text("## Empty\n\n")
    with pytest.raises(ValueError, match=r"c\.md: the entry 'Empty' has no text"):
        load_lore(tmp_path)
    (tmp_path / "c.md").unlink()
    (tmp_path / "d.jsonl").write_text('{"title": "No text"}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl:1: a lore row needs"):
        load_lore(tmp_path)
    with pytest.raises(ValueError, match="no such directory"):
        load_lore(tmp_path / "missing")


def append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def test_an_event_appended_after_setup_is_retrieved_by_the_next_lookup(tmp_path):
    events = tmp_path / "events.jsonl"
    append(events, json.dumps({"text": "Snow closed Frostfang Pass.", "title": "Weather"}) + "\n")
    index = LoreIndex(BM25(), CORPUS, EventFeed(events))
    assert [e.text for e in index.events] == ["Snow closed Frostfang Pass."]  # read at setup
    assert index.lookup("dragon bridge", 3) == []
    append(events, json.dumps({"text": "A dragon burned the Millford bridge."}) + "\n")
    [found] = index.lookup("dragon bridge", 3)
    assert found.source == "event" and found.text == "A dragon burned the Millford bridge."
    assert found.line() == "- Event (recent event): A dragon burned the Millford bridge."


def test_the_feed_waits_for_whole_lines_and_skips_bad_ones(tmp_path):
    events = tmp_path / "later.jsonl"
    feed = EventFeed(events)
    assert feed.poll() == []  # the game has not written the file yet
    append(events, '"A plain string event."\n{"text": "half a li')
    assert [e.text for e in feed.poll()] == ["A plain string event."]
    append(events, 'ne"}\nnot json\n{"title": "no text"}\n[1, 2]\n\n{"text": "ok", "id": "e9"}\n')
    got = feed.poll()
    assert [(e.id, e.text) for e in got] == [("event/2", "half a line"), ("e9", "ok")]
    assert feed.bad == 3 and feed.read == 3
    events.write_text('{"text": "after rotation"}\n')  # truncated and rewritten by the game
    assert [e.text for e in feed.poll()] == ["after rotation"]


def test_recent_events_are_shown_even_when_the_query_misses_them(tmp_path):
    events = tmp_path / "events.jsonl"
    index = LoreIndex(BM25(), CORPUS, EventFeed(events))
    for text in ("The king fell ill.", "Pirates raided Greywater.", "A comet was seen."):
        append(events, json.dumps(text) + "\n")
    found = index.lookup("mithril", 1, recent=2)
    assert [d.id for d in found] == ["mith", "event/3", "event/2"]
    found = index.lookup("Pirates Greywater", 2, recent=2)  # a retrieved event is not repeated
    assert [d.id for d in found] == ["event/2", "port", "event/3"]


class _FakeModel:
    """A bag-of-letters 'sentence embedding', enough to rank by shared letters."""

    def __init__(self, name: str) -> None:
        self.name = name

    def encode(self, texts: list[str], normalize_embeddings: bool = False) -> list[list[float]]:
        out = []
        for text in texts:
            v = [float(text.lower().count(c)) for c in "abcdefghijklmnopqrstuvwxyz"]
            norm = math.sqrt(sum(x * x for x in v)) or 1.0
            out.append([x / norm for x in v] if normalize_embeddings else v)
        return out


def test_the_embeddings_retriever_uses_sentence_transformers(monkeypatch):
    fake = types.ModuleType("sentence_transformers")
    fake.SentenceTransformer = _FakeModel  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sentence_transformers", fake)
    retriever = make_retriever("embeddings", "tiny-model")
    assert isinstance(retriever, EmbeddingRetriever) and retriever.model.name == "tiny-model"
    retriever.add([LoreDoc("z", "zzz", "zzz zzz"), LoreDoc("a", "aaa", "aaa aaa")])
    assert [d.id for d, _ in retriever.search("aaaa", 1)] == ["a"]


def test_a_missing_sentence_transformers_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import fails
    with pytest.raises(RetrieverUnavailable, match=re.escape(install_hint("embeddings"))):
        make_retriever("embeddings")
    with pytest.raises(RetrieverUnavailable, match="did you mean 'embeddings'"):
        make_retriever("embedding")

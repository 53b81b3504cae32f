"""`WordCodec`: ids word by word from a cache are the Rust `encode`'s, for the shipped tokenizer
and for byte-level BPE tokenizers of GPT-2's and Llama 3's (Qwen's) shape trained here; any
other pipeline, any non-ASCII text and any text not covered by words get None (the Rust call)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers

from atropos.inference import words as words_module
from atropos.inference.tokenizer import TokenCodec, load_tokenizer
from atropos.inference.words import WordCodec
from atropos.testing.bpe import LLAMA3_PATTERN, SHAPES, trained

ROOT = Path(__file__).resolve().parents[2]
ASCII = st.lists(
    st.one_of(
        st.characters(max_codepoint=127),
        st.sampled_from([" ", "  ", "\n", "\n\n", "\t", "'s", "'LL", "123", "x", " the", "."]),
    ),
    max_size=30,
).map("".join)


def _byte_level(gpt2: bool = True, prefix: bool = False) -> Any:
    return pre_tokenizers.ByteLevel(add_prefix_space=prefix, use_regex=gpt2)


def _llama3(behavior: str = "isolated", invert: bool = False, pattern: str = LLAMA3_PATTERN) -> Any:
    split = pre_tokenizers.Split(Regex(pattern), behavior=behavior, invert=invert)
    return pre_tokenizers.Sequence([split, _byte_level(gpt2=False)])


def _codec(tok: Tokenizer) -> WordCodec | None:
    return WordCodec.of(tok, json.loads(tok.to_str()))


@pytest.fixture(scope="module")
def shapes() -> dict[str, Tokenizer]:
    return {shape: trained(shape) for shape in SHAPES}


def test_the_shipped_tokenizer_encodes_by_word():
    codec = TokenCodec.of(load_tokenizer("tiny"))
    assert codec._words is not None


@pytest.mark.parametrize("shape", SHAPES)
def test_trained_tokenizers_of_both_shapes_match_the_rust_encode(shapes, shape):
    tok = shapes[shape]
    words = _codec(tok)
    assert words is not None
    rng = random.Random(0)
    docs = [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))]
    # long prose and code; without the added tokens, which `TokenCodec` cuts out before
    ascii_docs = [
        doc.replace("<|im_start|>", "").replace("<|im_end|>", "") for doc in docs if doc.isascii()
    ][:4]
    assert ascii_docs, "no ASCII document under docs/ to compare"
    for doc in ascii_docs:
        assert words.encode(doc) == tok.encode(doc, add_special_tokens=False).ids
    alphabet = [chr(i) for i in range(128)] + [" ", "\n", "'", "1", "a"] * 8
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(40)))
        assert words.encode(text) == tok.encode(text, add_special_tokens=False).ids, repr(text)


@settings(max_examples=400, deadline=None)
@given(ASCII)
def test_random_ascii_text_matches_the_shipped_tokenizer_word_by_word(text):
    tok = load_tokenizer("tiny")
    codec = TokenCodec.of(tok)
    words = codec._words
    assert words is not None
    ids = tok.encode(text, add_special_tokens=False)
    assert words.encode(text) == ids
    assert words.encode(text) == ids  # from the cache
    assert codec.encode(text) == ids


def test_non_ascii_text_is_left_to_the_rust_encode():
    tok = load_tokenizer("tiny")
    codec = TokenCodec.of(tok)
    assert codec._words is not None
    for text in ["é", "naïve café", "漢字 kanji", "a\u00a0b", "x\u2028y", "emoji 🙂"]:
        assert codec._words.encode(text) is None
        assert codec.encode(text) == tok.encode(text, add_special_tokens=False)


def test_a_split_pattern_with_capturing_groups_gets_no_word_codec():
    tok = trained(pre=_llama3(pattern=r"(\p{L}+)|\s+|\p{N}+|[^\s\p{L}\p{N}]+"))
    assert _codec(tok) is None  # (`findall` would give the groups)
    with pytest.raises(ValueError, match="capturing groups"):
        WordCodec(r"(a)|b", tok.model)


def test_a_text_with_a_gap_between_words_is_none(shapes):
    words = WordCodec(r"\p{L}+", shapes["gpt2"].model)  # spaces are in no word
    assert words.encode("ab") is not None
    assert words.encode("a b") is None


@pytest.mark.parametrize(
    "why",
    [
        "normalizer",
        "prefix space",
        "bytes only",
        "metaspace",
        "split removed",
        "split inverted",
        "dropout",
        "wordpiece",
    ],
)
def test_other_pipelines_get_no_word_codec(why):
    made: dict[str, Any] = {
        "normalizer": lambda: trained("gpt2", normalizer=normalizers.NFC()),
        "prefix space": lambda: trained(pre=_byte_level(prefix=True)),
        "bytes only": lambda: trained(pre=_byte_level(gpt2=False)),
        "metaspace": lambda: trained(pre=pre_tokenizers.Metaspace()),
        "split removed": lambda: trained(pre=_llama3(behavior="removed")),
        "split inverted": lambda: trained(pre=_llama3(invert=True)),
        "dropout": lambda: trained("gpt2", model=models.BPE(dropout=0.5)),
        "wordpiece": lambda: _wordpiece(),
    }
    assert _codec(made[why]()) is None


def _wordpiece() -> Tokenizer:
    tok = Tokenizer(models.WordPiece({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = _byte_level()
    return tok


def test_a_pattern_that_cuts_otherwise_fails_the_probe(shapes, monkeypatch):
    monkeypatch.setattr(words_module, "GPT2_PATTERN", r" ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+")
    assert _codec(shapes["gpt2"]) is None  # no contractions, no `\s+(?!\S)`: ids differ


def test_the_word_cache_is_bounded(shapes, monkeypatch):
    monkeypatch.setattr(WordCodec, "WORDS", 8)
    tok = shapes["gpt2"]
    words = _codec(tok)
    assert words is not None
    for i in range(100):
        text = f"word{i} and{i} more{i}"
        assert words.encode(text) == tok.encode(text, add_special_tokens=False).ids
        assert len(words._cache) <= 8

"""Token ids of ASCII text word by word, from a cache: for regex-split byte-level BPE tokenizers.

A Hugging Face `tokenizers` pipeline encodes a piece of text (the text between added tokens:
`TokenCodec` cuts there) in steps: the normalizer; the pre-tokenizer, which cuts it into words
by a regex (GPT-2's, inside `ByteLevel`; or a `Split` of the model's own pattern before a
`ByteLevel` that only spells bytes: Qwen 2 and 3, Llama 3) and spells each word's bytes in the
byte-level alphabet; then the model (BPE), which encodes **each word on its own**. So a word's
ids never depend on its neighbours, and text is mostly words seen before (`def`, ` the`,
`\\n   `). `WordCodec.encode` cuts the text with the tokenizer's own pattern (the `regex`
module, which reads the same `\\p{L}`/`\\p{N}` syntax), looks each word's ids up in a bounded
cache and asks the model (`model.tokenize`, that word alone) on a miss. The Rust `encode` runs
the same steps but builds offsets, masks and an `Encoding` for every call: 2.6-3.3x the CPU
for a chat message, 2.8-3.0x for a long document whose words were seen, 1.4-1.6x for one whose
words are all new (`benchmarks/words.py`, on the shipped tokenizer and on GPT-2- and
Llama-3-shaped ones of 32,000 ids; RESULTS.md, "Issue 38 item 1: tokens by word").

Exactness is the point, so it is used only where nothing can differ:

- for ASCII text only (`str.isascii`; anything else returns None and the caller asks the Rust
  `encode`): the two regex engines' Unicode tables (what is a letter, a number, a space) may
  be of different Unicode versions, and a character one calls a letter and the other not would
  cut the words differently, giving other ids with no error; over ASCII the classes agree;
- where the whole text is covered by words (each character in a match: the patterns in use do
  cover ASCII; a gap would be a word of its own in `Split`'s "Isolated" mode, so a text with
  one returns None rather than guess);
- for a pipeline of exactly that shape (`WordCodec.of` returns None otherwise): no normalizer;
  `ByteLevel(use_regex=True)`, or a `Sequence` of `Split(Regex, Isolated, not inverted; no
  capturing group)` and `ByteLevel(use_regex=False)`, without a prefix space; a BPE model
  without dropout; and a probe of every ASCII character in many contexts (spaces, newlines,
  digits, contractions, code) encodes to the same ids both ways.
"""

from __future__ import annotations

import contextlib
from typing import Any

import regex

from atropos.inference.bytelevel import ascii_spelling

__all__ = ["WordCodec"]

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
"""The pre-tokenizing regex of `ByteLevel(use_regex=True)` (GPT-2's)."""

_CONTEXTS = (
    "{c}",
    "a{c}b",
    " {c} ",
    "{c}{c}{c}",
    "1{c}2",
    "{c}'s",
    "'{c}",
    "\n{c}\n",
    "  {c}  x",
    "A{c}1",
    "\t{c}\r\n",
)
_TEXTS = (
    "Hello world! It's 12345 o'clock, they'll say; we've 3.14 and -7e10.\n\n  ok?\tDone ",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\n\n\tif x >= 10: pass\r\n",
    "I'M HERE'S 'RE 'Ll  \n \n  \n\n   trailing   \n",
    "$ ls -la /tmp/* | grep -E '^d' && echo \"done\" > out.txt 2>&1; exit 0",
    "0 00 000 0000 00000 123456789 1,234,567.89 x1 1x a1b2c3",
)


def probe() -> str:
    """Every ASCII character in each of `_CONTEXTS`, and a few texts of prose and code."""
    chars = [chr(i) for i in range(128)]
    pieces = [context.format(c=c) for c in chars for context in _CONTEXTS]
    return "".join(pieces) + "".join(_TEXTS)


class WordCodec:
    """One tokenizer's word cache: `encode(text)` is its ids, or None where not exact."""

    WORDS = 1 << 16
    """Distinct words whose ids are kept (oldest out): a vocabulary's worth of text."""

    __slots__ = ("_cache", "_findall", "_model", "_spell")

    def __init__(self, pattern: str, model: Any) -> None:
        compiled = regex.compile(pattern)
        if compiled.groups:  # `findall` would give the groups, not the words
            raise ValueError(f"a word pattern with capturing groups: {pattern!r}")
        self._findall = compiled.findall
        self._model = model
        self._spell = ascii_spelling()
        self._cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def of(cls, backend: Any, config: dict[str, Any]) -> WordCodec | None:
        """The codec of a `tokenizers.Tokenizer` (`config`: its JSON, read), or None where
        its pipeline is not of the shape this is exact for, or the probe differs."""
        pattern = _pattern(config)
        model = config.get("model") or {}
        if pattern is None or config.get("normalizer") is not None:
            return None
        if model.get("type") != "BPE" or model.get("dropout") is not None:
            return None
        try:
            words = cls(pattern, backend.model)
            text = probe()
            if words.encode(text) != backend.encode(text, add_special_tokens=False).ids:
                return None
        except Exception:  # a pattern the regex module reads otherwise, an older tokenizers
            return None
        words._cache.clear()
        return words

    def encode(self, text: str) -> list[int] | None:
        """The ids of `text` (no added tokens in it), or None: not ASCII, or not all words."""
        if not text.isascii():
            return None
        words = self._findall(text)
        if sum(map(len, words)) != len(text):
            return None
        cache = self._cache
        ids: list[int] = []
        for word in words:
            found = cache.get(word)
            if found is None:
                found = self._tokenize(word)
            ids += found
        return ids

    def _tokenize(self, word: str) -> tuple[int, ...]:
        """The model's ids of one word (spelt in the byte alphabet), kept for next time."""
        found = tuple(token.id for token in self._model.tokenize(word.translate(self._spell)))
        cache = self._cache
        if len(cache) >= self.WORDS:
            with contextlib.suppress(RuntimeError, KeyError, StopIteration):
                del cache[next(iter(cache))]  # (another thread may be here too)
        cache[word] = found
        return found


def _pattern(config: dict[str, Any]) -> str | None:
    """The word-cutting regex of a pipeline of the shape `WordCodec` takes, else None."""
    pre = config.get("pre_tokenizer") or {}
    if pre.get("type") == "ByteLevel":
        return GPT2_PATTERN if pre.get("use_regex", True) and _plain(pre) else None
    if pre.get("type") != "Sequence":
        return None
    steps = pre.get("pretokenizers") or []
    if len(steps) != 2:
        return None
    split, byte_level = steps
    if byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex", True):
        return None
    if not _plain(byte_level) or split.get("type") != "Split" or split.get("invert"):
        return None
    regex_source = (split.get("pattern") or {}).get("Regex")
    if split.get("behavior") != "Isolated" or not isinstance(regex_source, str):
        return None
    return regex_source


def _plain(byte_level: dict[str, Any]) -> bool:
    """A `ByteLevel` step that adds no space before the text."""
    return not byte_level.get("add_prefix_space", False)

"""Byte-level BPE tokenizers of the shapes real models use, trained here on atropos's own source.

No model's tokenizer may be downloaded at test time, and the shipped one (`atropos.tiny`) is of
one shape only. `trained(shape)` trains a `tokenizers.Tokenizer` in a second or two, of:

- `"gpt2"`: GPT-2's `ByteLevel` pre-tokenizer, its own regex inside (GPT-2, the shipped tiny);
- `"llama3"`: a `Split` by Llama 3's pattern, then a bytes-only `ByteLevel` (the shape of
  Llama 3's and of Qwen 2's and 3's tokenizers; Qwen's pattern differs from it only in not
  grouping digits by three);

with a BPE model, the byte-level decoder, and `<|im_start|>` and `<|im_end|>` as special tokens.
Used by the tests of `inference.words` and `inference.bytelevel`, and by `benchmarks/words.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = ["LLAMA3_PATTERN", "SHAPES", "pre_tokenizer", "trained"]

LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SHAPES = ("gpt2", "llama3")
SPECIAL = ["<|im_start|>", "<|im_end|>"]
_PACKAGE = Path(__file__).resolve().parents[1]


def pre_tokenizer(shape: str) -> Any:
    """The pre-tokenizer of `shape` (one of `SHAPES`)."""
    if shape == "gpt2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if shape == "llama3":
        split = pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False)
        bytes_only = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        return pre_tokenizers.Sequence([split, bytes_only])
    raise ValueError(f"unknown tokenizer shape {shape!r}: use one of {', '.join(SHAPES)}")


def trained(
    shape: str | None = None,
    *,
    vocab: int = 2000,
    pre: Any = None,
    model: Any = None,
    normalizer: Any = None,
    files: list[Path] | None = None,
) -> Tokenizer:
    """A BPE tokenizer of `vocab` ids trained on `files` (atropos's own inference and proxy
    sources by default: prose, code and numbers): of `shape`'s pre-tokenizer, or of `pre`
    (another pipeline, with `model` and `normalizer` if given: a test of what is refused)."""
    tok = Tokenizer(model or models.BPE())
    tok.pre_tokenizer = pre if pre is not None else pre_tokenizer(shape or "gpt2")
    tok.decoder = decoders.ByteLevel()
    if normalizer is not None:
        tok.normalizer = normalizer
    if files is None:
        files = sorted([*_PACKAGE.glob("inference/*.py"), *_PACKAGE.glob("proxy/*.py")])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(f) for f in files], trainer)
    return tok

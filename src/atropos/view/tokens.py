"""Token pieces and mask runs: what the page needs to highlight the trained tokens.

`pieces(tokenizer, ids)` gives one string per token whose concatenation is the decoded text
(special tokens kept), so the page can mark each token as trained or masked. A token that
holds only part of a character (byte-level BPE splits `é` into two tokens) gets `""` and the
character goes to the token that completes it.

`mask_runs(masks)` run-length encodes a mask row: alternating counts of masked (-100) and
trained positions, starting with masked.

>>> mask_runs([-100, -100, 5, 6, -100, 7])
[2, 2, 1, 1]
>>> mask_runs([5, -100])
[0, 1, 1]
>>> expand_runs([0, 1, 1])
[True, False]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

MASKED = -100
"""A mask value: this position is not trained."""

_REPLACEMENT = "\ufffd"


def mask_runs(masks: Sequence[Any]) -> list[int]:
    """Alternating run lengths of masked and trained positions, the first run masked."""
    runs: list[int] = []
    trained = False  # the run being counted
    count = 0
    for m in masks:
        is_trained = m != MASKED
        if is_trained != trained:
            runs.append(count)
            trained, count = is_trained, 0
        count += 1
    runs.append(count)
    while len(runs) > 1 and runs[-1] == 0:
        runs.pop()
    return runs


def expand_runs(runs: Sequence[int]) -> list[bool]:
    """The per-position "trained" flags of `mask_runs` output (its inverse, for tests)."""
    flags: list[bool] = []
    for i, n in enumerate(runs):
        flags += [i % 2 == 1] * n
    return flags


def _decoder(tokenizer: Any) -> tuple[Callable[[list[int]], str], Callable[[list[int]], list[str]]]:
    """(decode one list, decode one list per token), special tokens kept."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and hasattr(backend, "decode_batch"):

        def one(ids: list[int]) -> str:
            return str(backend.decode(ids, skip_special_tokens=False))

        def each(ids: list[int]) -> list[str]:
            return [str(s) for s in backend.decode_batch([[i] for i in ids], False)]

        return one, each

    def slow_one(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=False))

    def slow_each(ids: list[int]) -> list[str]:
        return [slow_one([i]) for i in ids]

    return slow_one, slow_each


def incremental_pieces(decode: Callable[[list[int]], str], ids: Sequence[int]) -> list[str]:
    """Pieces by decoding growing windows: exact for any tokenizer, a few decodes per token.

    A token's piece is what it adds to the text decoded since the last complete character,
    so a leading space that a lone token would lose (SentencePiece) is kept, and a partial
    character waits for the token that completes it.

    >>> table = {1: "a", 2: "b", 3: "c"}
    >>> incremental_pieces(lambda ids: "".join(table[i] for i in ids), [1, 2, 3])
    ['a', 'b', 'c']
    """
    ids = list(ids)
    out: list[str] = []
    prefix = read = 0  # decode context starts at `prefix`; text up to `read` is emitted
    for i in range(len(ids)):
        before = decode(ids[prefix:read])
        after = decode(ids[prefix : i + 1])
        if len(after) > len(before) and not after.endswith(_REPLACEMENT):
            out.append(after[len(before) :])
            prefix, read = read, i + 1
        else:
            out.append("")
    if ids and read < len(ids):  # an unfinished character at the end: show what decodes
        before = decode(ids[prefix:read])
        out[-1] += decode(ids[prefix:])[len(before) :]
    return out


def pieces(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """One display string per token; joined, they give the decoded text (specials kept).

    Each token is decoded alone first (one call for the whole row); runs of tokens that hold
    partial characters are redone incrementally, and when the joined pieces still differ
    from the whole decode (a tokenizer whose lone tokens lose their spaces) the row is redone
    incrementally.

    >>> from atropos.inference.tokenizer import load_tokenizer
    >>> tok = load_tokenizer("tiny")
    >>> ids = tok.encode("hi é!", add_special_tokens=False)
    >>> p = pieces(tok, ids)
    >>> "".join(p), len(p) == len(ids)
    ('hi é!', True)
    """
    ids = [int(i) for i in ids]
    if not ids:
        return []
    one, each = _decoder(tokenizer)
    out = each(ids)
    i = 0
    while i < len(out):
        if _REPLACEMENT not in out[i]:
            i += 1
            continue
        j = i
        while j < len(out) and _REPLACEMENT in out[j]:
            j += 1
        out[i:j] = incremental_pieces(one, ids[i:j])
        i = j
    if "".join(out) != one(ids):
        out = incremental_pieces(one, ids)
    return out

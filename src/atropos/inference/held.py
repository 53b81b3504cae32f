"""`HeldTexts`: continue a held chat sequence by tokenizing only the text a turn adds.

A `ManagedServer` session re-renders the whole conversation every turn (the chat template is
the only exact source of the new turn's text), but the held sequence's ids need not be
tokenized again: when the held ids end with an added token (`<|im_end|>`, eos) and the new
render starts with the text of those ids, the ids to send are the held ids plus the encoding of
the rest of the render. That is exact where the tokenizer cuts its input at added tokens before
anything else (`TokenCodec.pieces`: then no token can span the boundary), which this module
requires; otherwise, and for held ids ending in an ordinary token (a "length" completion),
`ManagedServer` renders, tokenizes and classifies the whole prompt as before.

The drift label stays what a full tokenization would say (`classify_drift`): `CLEAN` when the
held ids are the canonical tokenization of their text, `REALIGN` when they are not (the server
sampled another tokenization). A node's ids are canonical when its prompt ids were (every
extension but a `REALIGN` one builds them by encoding) and its completion encodes back to
itself together with the prompt's text since the prompt's last added token, a check of a few
tokens, not of the conversation.

Cost per turn, measured with `benchmarks/multiturn_scale.py` (6 turns): the encode of the whole
rendered history and the decode of the held ids were about a third of the env's CPU per turn,
and grew with the conversation; now two short encodes (the completion's text, for the
canonical check, and the new text). Where the held ids are canonical, the completion's text is
taken as answered (the node's `full_text`, and its end token's text) rather than decoded again:
exact, since it is used only when its encoding is the held ids (`HeldTexts._answered`).
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from atropos.inference.sequence import DriftKind, SequenceNode
from atropos.inference.tokenizer import TokenCodec

_Entry = tuple[str, str | None, list[int], list[int], "DriftKind | None"]


class HeldTexts:
    """For each held node that may be extended by text, what its text is made of: the prompt's
    text and ids, the completion's ids and the prompt's drift (keyed by the node's identity: a
    session's nodes are alive while held; `forget` when a node is replaced, `clear` on reset).
    Noting costs a tuple; the text and the canonical check are made only when a later turn
    continues the node (a single-turn rollout never pays for them)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        #: id(node) -> (prompt text, the prompt's last added token's text (None: it has none),
        #: the prompt ids after it, the completion ids, the prompt's drift)
        self._held: dict[int, _Entry] = {}
        self._added: dict[int, str] | None = None

    def clear(self) -> None:
        self._held.clear()

    def forget(self, node: SequenceNode) -> None:
        self._held.pop(id(node), None)

    def note(
        self,
        nodes: list[SequenceNode],
        text: str,
        prompt: list[int],
        outs: list[list[int]],
        drift: DriftKind | None,
    ) -> None:
        """Remember each of `nodes` (one prompt's choices: prompt ids `prompt` rendered from
        `text`, completions `outs`) whose ids end with an added token, so that its next turn can
        extend it by text. Of the prompt's ids only those after its last added token are kept
        (what `_canonical` reads; the node holds them all), found once for all the choices."""
        added = self._added_tokens()
        if not added:
            return
        entry: tuple[str, str | None, list[int]] | None = None
        for node, out in zip(nodes, outs, strict=True):
            if out and out[-1] in added:
                if entry is None:
                    start = len(prompt)
                    while start and prompt[start - 1] not in added:
                        start -= 1
                    mark = added[prompt[start - 1]] if start else None
                    entry = (text, mark, prompt[start:])  # shared: read only
                self._held[id(node)] = (*entry, out, drift)

    def text(self, node: SequenceNode) -> str | None:
        """The text of the node's ids, special tokens kept (None: not noted)."""
        entry = self._held.get(id(node))
        if entry is None:
            return None
        return entry[0] + TokenCodec.of(self.tokenizer).decode(entry[3], False)

    def extend(self, parent: SequenceNode, text: str) -> tuple[DriftKind, list[int]] | None:
        """The drift and ids of prompt `text` continuing `parent`, by encoding only what `text`
        adds to the parent's text; None when that is not exact (then tokenize all of it)."""
        entry = self._held.get(id(parent))
        if entry is None:
            return None
        prompt_text, mark, tail, out, drift = entry
        if not text.startswith(prompt_text):  # compared in place
            return None
        codec = TokenCodec.of(self.tokenizer)
        tried = None  # a completion text found not canonical by `_answered`
        if drift is not DriftKind.REALIGN:
            found = self._answered(parent, text, entry, codec)
            if isinstance(found, list):
                return DriftKind.CLEAN, found
            tried = found
        out_text = codec.decode(out, False)
        cut = len(prompt_text)
        if not text.startswith(out_text, cut):
            return None
        canonical = (
            drift is not DriftKind.REALIGN
            and out_text != tried
            and self._canonical(prompt_text, mark, tail, out, out_text)
        )
        ids = parent.tokens + codec.encode(text[cut + len(out_text) :])
        return (DriftKind.CLEAN if canonical else DriftKind.REALIGN), ids

    def _answered(
        self, parent: SequenceNode, text: str, entry: _Entry, codec: TokenCodec
    ) -> list[int] | str | None:
        """The ids of `text` when the parent's ids are canonical and `text` continues them,
        found without decoding the completion: its text as answered (the node's `full_text`
        is the prompt's text and the completion's, special tokens skipped) and its last id's
        (an added token), taken to be the completion's text only when their encoding, from
        the prompt's last added token on, is the held ids (then the held ids are the encoding
        of `text` up to there, and the rest is encoded alone). Else None, or the completion
        text it tried when that encoding was not the held ids (not canonical, if the decode
        gives that text)."""
        prompt_text, mark, tail, out, _ = entry
        full, end = parent.full_text, self._added_tokens().get(out[-1])
        if end is None or len(full) < len(prompt_text) or not text.startswith(full):
            return None
        stop = len(full) + len(end)
        if not text.startswith(end, len(full)):
            return None
        start = prompt_text.rfind(mark) + len(mark) if mark is not None else 0
        if codec.encode(text[start:stop]) != tail + out:
            return text[len(prompt_text) : stop]
        return parent.tokens + codec.encode(text[stop:])

    def _canonical(
        self, text: str, mark: str | None, tail: list[int], out: list[int], out_text: str
    ) -> bool:
        """Whether canonical prompt ids plus `out` still are: the ids since the prompt's last
        added token (`mark`; `tail`), plus `out`, are the encoding of their text."""
        if mark is not None:
            text = text[text.rfind(mark) + len(mark) :]
        encoded = TokenCodec.of(self.tokenizer).encode(text + out_text)
        return encoded == tail + out

    def _added_tokens(self) -> dict[int, str]:
        """Added token id -> its text, where the codec cuts text at them (else empty: off)."""
        if self._added is None:
            self._added = added_tokens(self.tokenizer)
        return self._added


_ADDED: weakref.WeakKeyDictionary[Any, dict[int, str]] = weakref.WeakKeyDictionary()


def added_tokens(tokenizer: Any) -> dict[int, str]:
    """Added token id -> its text where `TokenCodec` cuts text at them, else empty (made once
    per tokenizer: a session is made per rollout, and transformers builds the map each call)."""
    try:
        found = _ADDED.get(tokenizer)
    except TypeError:  # not weak-referenceable
        found = None
    if found is not None:
        return found
    found = {}
    vocab = getattr(tokenizer, "get_added_vocab", None)
    if TokenCodec.of(tokenizer).pieces and callable(vocab):
        try:
            found = {int(i): str(t) for t, i in vocab().items()}
        except (TypeError, ValueError):
            found = {}
    with contextlib.suppress(TypeError):
        _ADDED[tokenizer] = found
    return found

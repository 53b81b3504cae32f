"""The JSON of a continued prompt's token ids, made from the JSON its last call sent.

A token backend sends the prompt's ids as a JSON list, so a conversation of 32k tokens costs
~0.2 ms of encoding per call (and grows with every turn), though all but the last turn's ids
were encoded by the call before. `ManagedServer` knows which: a call continuing a held node
sends ids that open with that node's ids (its prompt's, then its completion's), and it keeps,
per held node, the JSON its prompt was sent as. It hands the call a `PromptJSON` (in the
`PROMPT_JSON` context variable: the manager, routing, retries and the backend's own frames
pass no new argument), and the backend's `ids_json` builds the body's list from that prefix
and the JSON of the ids after it (an append of bytes), recording the whole for the next call.

Exact by construction and checked by identity: `ids_json` uses the prefix only for the very
list object the `PromptJSON` names (a backend that copies or changes the ids, e.g. to drop a
doubled BOS, encodes them whole), and `ManagedServer` names only ids whose first `count` are
the ids the prefix spells (the continued node's, which open the prompt it builds).
"""

from __future__ import annotations

from contextvars import ContextVar

import msgspec

__all__ = ["PROMPT_JSON", "PromptJSON", "ids_json"]

_ENCODE = msgspec.json.Encoder().encode


class PromptJSON:
    """One call's prompt ids (`ids`, the list it sends), the JSON of its first `count` ids
    (`prefix`, a whole JSON list: None when nothing is known), and once encoded the JSON of
    all of them (`json`)."""

    __slots__ = ("count", "ids", "json", "prefix")

    def __init__(self, ids: list[int], prefix: bytes | None = None, count: int = 0) -> None:
        self.ids = ids
        self.prefix = prefix if count else None
        self.count = count
        self.json: bytes | None = None


PROMPT_JSON: ContextVar[PromptJSON | None] = ContextVar("atropos_prompt_json", default=None)
"""The `PromptJSON` of the call in progress (set by `ManagedServer` around its server call)."""


def ids_json(ids: list[int]) -> bytes:
    """The JSON list of `ids`, from the call's `PromptJSON` when it names this very list.

    >>> known = PromptJSON(ids := [5, 6, 7, 8], b"[5,6]", 2)
    >>> token = PROMPT_JSON.set(known)
    >>> ids_json(ids), known.json, ids_json([5, 6, 7, 8]) is known.json
    (b'[5,6,7,8]', b'[5,6,7,8]', False)
    >>> PROMPT_JSON.reset(token)
    """
    known = PROMPT_JSON.get()
    if known is None or known.ids is not ids:
        return _ENCODE(ids)
    if known.json is None:  # (a retry on another server sends the same bytes)
        prefix, count = known.prefix, known.count
        if prefix is None or count > len(ids):
            known.json = _ENCODE(ids)
        elif count == len(ids):
            known.json = prefix
        else:  # "[...prefix" "," "rest...]": one copy of the bytes, no list encoded
            rest = _ENCODE(ids[count:])
            known.json = b"".join((memoryview(prefix)[:-1], b",", memoryview(rest)[1:]))
    return known.json

"""The chunks of one assistant turn interrupted at its tool calls.

The turn is continued by token ids with `ManagedServer.continue_turn` (the held ids plus the
inserted tool result, masked; upstream's interleaved-thinking environment re-rendered the
partial message instead, which closes the turn in most chat templates, so the model wrote after
an end-of-turn token). `chunk_of` reads what one generation added.

`stop_at_call` is how a chunk of a reply ends at `</tool_call>`: a stop token id when the
tokenizer has the tag as one token (every server keeps a stop token in the output ids), else
the stop string (vLLM and our CPU server keep its ids, our fake server cuts them: `ended_at_call`
tells the two apart).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from atropos.inference.sequence import SequenceNode
from atropos.inference.tokenize import as_token_ids, trailing_end_of_turn

__all__ = [
    "CALL_CLOSE",
    "CALL_OPEN",
    "Chunk",
    "chunk_of",
    "ended_at_call",
    "stop_at_call",
]

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass
class Chunk:
    """What one generation added to an open assistant turn.

    Attributes:
        node: the sequence through this chunk.
        start: where the chunk's own ids begin in `node.tokens` (its span ends at the end).
        text: the chunk decoded (special tokens left out).
        finish_reason: the server's ("stop", "length").
        ends_turn: the chunk ended in an end-of-turn token.
    """

    node: SequenceNode
    start: int
    text: str
    finish_reason: str
    ends_turn: bool


def stop_at_call(tokenizer: Any) -> dict[str, Any]:
    """The sampling kwargs that end a generation at `</tool_call>`."""
    ids = as_token_ids(tokenizer.encode(CALL_CLOSE, add_special_tokens=False))
    if len(ids) == 1:
        return {"stop_token_ids": ids}
    return {"stop": [CALL_CLOSE]}


def ended_at_call(chunk: Chunk) -> tuple[bool, bool]:
    """(whether the chunk stopped at the end of a tool call, whether the server cut the
    `</tool_call>` stop string from its ids, so it must be inserted)."""
    if chunk.finish_reason != "stop" or chunk.ends_turn:
        return False, False
    opened, closed = chunk.text.count(CALL_OPEN), chunk.text.count(CALL_CLOSE)
    if opened and closed >= opened and chunk.text.rstrip().endswith(CALL_CLOSE):
        return True, False
    return (True, True) if opened == closed + 1 else (False, False)


def _finish(reason: Any) -> str:
    if isinstance(reason, Mapping):  # SGLang's {"type": ...}
        reason = reason.get("type")
    return "" if reason is None else str(reason)


def chunk_of(tokenizer: Any, node: SequenceNode, start: int) -> Chunk:
    """The chunk of `node` from `start` on (its text decoded, how it ended)."""
    out = node.tokens[start:]
    ends = bool(out) and trailing_end_of_turn(out, tokenizer) > 0
    text = str(tokenizer.decode(out, skip_special_tokens=True))
    return Chunk(node, start, text, node.finish_reason, ends)

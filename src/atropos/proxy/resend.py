"""Reading a chat call that resends its conversation: only the messages it adds are decoded.

An agent's `/v1/chat/completions` call sends its whole history every time, so decoding the
body and reading (checking, normalising: `openai_api.read_messages`) every message is work
that grows with the conversation. `ChatReader` (one per session) keeps the previous call's
messages twice: as their JSON bytes (`msgspec.Raw`, slices of that call's body) and as read. A
message whose bytes equal the previous call's at the same index decodes and reads to the same
value, so the message read then is used as it is (the same object); only the messages after
the first that differs are decoded and read. The same objects call after call make the later
passes over the history cheap too: the session's raw-text substitution (`Session._render`),
the window's and `ManagedServer`'s prefix matches compare identical objects.

The rest of the body (model, sampling fields, tools) is most often the previous call's byte for
byte: then it is not decoded or checked again, and the call's `TurnRequest` takes the previous
one's fields (the same `tools` list, a copy of `sampling`) and the same body dict (read only).

A body this path does not take as it is (not a JSON object, `messages` absent, empty or not a
list, anything that does not decode) is read by the full path (`fields.decode`,
`openai_api.chat_to_turn`), whose error is the client's. The nesting limit (`fields.MAX_DEPTH`)
is checked as the full path checks it, over the body less the messages and over each message
decoded (a message the previous call sent passed it then).

Memory: a session keeps its last call's body (the messages' bytes point into it), and a copy of
the fields it takes from an earlier call (the body less its messages).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from atropos.proxy import fields, openai_api
from atropos.proxy.turns import TurnRequest

__all__ = ["ChatReader"]

_TOP = msgspec.json.Decoder(dict[str, msgspec.Raw])
_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_ANY = msgspec.json.Decoder()
_UNREAD = (msgspec.DecodeError, UnicodeError, RecursionError)


class ChatReader:
    """One session's chat calls, read by what each adds to the previous one."""

    __slots__ = ("_read", "_rest", "_sent", "decoded")

    def __init__(self) -> None:
        self._sent: list[msgspec.Raw] = []  # the previous call's messages, as sent
        self._read: list[dict[str, Any]] = []  # and as read
        #: The previous call's body less its messages: as sent, decoded, and its TurnRequest.
        self._rest: tuple[dict[str, msgspec.Raw], dict[str, Any], TurnRequest] | None = None
        #: Messages decoded and read so far (the rest were the previous call's).
        self.decoded = 0

    def read(self, data: bytes) -> tuple[TurnRequest, dict[str, Any]]:
        """The call's `TurnRequest` and its body (without `messages` where read here);
        ProxyError 400 when the body is malformed."""
        found = _split(data)
        if found is None:
            body = fields.decode(data)
            return openai_api.chat_to_turn(body), body
        top, raws = found
        rest = self._rest
        if rest is not None and rest[0] == top:  # the same fields as the last call's
            body = rest[1]
        else:
            rest, decoded = None, _decoded(top, data)
            if decoded is None:
                body = fields.decode(data)
                return openai_api.chat_to_turn(body), body
            body = decoded
        sent, read = self._sent, self._read
        same, most = 0, min(len(raws), len(sent))
        while same < most and raws[same] == sent[same]:
            same += 1
        try:
            added = [_ANY.decode(raw) for raw in raws[same:]]
        except _UNREAD:  # (the full path names what is wrong)
            body = fields.decode(data)
            return openai_api.chat_to_turn(body), body
        if _deep(raws[same:], 2):  # (the messages read before were checked then)
            for message in added:
                fields.check_depth(message, 3)  # body, messages, the message
        messages = read[:same] + openai_api.read_messages(added, same)
        if rest is None:
            turn = openai_api.chat_to_turn(body, messages)
            self._rest = ({k: v.copy() for k, v in top.items()}, body, turn)  # (not the body)
        else:
            was = rest[2]
            turn = TurnRequest(
                messages, was.tools, was.tool_choice, was.n, was.max_tokens, dict(was.sampling)
            )
        self._sent, self._read = raws, messages
        self.decoded += len(added)
        return turn, body


def _split(data: bytes) -> tuple[dict[str, msgspec.Raw], list[msgspec.Raw]] | None:
    """The body less `messages` and the messages, as sent; None for a body the full path
    reads."""
    if not data:
        return None
    try:
        top = _TOP.decode(data)
        messages = top.pop("messages", None)
        raws = _LIST.decode(messages) if messages is not None else None
    except _UNREAD:
        return None
    if not raws:
        return None
    return top, raws


def _decoded(top: dict[str, msgspec.Raw], data: bytes) -> dict[str, Any] | None:
    """The body less `messages`, decoded (its depth checked); None where the full path reads
    it."""
    try:
        body = {key: _ANY.decode(value) for key, value in top.items()}
    except _UNREAD:
        return None
    if _deep([data]):
        fields.check_depth(body)
    return body


def _deep(parts: Sequence[bytes | msgspec.Raw], above: int = 0) -> bool:
    """Whether JSON `parts`, found `above` levels down in the body, may nest past
    `fields.MAX_DEPTH` (else they need no walk): a count of their brackets, so a long
    conversation's call counts only what it adds (at 32k tokens both counts of the whole body
    cost ~55 us a call)."""
    brackets = above
    for part in parts:
        data = bytes(part)  # (a Raw's copy; a `bytes` is itself)
        brackets += data.count(b"[") + data.count(b"{")
    return brackets > fields.MAX_DEPTH

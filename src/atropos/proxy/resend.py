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

A body this path does not take as it is (not a JSON object, `messages` absent, empty or not a
list, anything that does not decode) is read by the full path (`fields.decode`,
`openai_api.chat_to_turn`), whose error is the client's. The nesting limit (`fields.MAX_DEPTH`)
is checked as the full path checks it, over the body less the messages and over each message
decoded (a message the previous call sent passed it then).

Memory: a session keeps its last call's body (the messages' bytes point into it).
"""

from __future__ import annotations

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

    __slots__ = ("_read", "_sent", "decoded")

    def __init__(self) -> None:
        self._sent: list[msgspec.Raw] = []  # the previous call's messages, as sent
        self._read: list[dict[str, Any]] = []  # and as read
        #: Messages decoded and read so far (the rest were the previous call's).
        self.decoded = 0

    def read(self, data: bytes) -> tuple[TurnRequest, dict[str, Any]]:
        """The call's `TurnRequest` and its body (without `messages` where read here);
        ProxyError 400 when the body is malformed."""
        found = _split(data)
        if found is None:
            body = fields.decode(data)
            return openai_api.chat_to_turn(body), body
        body, raws = found
        sent, read = self._sent, self._read
        same, most = 0, min(len(raws), len(sent))
        while same < most and raws[same] == sent[same]:
            same += 1
        try:
            added = [_ANY.decode(raw) for raw in raws[same:]]
        except _UNREAD:  # (the full path names what is wrong)
            body = fields.decode(data)
            return openai_api.chat_to_turn(body), body
        if _deep(data):
            for message in added:
                fields.check_depth(message, 3)  # body, messages, the message
        messages = read[:same] + openai_api.read_messages(added, same)
        turn = openai_api.chat_to_turn(body, messages)
        self._sent, self._read = raws, messages
        self.decoded += len(added)
        return turn, body


def _split(data: bytes) -> tuple[dict[str, Any], list[msgspec.Raw]] | None:
    """The body less `messages` (decoded, its depth checked) and the messages as sent; None
    for a body the full path reads."""
    if not data:
        return None
    try:
        top = _TOP.decode(data)
        messages = top.pop("messages", None)
        raws = _LIST.decode(messages) if messages is not None else None
        body = {key: _ANY.decode(value) for key, value in top.items()}
    except _UNREAD:
        return None
    if not raws:
        return None
    if _deep(data):
        fields.check_depth(body)
    return body, raws


def _deep(data: bytes) -> bool:
    """Whether the body may nest past `fields.MAX_DEPTH` (else its parts need no walk)."""
    return data.count(b"[") + data.count(b"{") > fields.MAX_DEPTH

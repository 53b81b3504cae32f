"""A session's chat calls read by what each adds (`atropos.proxy.resend`): the same
`TurnRequest` as the full read, only the added messages decoded, the previous call's messages
taken as the same objects; a changed or malformed body read as before."""

from __future__ import annotations

import json
from typing import Any

import pytest

from atropos.proxy import fields, openai_api
from atropos.proxy.resend import ChatReader
from atropos.proxy.turns import ProxyError

CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {"a": 2}}}


def body(messages: list[dict[str, Any]], **extra: Any) -> bytes:
    return json.dumps({"model": "m", "messages": messages, "max_tokens": 8, **extra}).encode()


def full(data: bytes) -> Any:
    return openai_api.chat_to_turn(fields.decode(data))


def test_a_resent_conversation_decodes_only_what_it_adds() -> None:
    reader = ChatReader()
    messages: list[dict[str, Any]] = [{"role": "developer", "content": "Be brief."}]
    turns = []
    for i in range(4):
        messages += [
            {"role": "user", "content": [{"type": "text", "text": f"q{i}"}]},
            {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "c1", "content": "5"},
        ]
        data = body(messages, temperature=0.5)
        turn, rest = reader.read(data)
        assert turn == full(data) and "messages" not in rest and rest["temperature"] == 0.5
        turns.append(turn)
    assert reader.decoded == len(messages)  # each message once
    # the previous call's messages are the same objects (later identity compares are cheap)
    assert all(a is b for a, b in zip(turns[-2].messages, turns[-1].messages, strict=False))


def test_an_edited_history_is_read_again_from_the_first_change() -> None:
    reader = ChatReader()
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    reader.read(body([*messages, {"role": "user", "content": "c"}]))
    edited = [messages[0], {"role": "assistant", "content": "B"}, {"role": "user", "content": "c"}]
    data = body(edited)
    turn, _ = reader.read(data)
    assert turn == full(data) and turn.messages[1]["content"] == "B"
    assert reader.decoded == 3 + 2
    shorter = body(messages[:1])  # fewer messages than before
    assert reader.read(shorter)[0] == full(shorter)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"[1]", "must be a JSON object"),
        (b'{"messages": []}', "non-empty list"),
        (b'{"messages": "hi"}', "non-empty list"),
        (b'{"messages": [{"role": "user", "content": "hi"}', "not JSON"),
        (b'{"messages": [{"role": "robot", "content": "hi"}]}', "messages[0] needs a role"),
        (b'{"messages": [{"role": "user", "content": "hi"}], "n": 0}', "n"),
    ],
)
def test_a_malformed_body_is_refused_as_the_full_read_refuses_it(data: bytes, said: str) -> None:
    reader = ChatReader()
    reader.read(body([{"role": "user", "content": "hi"}]))
    with pytest.raises(ProxyError) as ours:
        reader.read(data)
    with pytest.raises(ProxyError) as theirs:
        full(data)
    assert ours.value.message == theirs.value.message and said in ours.value.message


def test_a_message_nested_too_deeply_is_refused_after_a_resend() -> None:
    reader = ChatReader()
    ok = [{"role": "user", "content": "hi"}]
    reader.read(body(ok))
    deep: Any = "x"
    for _ in range(fields.MAX_DEPTH):
        deep = [deep]
    data = body([*ok, {"role": "user", "content": "x", "extra": deep}])
    with pytest.raises(ProxyError, match="nested too deeply"):
        reader.read(data)
    with pytest.raises(ProxyError, match="nested too deeply"):
        full(data)


def test_the_sessions_raw_text_substitution_follows_its_answers() -> None:
    """`Session._render` takes the previous call's messages as rendered then, but looks up
    again an answer it had no raw text for, and renders all again when an answer's raw text
    changes: each call gives what a render of every message gives."""
    from atropos.proxy.session import Session

    s = Session("s", "k", managed=None, tokenizer=None, text_server=object())

    def fresh(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        other = Session("t", "k", managed=None, tokenizer=None, text_server=object())
        other._raw_plain, other._raw_of = dict(s._raw_plain), dict(s._raw_of)
        return other._render(messages)

    user = [{"role": "user", "content": f"q{i}"} for i in range(4)]
    hi, later = {"role": "assistant", "content": "Hi"}, {"role": "assistant", "content": "Later"}
    s._read(" Hi", "stop", False)
    messages = [user[0], hi, user[1], later, user[2]]
    assert s._render(messages) == fresh(messages) and s._render(messages)[1]["content"] == " Hi"
    s._read("Later ", "stop", False)  # an answer the client had already: looked up again
    messages = [*messages, hi, user[3]]
    assert s._render(messages) == fresh(messages) and s._render(messages)[3]["content"] == "Later "
    s._read("Hi\n", "stop", False)  # "Hi" now stands for another raw text: all rendered again
    assert s._render(messages) == fresh(messages) and s._render(messages)[1]["content"] == "Hi\n"


def test_the_rest_of_the_body_is_read_again_only_when_its_bytes_change() -> None:
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    reader = ChatReader()
    messages = [{"role": "user", "content": "a"}]
    first, _ = reader.read(body(messages, tools=[tool], temperature=0.5, stop=["x"]))
    messages += [{"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    data = body(messages, tools=[tool], temperature=0.5, stop=["x"])
    second, rest = reader.read(data)
    assert second == full(data) and rest["temperature"] == 0.5
    assert second.tools is first.tools and second.sampling is not first.sampling
    changed = body(messages, tools=[tool], temperature=0.7, stop=["x"])
    third, rest = reader.read(changed)
    assert third == full(changed) and rest["temperature"] == 0.7
    with pytest.raises(ProxyError) as ours:  # a bad field is refused, not taken from before
        reader.read(body(messages, tools=[tool], temperature=9.0))
    assert "temperature" in ours.value.message

"""The Anthropic Messages dialect: `to_turn` on every block kind and every refusal, the answer
and its events, and the official `anthropic` SDK against a small app built on the module."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from atropos.proxy.anthropic_api import (
    error_body,
    error_event,
    from_turn,
    stream_events,
    to_turn,
)
from atropos.proxy.turns import ProxyError, TurnChoice, TurnRequest, TurnResult

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CALL = {
    "id": "call_0123abcd",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def body(**fields: Any) -> dict[str, Any]:
    """A valid request body with `fields` set (a value of None removes the field)."""
    out: dict[str, Any] = {
        "model": "policy",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    out.update(fields)
    return {k: v for k, v in out.items() if v is not None}


def result(
    content: str = "Hello!", calls: list[dict[str, Any]] | None = None, finish: str = "stop"
) -> TurnResult:
    choice = TurnChoice(content=content, tool_calls=calls or [], finish_reason=finish)
    return TurnResult(choices=[choice], prompt_tokens=11, completion_tokens=7, model="policy")


def events(chunks: Iterator[bytes]) -> list[tuple[str, dict[str, Any]]]:
    """The (event name, data) pairs of server-sent event bytes."""
    out = []
    for frame in b"".join(chunks).decode().split("\n\n"):
        if frame:
            name, data = frame.split("\n")
            assert name.startswith("event: ") and data.startswith("data: ")
            parsed = json.loads(data.removeprefix("data: "))
            assert parsed["type"] == name.removeprefix("event: ")
            out.append((name.removeprefix("event: "), parsed))
    return out


# to_turn: what each shape becomes


def test_plain_request() -> None:
    turn = to_turn(body(extra_field={"ignored": True}, metadata={"user_id": "u"}))
    assert turn == TurnRequest(messages=[{"role": "user", "content": "Hi"}], max_tokens=64)


def test_system_as_string_and_as_blocks() -> None:
    assert to_turn(body(system="Be brief.")).messages[0] == {
        "role": "system",
        "content": "Be brief.",
    }
    blocks = [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}]
    system = to_turn(body(system=blocks)).messages[0]
    assert system == {"role": "system", "content": "Be brief.\nBe kind."}
    assert to_turn(body(system="")).messages == [{"role": "user", "content": "Hi"}]


def test_user_text_blocks_join_into_one_message() -> None:
    content = [
        {"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "b"},
    ]
    turn = to_turn(body(messages=[{"role": "user", "content": content}]))
    assert turn.messages == [{"role": "user", "content": "a\nb"}]


def test_tool_loop_translates_to_openai_calls_and_tool_messages() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "toolu_01",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "other_7",
                    "name": "get_weather",
                    "input": {"city": "Rome"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "other_7",
                    "is_error": True,
                    "content": [{"type": "text", "text": "no data"}],
                },
                {"type": "text", "text": "Summarise."},
            ],
        },
    ]
    turn = to_turn(body(messages=messages))
    assert turn.messages[1:] == [
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "call_01",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "other_7",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_01", "content": "sunny"},
        {"role": "tool", "tool_call_id": "other_7", "content": "Error: no data"},
        {"role": "user", "content": "Summarise."},
    ]


def test_assistant_shapes() -> None:
    def assistant(content: Any) -> dict[str, Any]:
        messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": content}]
        return to_turn(body(messages=messages)).messages[1]

    assert assistant("Hello") == {"role": "assistant", "content": "Hello"}
    assert assistant([]) == {"role": "assistant", "content": ""}
    use = {"type": "tool_use", "id": "toolu_9", "name": "f", "input": {"é": 1}}
    assert assistant([use]) == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "f", "arguments": '{"é": 1}'}}
        ],
    }


def test_tool_results_without_content_and_text_before_them() -> None:
    content = [
        {"type": "text", "text": "first"},
        {"type": "tool_result", "tool_use_id": "toolu_1"},
        {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True, "content": []},
    ]
    turn = to_turn(body(messages=[{"role": "user", "content": content}]))
    assert turn.messages == [
        {"role": "user", "content": "first"},
        {"role": "tool", "tool_call_id": "call_1", "content": ""},
        {"role": "tool", "tool_call_id": "call_2", "content": "Error"},
    ]


def test_tools_tool_choice_and_sampling() -> None:
    bare = {"name": "ping", "input_schema": {"type": "object"}, "type": "custom"}
    turn = to_turn(
        body(
            tools=[WEATHER, bare],
            tool_choice={"type": "tool", "name": "ping"},
            stop_sequences=["\n\n", "END"],
            temperature=0.7,
            top_p=0.9,
            top_k=40,
            stream=True,
        )
    )
    assert turn.tools == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": WEATHER["input_schema"],
            },
        },
        {"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}},
    ]
    assert turn.tool_choice == {"type": "function", "function": {"name": "ping"}}
    assert turn.sampling == {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "stop": ["\n\n", "END"]}
    assert turn.n == 1
    for anthropic, openai in (("auto", "auto"), ("any", "required"), ("none", "none")):
        choice = {"type": anthropic, "disable_parallel_tool_use": True}
        assert to_turn(body(tools=[WEATHER], tool_choice=choice)).tool_choice == openai
    assert to_turn(body(tools=[], stop_sequences=[])).tools is None


def test_what_claude_code_sends() -> None:
    """Claude Code's request shape (2.1.332): system blocks with cache_control, a system turn
    in the middle of the conversation (kept in place), a deferred tool (left out of the
    prompt: not loaded until searched for), and fields the policy has no use for (thinking,
    context_management, output_config.effort, metadata) ignored."""
    cached = {"type": "ephemeral"}
    turn = to_turn(
        body(
            system=[
                {"type": "text", "text": "You are an agent."},
                {"type": "text", "text": "Be careful.", "cache_control": cached},
            ],
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "Fix answer.txt"}]},
                {
                    "role": "system",
                    "content": [{"type": "text", "text": "# Environment", "cache_control": cached}],
                },
                {"role": "assistant", "content": [{**USE, "input": {"path": "a"}}]},
                {"role": "user", "content": [{**RESULT, "cache_control": cached}]},
                {"role": "system", "content": "A reminder."},
            ],
            tools=[WEATHER, {**WEATHER, "name": "WebSearch", "defer_loading": True}],
            thinking={"type": "adaptive", "display": "updates"},
            context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            output_config={"effort": "high"},
            metadata={"user_id": '{"session_id": "s"}'},
        )
    )
    assert [m["role"] for m in turn.messages] == [
        "system", "user", "system", "assistant", "tool", "system"
    ]  # fmt: skip
    assert turn.messages[0]["content"] == "You are an agent.\nBe careful."
    assert turn.messages[2] == {"role": "system", "content": "# Environment"}
    assert turn.messages[5] == {"role": "system", "content": "A reminder."}
    assert [t["function"]["name"] for t in turn.tools or []] == ["get_weather"]


# to_turn: every refusal names the field and the fix

IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}}
USE = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}


def user(*blocks: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(blocks)}]


def assistant(*blocks: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": list(blocks)}]


BAD = [
    ({"model": None}, "model: required"),
    ({"model": 3}, "model: required"),
    (
        {"max_tokens": None},
        "max_tokens: required, expected an integer from 1 to 2147483647, got None",
    ),
    ({"max_tokens": 0}, "max_tokens: required, expected an integer from 1 to 2147483647, got 0"),
    ({"max_tokens": True}, "max_tokens: required"),
    ({"max_tokens": 8.5}, "max_tokens: required"),
    ({"stream": "yes"}, "stream: must be true or false"),
    ({"output_config": {"format": {"type": "json_schema"}}}, "structured outputs are not"),
    ({"messages": None}, "messages: required, a non-empty list"),
    ({"messages": []}, "messages: required, a non-empty list"),
    ({"messages": ["Hi"]}, "messages[0]: must be an object with role and content"),
    ({"messages": [{"role": "user"}]}, "messages[0].content: required, a string or a list"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "must be 'user', 'assistant' or 'system'"),
    ({"messages": [{"role": "system", "content": [IMAGE]}]}, "'image' blocks are not supported"),
    ({"messages": [{"role": "user", "content": []}]}, "messages[0].content: must not be empty"),
    ({"messages": user("text")}, "messages[0].content[0]: must be a content block"),
    ({"messages": user({"text": "x"})}, "messages[0].content[0]: must be a content block"),
    ({"messages": user({"type": "text"})}, "messages[0].content[0].text: required, a string"),
    ({"messages": user(IMAGE)}, "'image' blocks are not supported (the policy reads text only)"),
    ({"messages": user({"type": "document"})}, "send text or tool_result blocks"),
    ({"messages": user({"type": "video"})}, "'video' blocks are not supported (unknown to"),
    ({"messages": user(USE)}, "tool_use blocks belong in assistant messages"),
    ({"messages": user({"type": "tool_result"})}, "content[0].tool_use_id: required"),
    ({"messages": user({**RESULT, "is_error": "no"})}, "is_error: must be true or false"),
    ({"messages": user({**RESULT, "content": 5})}, "content[0].content: must be a string or"),
    ({"messages": user({**RESULT, "content": [IMAGE]})}, "content[0].content[0]: 'image' blocks"),
    ({"messages": assistant(RESULT)}, "tool_result blocks belong in user messages"),
    ({"messages": assistant({"type": "thinking", "thinking": "hm"})}, "'thinking' blocks are"),
    ({"messages": assistant({**USE, "id": ""})}, "messages[1].content[0].id: required"),
    ({"messages": assistant({**USE, "name": 1})}, "messages[1].content[0].name: required"),
    ({"messages": assistant({**USE, "input": "{}"})}, "content[0].input: required, an object"),
    ({"system": 1}, "system: must be a string or a list of text blocks"),
    ({"system": [IMAGE]}, "system[0]: 'image' blocks are not supported"),
    ({"tools": {}}, "tools: must be a list"),
    ({"tools": ["f"]}, "tools[0]: must be an object"),
    ({"tools": [{"type": "bash_20250124", "name": "bash"}]}, "'bash_20250124' is not supported"),
    ({"tools": [{"input_schema": {}}]}, "tools[0].name: required"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].name: 'get_weather' is used by an earlier tool"),
    ({"tools": [{**WEATHER, "description": 2}]}, "tools[0].description: must be a string"),
    ({"tools": [{"name": "f"}]}, "tools[0].input_schema: required, a JSON Schema object"),
    ({"tool_choice": "auto"}, "tool_choice: must be {type: 'auto'|'any'|'none'}"),
    ({"tool_choice": {"type": "function"}}, "tool_choice: must be"),
    ({"tool_choice": {"type": "any"}}, "tool_choice: 'any' needs tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "x"}}, "'x' is not one of"),
    ({"temperature": "hot"}, "temperature: must be a number from 0.0 to inf (got 'hot')"),
    ({"temperature": -1}, "temperature: must be a number"),
    ({"temperature": float("nan")}, "temperature: must be a number"),
    ({"top_p": 1.5}, "top_p: must be a number from 0.0 to 1.0 (got 1.5)"),
    ({"top_k": 0}, "top_k: must be an integer from 1 to 2147483647"),
    ({"stop_sequences": "END"}, "stop_sequences: must be a list of non-empty strings"),
    ({"stop_sequences": [""]}, "stop_sequences: must be a list of non-empty strings"),
]


@pytest.mark.parametrize(("fields", "message"), BAD, ids=[m for _, m in BAD])
def test_bad_requests_are_refused_with_a_message(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ProxyError) as caught:
        to_turn(body(**fields))
    assert caught.value.status == 400 and caught.value.kind == "invalid_request_error"
    assert message in caught.value.message


def test_a_body_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ProxyError, match="must be a JSON object with model, max_tokens"):
        to_turn(["model"])


# Answers and events


def test_answer_with_text() -> None:
    answer = from_turn(result(), "claude-like")
    assert answer["id"].startswith("msg_") and answer["model"] == "claude-like"
    assert answer["content"] == [{"type": "text", "text": "Hello!"}]
    assert (answer["type"], answer["role"], answer["stop_reason"]) == (
        "message",
        "assistant",
        "end_turn",
    )
    assert answer["usage"]["input_tokens"] == 11 and answer["usage"]["output_tokens"] == 7
    assert from_turn(result(""), "m")["content"] == [{"type": "text", "text": ""}]


def test_answer_with_calls_and_stop_reasons() -> None:
    answer = from_turn(result("", [CALL], "tool_calls"), "m")
    assert answer["content"] == [
        {
            "type": "tool_use",
            "id": "toolu_0123abcd",
            "name": "get_weather",
            "input": {"city": "Paris"},
        },
    ]
    assert answer["stop_reason"] == "tool_use"
    assert from_turn(result(finish="length"), "m")["stop_reason"] == "max_tokens"
    stopped = from_turn(result(), "m", stop_sequence="END")
    assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", "END")
    assert from_turn(result(finish="length"), "m", stop_sequence="END")["stop_sequence"] is None
    odd = {**CALL, "id": "abc", "function": {"name": "f", "arguments": "not json"}}
    block = from_turn(result("x", [odd], "tool_calls"), "m")["content"][1]
    assert (block["id"], block["input"]) == ("toolu_abc", {})


def test_answer_ids_round_trip_to_the_sessions_ids() -> None:
    answer = from_turn(result("", [CALL], "tool_calls"), "m")
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": answer["content"]},
    ]
    assert to_turn(body(messages=messages)).messages[1] == result("", [CALL]).choices[0].message()


def test_stream_events_in_order_and_adding_up() -> None:
    text = "The weather in Paris is sunny and mild."
    got = events(stream_events(result(text, [CALL], "tool_calls"), "m", pieces=3))
    names = [name for name, _ in got]
    assert names == ["message_start"] + (
        ["content_block_start"] + ["content_block_delta"] * 3 + ["content_block_stop"]
    ) * 2 + ["message_delta", "message_stop"]
    start = got[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["input_tokens"] == 11
    deltas = [data["delta"] for name, data in got if name == "content_block_delta"]
    assert "".join(d["text"] for d in deltas if d["type"] == "text_delta") == text
    partial = "".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta")
    assert json.loads(partial) == {"city": "Paris"}
    assert got[6][1]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_0123abcd",
        "name": "get_weather",
        "input": {},
    }
    assert got[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert got[-2][1]["usage"]["output_tokens"] == 7


def test_stream_of_an_empty_answer_has_one_empty_text_block() -> None:
    got = events(stream_events(result(""), "m"))
    assert [name for name, _ in got][1:4] == [
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
    ]
    assert got[2][1]["delta"] == {"type": "text_delta", "text": ""}


def test_error_shapes() -> None:
    assert error_body(ProxyError(400, "bad")) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "bad"},
    }
    assert error_body(ProxyError(401, "key", "authentication_error"))["error"]["type"] == (
        "authentication_error"
    )
    assert error_body(ProxyError(404, "no", "unknown_kind"))["error"]["type"] == "not_found_error"
    assert error_body(ProxyError(503, "down", "busy"))["error"]["type"] == "api_error"
    assert error_body(ProxyError(409, "taken", "conflict"))["error"]["type"] == (
        "invalid_request_error"
    )
    assert error_body(ProxyError(422, "no", "not_found_error"))["error"]["type"] == (
        "not_found_error"
    )
    assert events(iter([error_event(ProxyError(529, "busy"))])) == [
        ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    ]


# The official SDK against an app built on the module


def canned(turn: TurnRequest) -> TurnResult:
    """The stub policy: calls get_weather when it has tools and no result yet, stops for length
    under 5 tokens, and otherwise answers (with the tool's result, where there is one)."""
    last = turn.messages[-1]
    if turn.tools and last["role"] != "tool":
        return result("Let me check.", [CALL], "tool_calls")
    if (turn.max_tokens or 0) < 5:
        return result("Once upon", finish="length")
    if last["role"] == "tool":
        return result(f"It is {last['content']} in Paris.")
    return result("Hello! How can I help?")


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, list[TurnRequest]]]:
    """A Starlette app serving POST /v1/messages with the stub; yields its URL and the turns."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    from atropos.testing import serve_in_thread

    seen: list[TurnRequest] = []

    async def messages(request: Request) -> Response:
        try:
            payload = json.loads(await request.body())
            turn = to_turn(payload)
        except ValueError:
            return JSONResponse(error_body(ProxyError(400, "the body is not JSON")), 400)
        except ProxyError as err:
            return JSONResponse(error_body(err), err.status)
        seen.append(turn)
        answer = canned(turn)
        if payload.get("stream"):
            sse = stream_events(answer, payload["model"])
            return StreamingResponse(sse, media_type="text/event-stream")
        return JSONResponse(from_turn(answer, payload["model"]))

    app = Starlette(routes=[Route("/v1/messages", messages, methods=["POST"])])
    with serve_in_thread(app) as url:
        yield url, seen


@pytest.fixture()
def client(server: tuple[str, list[TurnRequest]]) -> Any:
    anthropic = pytest.importorskip("anthropic")
    return anthropic.Anthropic(base_url=server[0], api_key="k", max_retries=0, timeout=10.0)


ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def test_sdk_create_text(client: Any) -> None:
    message = client.messages.create(
        model="policy",
        max_tokens=64,
        messages=ASK,
        system="Be brief.",
        extra_body={"temperature": 0.5},
    )
    assert message.id.startswith("msg_") and message.model == "policy"
    assert message.role == "assistant" and message.type == "message"
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "Hello! How can I help?"
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (11, 7)


def test_sdk_create_length(client: Any) -> None:
    message = client.messages.create(model="policy", max_tokens=3, messages=ASK)
    assert message.stop_reason == "max_tokens" and message.content[0].text == "Once upon"


def test_sdk_create_tool_use(client: Any) -> None:
    message = client.messages.create(
        model="policy", max_tokens=64, messages=ASK, tools=[WEATHER], tool_choice={"type": "auto"}
    )
    assert message.stop_reason == "tool_use"
    text, use = message.content
    assert text.type == "text" and text.text == "Let me check."
    assert use.type == "tool_use" and use.id.startswith("toolu_")
    assert (use.name, use.input) == ("get_weather", {"city": "Paris"})


def test_sdk_stream_text(client: Any) -> None:
    with client.messages.stream(model="policy", max_tokens=64, messages=ASK) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == "Hello! How can I help?"
    assert final.content[0].text == "Hello! How can I help?"
    assert final.stop_reason == "end_turn"
    assert (final.usage.input_tokens, final.usage.output_tokens) == (11, 7)


def test_sdk_stream_tool_use(client: Any) -> None:
    with client.messages.stream(
        model="policy", max_tokens=64, messages=ASK, tools=[WEATHER]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "input_json" in kinds and "text" in kinds
    assert final.stop_reason == "tool_use"
    assert final.content[1].input == {"city": "Paris"}
    assert final.content[1].id.startswith("toolu_")


def test_sdk_raw_stream_events(client: Any) -> None:
    stream = client.messages.create(model="policy", max_tokens=64, messages=ASK, stream=True)
    kinds = [event.type for event in stream]
    assert kinds == ["message_start", "content_block_start"] + ["content_block_delta"] * 4 + [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_sdk_two_turn_tool_loop(client: Any, server: tuple[str, list[TurnRequest]]) -> None:
    first = client.messages.create(model="policy", max_tokens=64, messages=ASK, tools=[WEATHER])
    use = next(block for block in first.content if block.type == "tool_use")
    followup = ASK + [
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}],
        },
    ]
    second = client.messages.create(
        model="policy", max_tokens=64, messages=followup, tools=[WEATHER]
    )
    assert second.content[0].text == "It is sunny in Paris." and second.stop_reason == "end_turn"
    turn = server[1][-1]
    assert turn.messages[1] == result("Let me check.", [CALL]).choices[0].message()
    assert turn.messages[2] == {"role": "tool", "tool_call_id": CALL["id"], "content": "sunny"}


def test_sdk_bad_request_is_a_400(client: Any) -> None:
    anthropic = pytest.importorskip("anthropic")
    image = [{"role": "user", "content": [IMAGE]}]
    with pytest.raises(anthropic.BadRequestError) as caught:
        client.messages.create(model="policy", max_tokens=64, messages=image)
    assert caught.value.status_code == 400
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert "'image' blocks are not supported" in caught.value.body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        with client.messages.stream(model="policy", max_tokens=0, messages=ASK) as stream:
            stream.get_final_message()


def test_answer_and_events_validate_against_the_sdk_types() -> None:
    """The SDK builds its objects without validating them; validate here, strictly."""
    pytest.importorskip("anthropic")
    from anthropic.types import Message, RawMessageStreamEvent
    from pydantic import TypeAdapter

    answer = result("Let me check.", [CALL], "tool_calls")
    Message.model_validate(from_turn(answer, "policy"), strict=True)
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    for _, data in events(stream_events(answer, "policy")):
        adapter.validate_python(data, strict=True)


# The proxy: an answer sent back with its calls' arguments filled in


def echo_responder(prompt: str) -> str:
    if "<|im_start|>tool" in prompt:
        return "Fixed."
    call = {"name": "Edit", "arguments": {"file_path": "a.txt", "old": "x", "new": "y"}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


@pytest.mark.parametrize(
    ("added", "sequences"),
    [({"replace_all": False}, 1), ({"old": "changed"}, 2)],
    ids=["defaults-added", "argument-changed"],
)
def test_an_echo_with_defaults_filled_in_extends_the_sequence(
    added: dict[str, Any], sequences: int
) -> None:
    """Claude Code sends a tool_use back with its schema's defaults added (`replace_all`): the
    conversation still extends the model's own tokens (one sequence, a clean extension); an
    argument the model wrote but changed is the agent's rewrite (a new sequence)."""
    import httpx

    from atropos.proxy.app import build_app
    from atropos.testing import FakeInferenceServer, serve_in_thread

    from .helpers import make_proxy

    edit = {"name": "Edit", "input_schema": {"type": "object"}}
    with FakeInferenceServer(responder=echo_responder) as fake:
        with serve_in_thread(build_app(make_proxy(fake.base_url))) as url:
            session = httpx.post(f"{url}/sessions", json={}).json()
            headers = {"x-api-key": session["api_key"]}
            ask = {"model": "m", "max_tokens": 200, "tools": [edit]}
            ask["messages"] = [{"role": "user", "content": "Fix a.txt"}]
            endpoint = f"{session['anthropic_base_url']}/v1/messages"
            first = httpx.post(endpoint, json=ask, headers=headers).json()
            use = first["content"][-1]
            assert use["type"] == "tool_use" and use["name"] == "Edit"
            sent = {**use, "input": {**use["input"], **added}}
            result_block = {"type": "tool_result", "tool_use_id": use["id"], "content": "ok"}
            ask["messages"] += [
                {"role": "assistant", "content": [sent]},
                {"role": "user", "content": [result_block]},
            ]
            second = httpx.post(endpoint, json=ask, headers=headers).json()
            assert second["content"][0]["text"] == "Fixed."
            path = f"{url}/sessions/{session['id']}/trajectory"
            trajectory = httpx.get(path, headers=headers).json()
    assert len(trajectory["sequences"]) == sequences
    assert trajectory["breaks"]["clean"] == (1 if sequences == 1 else 0)


# Tool search: a tool_result that references a deferred tool


def test_a_tool_reference_is_the_referenced_tools_line_in_the_result() -> None:
    found = {**RESULT, "content": [{"type": "text", "text": "Found:"}, REFERENCE]}
    deferred = {**WEATHER, "defer_loading": True}
    turn = to_turn(body(messages=assistant(USE) + user(found), tools=[SEARCH, deferred]))
    line = json.dumps({"type": "function", "function": {**WEATHER_FUNCTION}})
    assert turn.messages[-1] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "Found:\n" + line,
    }
    assert [t["function"]["name"] for t in turn.tools or []] == ["ToolSearch"]  # still deferred
    unknown = {**RESULT, "content": [{"type": "tool_reference", "tool_name": "nope"}]}
    with pytest.raises(ProxyError, match=r"tool_name: 'nope' is not among the request's tools"):
        to_turn(body(messages=assistant(USE) + user(unknown), tools=[SEARCH, deferred]))
    image = {**RESULT, "content": [IMAGE]}
    with pytest.raises(ProxyError, match="send text or tool_reference blocks"):
        to_turn(body(messages=assistant(USE) + user(image), tools=[SEARCH]))


SEARCH = {"name": "ToolSearch", "input_schema": {"type": "object"}}
REFERENCE = {"type": "tool_reference", "tool_name": "get_weather"}
WEATHER_FUNCTION = {
    "name": "get_weather",
    "description": WEATHER["description"],
    "parameters": WEATHER["input_schema"],
}


def search_responder(prompt: str) -> str:
    if "<|im_start|>tool" in prompt:
        return "Found it."
    return '<tool_call>{"name": "ToolSearch", "arguments": {"query": "weather"}}</tool_call>'


def test_a_tool_search_extends_the_sequence_with_the_templates_line_of_the_tool() -> None:
    """Claude Code's tool search through the proxy: the result referencing a deferred tool is
    that tool's line as the policy's template writes its tools (one sequence, a clean
    extension), where Anthropic's API expands the definition into the context."""
    import httpx

    from atropos.inference.tokenizer import load_tokenizer
    from atropos.proxy.app import build_app
    from atropos.testing import FakeInferenceServer, serve_in_thread

    from .helpers import make_proxy

    tools = [SEARCH, {**WEATHER, "defer_loading": True}]
    with FakeInferenceServer(responder=search_responder) as fake:
        with serve_in_thread(build_app(make_proxy(fake.base_url))) as url:
            session = httpx.post(f"{url}/sessions", json={}).json()
            headers = {"x-api-key": session["api_key"]}
            ask = {"model": "m", "max_tokens": 200, "tools": tools}
            ask["messages"] = [{"role": "user", "content": "What is the weather in Paris?"}]
            endpoint = f"{session['anthropic_base_url']}/v1/messages"
            use = httpx.post(endpoint, json=ask, headers=headers).json()["content"][-1]
            assert use["name"] == "ToolSearch"
            found = {"type": "tool_result", "tool_use_id": use["id"], "content": [REFERENCE]}
            ask["messages"] += [
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": [found]},
            ]
            second = httpx.post(endpoint, json=ask, headers=headers)
            assert second.status_code == 200, second.text
            path = f"{url}/sessions/{session['id']}/trajectory"
            trajectory = httpx.get(path, headers=headers).json()
    assert len(trajectory["sequences"]) == 1 and trajectory["breaks"]["clean"] == 1
    tokenizer = load_tokenizer("tiny")
    weather = {"type": "function", "function": WEATHER_FUNCTION}
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], tools=[weather], tokenize=False
    )
    line = next(row for row in rendered.splitlines() if '"get_weather"' in row)
    text = tokenizer.decode(trajectory["sequences"][0]["tokens"])
    assert f"<|im_start|>tool\n{line}<|im_end|>" in text  # the template's own line for it

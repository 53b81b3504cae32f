"""The OpenAI Responses dialect: `to_turn` unit by unit, then the official SDKs (openai's
`responses.create`/`responses.stream`, and an Agents SDK run with a function tool) against a small
Starlette app that answers through the module with canned results."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from openai.types.responses import Response
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from atropos.proxy.responses_api import (
    COMPACT_PROMPT,
    SUMMARY_PREFIX,
    ResponsesError,
    compact_to_turn,
    compacted,
    error_body,
    from_turn,
    stream_events,
    to_turn,
)
from atropos.proxy.turns import ProxyError, TurnChoice, TurnRequest, TurnResult
from atropos.testing import serve_in_thread

CALL: dict[str, Any] = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "add", "arguments": '{"a": 1}'},
}
ADD: Any = {
    "type": "function",
    "name": "add",
    "description": "Add numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
    "strict": False,
}


def result(
    content: str = "", calls: tuple[dict[str, Any], ...] = (), finish: str = ""
) -> TurnResult:
    finish = finish or ("tool_calls" if calls else "stop")
    choice = TurnChoice(content=content, tool_calls=list(calls), finish_reason=finish)
    return TurnResult([choice], prompt_tokens=7, completion_tokens=5, model="policy")


def turn(
    body: dict[str, Any], history: dict[str, list[dict[str, Any]]] | None = None
) -> TurnRequest:
    return to_turn({"model": "m", **body}, history)


# ---------------------------------------------------------------------------------------------
# to_turn


def test_a_string_input_is_one_user_message_after_the_instructions() -> None:
    request = turn({"input": "Hi", "instructions": "Be brief.", "max_output_tokens": 64})
    assert request.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    assert (request.tools, request.tool_choice, request.max_tokens) == (None, None, 64)


def test_messages_take_strings_or_text_parts_and_developer_is_system() -> None:
    request = turn(
        {
            "input": [
                {"role": "developer", "content": "Rules."},
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "a"},
                        {"type": "input_text", "text": "b"},
                    ],
                },
                {
                    "type": "message",
                    "role": "assistant",
                    "id": "msg_1",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "c", "annotations": []}],
                },
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {"role": "system", "content": "More rules."},
            ]
        }
    )
    assert request.messages == [
        {"role": "system", "content": "Rules."},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "c"},
        {"role": "system", "content": "More rules."},
    ]


def test_calls_join_the_assistant_text_before_them_and_outputs_become_tool_messages() -> None:
    call = {"type": "function_call", "call_id": "call_1", "name": "add", "arguments": '{"a": 1}'}
    second = {**call, "call_id": "call_2", "id": "fc_2", "status": "completed"}
    request = turn(
        {
            "input": [
                {"role": "user", "content": "add"},
                {"role": "assistant", "content": [{"type": "output_text", "text": "Sure."}]},
                call,
                second,
                {"type": "function_call_output", "call_id": "call_1", "output": "1"},
                {
                    "type": "function_call_output",
                    "call_id": "call_2",
                    "output": [{"type": "input_text", "text": "2"}],
                },
                call | {"call_id": "call_3"},
            ]
        }
    )
    ids = [c["id"] for c in request.messages[1]["tool_calls"]]
    assert request.messages[1]["content"] == "Sure." and ids == ["call_1", "call_2"]
    assert request.messages[1]["tool_calls"][0] == CALL
    assert request.messages[2:4] == [
        {"role": "tool", "tool_call_id": "call_1", "content": "1"},
        {"role": "tool", "tool_call_id": "call_2", "content": "2"},
    ]
    assert request.messages[4] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [CALL | {"id": "call_3"}],
    }


def test_tools_tool_choice_and_sampling_translate() -> None:
    request = turn(
        {
            "input": "x",
            "tools": [ADD, {"type": "function", "name": "noop"}],
            "tool_choice": {"type": "function", "name": "add"},
            "temperature": 0.5,
            "top_p": 1,
            "parallel_tool_calls": False,
            "store": True,
            "stream": False,
            "unknown_field": {"ignored": True},
        }
    )
    assert request.tools == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add numbers.",
                "parameters": ADD["parameters"],
            },
        },
        {
            "type": "function",
            "function": {
                "name": "noop",
                "description": "",
                "parameters": {"type": "object", "properties": {}},
            },
        },
    ]
    assert request.tool_choice == {"type": "function", "function": {"name": "add"}}
    assert request.sampling == {"temperature": 0.5, "top_p": 1}
    for choice in ("auto", "none", "required"):
        assert turn({"input": "x", "tools": [ADD], "tool_choice": choice}).tool_choice == choice


def test_previous_response_id_continues_its_conversation_without_its_instructions() -> None:
    kept: list[dict[str, Any]] = [
        {"role": "user", "content": "add"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
    ]
    history = {"resp_1": kept}
    request = turn(
        {
            "previous_response_id": "resp_1",
            "instructions": "New rules.",
            "input": [{"type": "function_call_output", "call_id": "call_1", "output": "1"}],
        },
        history,
    )
    assert request.messages == [
        {"role": "system", "content": "New rules."},
        *kept,
        {"role": "tool", "tool_call_id": "call_1", "content": "1"},
    ]
    assert history == {"resp_1": kept} and len(kept) == 2  # the history is left as it was
    assert turn({"previous_response_id": "resp_1"}, history).messages == kept


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"model": None, "input": "x"}, "model", "`model` is required"),
        ({"input": 3}, "input", "must be a string or a list"),
        ({"input": []}, "input", "`input` is required"),
        ({"input": ["hi"]}, "input[0]", "must be an object"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role", "one of user, assistant"),
        ({"input": [{"role": "user", "content": 5}]}, "input[0].content", "string or a list"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input[0].content[0].type",
            "text-only models",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text"}]}]},
            "input[0].content[0]",
            "must be a text part",
        ),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type", "reads only"),
        (
            {"input": [{"type": "function_call", "call_id": "c", "name": "f"}]},
            "input[0].arguments",
            "without a string `arguments`",
        ),
        (
            {"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]},
            "input[0].call_id",
            "no function_call with that call_id",
        ),
        (
            {"input": [{"type": "function_call_output", "output": "1"}]},
            "input[0].call_id",
            "call_id",
        ),
        (
            {
                "input": [
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": "c"},
                ]
            },
            "input[1].output",
            "without `output`",
        ),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type", "only function tools"),
        ({"input": "x", "tools": {"type": "function"}}, "tools", "must be a list"),
        ({"input": "x", "tools": [{"type": "function"}]}, "tools[0].name", "needs a `name`"),
        ({"input": "x", "tools": [ADD, ADD]}, "tools[1]", "repeats the tool name"),
        ({"input": "x", "tools": [ADD | {"description": 1}]}, "tools[0].description", "string"),
        ({"input": "x", "tools": [ADD | {"parameters": "x"}]}, "tools[0].parameters", "schema"),
        ({"input": "x", "tool_choice": "required"}, "tool_choice", "no `tools`"),
        (
            {"input": "x", "tool_choice": {"type": "function", "name": "f"}},
            "tool_choice.name",
            "not among",
        ),
        ({"input": "x", "tool_choice": {"type": "allowed_tools"}}, "tool_choice", "must be 'auto'"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens", "an integer from 1 to"),
        ({"input": "x", "max_output_tokens": 2**64}, "max_output_tokens", "an integer from 1 to"),
        ({"input": "x", "metadata": "x"}, "metadata", "expected an object"),
        ({"input": "x", "temperature": 3}, "temperature", "from 0 to 2"),
        ({"input": "x", "top_p": "1"}, "top_p", "from 0 to 1"),
        ({"input": "x", "stream": "yes"}, "stream", "a boolean"),
        ({"input": "x", "instructions": ["x"]}, "instructions", "a string"),
        ({"input": "x", "conversation": "conv_1"}, "conversation", "not supported"),
    ],
)
def test_bad_requests_are_400_naming_the_field(
    body: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(ProxyError) as caught:
        turn(body)
    assert (caught.value.status, caught.value.param) == (400, param)
    assert words in caught.value.message


def test_a_body_that_is_not_an_object_is_400() -> None:
    with pytest.raises(ProxyError, match="JSON object"):
        to_turn([], {})  # type: ignore[arg-type]


def test_an_unknown_previous_response_is_404() -> None:
    with pytest.raises(ResponsesError) as caught:
        turn({"input": "x", "previous_response_id": "resp_gone"}, {})
    assert (caught.value.status, caught.value.code) == (404, "previous_response_not_found")
    assert error_body(caught.value)["error"] == {
        "message": caught.value.message,
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": "previous_response_not_found",
    }


# ---------------------------------------------------------------------------------------------
# from_turn and stream_events without a server


def test_from_turn_keeps_the_conversation_without_instructions() -> None:
    body = {"model": "m", "input": "add", "instructions": "Rules.", "tools": [ADD]}
    response, kept = from_turn(result("", (CALL,)), body, to_turn(body))
    Response.model_validate(response)
    assert [item["type"] for item in response["output"]] == ["function_call"]
    assert response["tools"] == [ADD] and response["tool_choice"] == "auto"
    assert kept == [
        {"role": "user", "content": "add"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
    ]


def test_the_stream_rebuilds_the_response_in_order() -> None:
    body = {"model": "m", "input": "add", "tools": [ADD]}
    response, _ = from_turn(result("Adding.", (CALL,)), body, to_turn(body))
    events = [_sse(chunk) for chunk in stream_events(response)]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * 3,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * 3,
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert (
        events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    )
    assert events[-1]["response"] == response
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    arguments = "".join(e["delta"] for e in events if e["type"].endswith("arguments.delta"))
    assert (text, arguments) == ("Adding.", CALL["function"]["arguments"])
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.done"] == [0, 1]


def _sse(chunk: bytes) -> dict[str, Any]:
    head, data = chunk.decode().split("\n", 1)
    assert chunk.endswith(b"\n\n") and data.startswith("data: ")
    event = json.loads(data.removeprefix("data: "))
    assert head == f"event: {event['type']}"
    return dict(event)


# ---------------------------------------------------------------------------------------------
# End to end with the official SDKs


class Stub:
    """A stand-in for the session: answers each request with `answer(request)`, keeps what it
    was asked and the conversations of its responses."""

    def __init__(self, answer: Callable[[TurnRequest], TurnResult]) -> None:
        self.answer = answer
        self.requests: list[TurnRequest] = []
        self.history: dict[str, list[dict[str, Any]]] = {}

    def app(self) -> Starlette:
        async def responses(http: Request) -> Any:
            body = await http.json()
            try:
                request = to_turn(body, self.history)
            except ProxyError as err:
                return JSONResponse(error_body(err), status_code=err.status)
            self.requests.append(request)
            response, kept = from_turn(self.answer(request), body, request)
            if body.get("store") is not False:
                self.history[response["id"]] = kept
            if body.get("stream"):
                return StreamingResponse(stream_events(response), media_type="text/event-stream")
            return JSONResponse(response)

        return Starlette(routes=[Route("/v1/responses", responses, methods=["POST"])])


def tool_then_text(request: TurnRequest) -> TurnResult:
    """A call of `add` until a tool answered, then text naming the answer."""
    last = request.messages[-1]
    if last["role"] == "tool":
        return result(f"The sum is {last['content']}.")
    return result("", (CALL,))


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Stub, str]]:
    stub = Stub(tool_then_text)
    with serve_in_thread(stub.app()) as url:
        yield stub, f"{url}/v1"


@pytest.fixture
def client(served: tuple[Stub, str]) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served[1], api_key="k", max_retries=0) as sdk:
        yield sdk


def test_sdk_create_text(served: tuple[Stub, str], client: openai.OpenAI) -> None:
    stub, _ = served
    stub.answer = lambda request: result("Hello there.")
    raw = client.responses.with_raw_response.create(
        model="m", input="Hi", instructions="Be brief.", max_output_tokens=32, temperature=0
    )
    response = raw.parse()
    Response.model_validate(json.loads(raw.text))  # every field the model requires, typed
    assert response.output_text == "Hello there." and response.status == "completed"
    assert response.id.startswith("resp_") and response.instructions == "Be brief."
    assert response.usage is not None and response.usage.total_tokens == 12
    assert stub.requests[-1].sampling == {"temperature": 0}


def test_sdk_function_call_then_its_output(served: tuple[Stub, str], client: openai.OpenAI) -> None:
    stub, _ = served
    stub.answer = tool_then_text
    first = client.responses.create(model="m", input="add 1", tools=[ADD])
    (call,) = first.output
    assert call.type == "function_call" and (call.call_id, call.name) == ("call_1", "add")
    again: list[Any] = [item.model_dump(exclude_none=True) for item in first.output]
    output: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "1"}
    second = client.responses.create(
        model="m",
        input=[{"role": "user", "content": "add 1"}, *again, output],
        tools=[ADD],
    )
    assert second.output_text == "The sum is 1."
    assert stub.requests[-1].messages == [
        {"role": "user", "content": "add 1"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "1"},
    ]
    chained = client.responses.create(
        model="m",
        previous_response_id=first.id,
        input=[output],
        tools=[ADD],
    )
    assert chained.output_text == "The sum is 1." and chained.previous_response_id == first.id
    assert stub.requests[-1].messages == stub.requests[-2].messages


def test_sdk_length_is_incomplete(served: tuple[Stub, str], client: openai.OpenAI) -> None:
    served[0].answer = lambda request: result("Once upon a", finish="length")
    response = client.responses.create(model="m", input="story", max_output_tokens=3)
    assert (response.status, response.output_text) == ("incomplete", "Once upon a")
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    events = list(client.responses.create(model="m", input="story", stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output[0].status == "incomplete"  # type: ignore[union-attr]


def test_sdk_stream_text_and_call(served: tuple[Stub, str], client: openai.OpenAI) -> None:
    served[0].answer = lambda request: result("Let me add.", (CALL,))
    with client.responses.stream(model="m", input="add 1", tools=[ADD]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final.output_text == "Let me add."
    assert [item.type for item in final.output] == ["message", "function_call"]
    assert final.output[1].arguments == '{"a": 1}'  # type: ignore[union-attr]
    events = list(client.responses.create(model="m", input="add 1", tools=[ADD], stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_sdk_bad_requests_raise_its_errors(served: tuple[Stub, str], client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="m", input="x", tools=[{"type": "web_search"}])
    assert bad.value.status_code == 400 and "only function tools" in bad.value.message
    assert bad.value.param == "tools[0].type"
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(model="m", input="x", previous_response_id="resp_gone")
    assert missing.value.code == "previous_response_not_found"


def test_agents_sdk_runs_a_tool_then_answers(served: tuple[Stub, str]) -> None:
    import agents

    stub, base_url = served
    stub.answer = tool_then_text
    agents.set_tracing_disabled(True)
    used: list[int] = []

    @agents.function_tool
    def add(a: int) -> str:
        """Add the numbers."""
        used.append(a)
        return str(a)

    async def run(streamed: bool) -> Any:
        sdk = openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0)
        model = agents.OpenAIResponsesModel(model="m", openai_client=sdk)
        agent = agents.Agent(name="adder", instructions="Add.", tools=[add], model=model)
        try:
            if not streamed:
                return await agents.Runner.run(agent, "add 1")
            running = agents.Runner.run_streamed(agent, "add 1")
            async for _ in running.stream_events():
                pass
            return running
        finally:
            await sdk.close()

    for streamed in (False, True):
        outcome = asyncio.run(run(streamed))
        assert outcome.final_output == "The sum is 1."
        messages = stub.requests[-1].messages
        assert messages[0] == {"role": "system", "content": "Add."}
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert used == [1, 1]


# ---------------------------------------------------------------------------------------------
# Compaction: /v1/responses/compact through the proxy


def summarizer(prompt: str) -> str:
    if COMPACT_PROMPT in prompt:
        return "The user wants 1 added; add was called and gave 2."
    if "<|im_start|>tool" in prompt:
        return "It is 2."
    return '<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>'


def test_compaction_summarizes_and_the_next_call_starts_a_new_sequence() -> None:
    """The openai SDK's `responses.compact` over the proxy and the fake server: the summary is
    the policy's own answer, carried in a compaction item (the user messages before it); sent
    back as input it is read as the summary, and that call starts a new sequence (a break)."""
    import httpx

    from atropos.proxy.app import build_app
    from atropos.testing import FakeInferenceServer

    from .helpers import make_proxy

    with FakeInferenceServer(responder=summarizer) as fake:
        with serve_in_thread(build_app(make_proxy(fake.base_url))) as url:
            session = httpx.post(f"{url}/sessions", json={}).json()
            client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
            first = client.responses.create(model="m", input="add 1", tools=[ADD])
            [call] = [item for item in first.output if item.type == "function_call"]
            output = {"type": "function_call_output", "call_id": call.call_id, "output": "2"}
            second = client.responses.create(
                model="m", previous_response_id=first.id, input=[output], tools=[ADD]
            )
            assert second.output_text == "It is 2."
            compact = client.responses.compact(model="m", previous_response_id=second.id)
            assert compact.object == "response.compaction"
            user, kept = compact.output
            assert user.type == "message" and user.role == "user"
            assert kept.type == "compaction" and compact.usage.output_tokens > 0
            items: Any = [i.model_dump(exclude_none=True, warnings=False) for i in compact.output]
            items.append({"role": "user", "content": "And now?"})
            third = client.responses.create(model="m", input=items, tools=[ADD])
            assert third.output_text or third.output
            headers = {"authorization": f"Bearer {session['api_key']}"}
            path = f"{url}/sessions/{session['id']}/trajectory"
            trajectory = httpx.get(path, headers=headers).json()
            with pytest.raises(openai.BadRequestError, match="compaction item this proxy did not"):
                forged = {"type": "compaction", "encrypted_content": "gAAAAB-not-ours"}
                client.responses.create(model="m", input=[forged])
    assert trajectory["turns"] == 4
    # the conversation (2 calls), the summary, the compacted conversation: 3 sequences
    assert len(trajectory["sequences"]) == 3
    assert trajectory["breaks"]["fork"] + trajectory["breaks"]["new"] == 2
    summary_row, compacted_row = trajectory["sequences"][1:]
    assert summary_row["messages"][-2] == {"role": "user", "content": COMPACT_PROMPT}
    said = compacted_row["messages"][1]["content"]
    assert said == SUMMARY_PREFIX + "The user wants 1 added; add was called and gave 2."


def test_compact_requests_are_read_as_the_conversation_and_the_summary_prompt() -> None:
    request = compact_to_turn({"model": "m", "input": "add 1", "tools": [ADD]})
    assert request.tools is None and request.messages[-1]["content"] == COMPACT_PROMPT
    answer = compacted(result("a summary"), request)
    assert [item["type"] for item in answer["output"]] == ["message", "compaction"]
    back = turn({"input": answer["output"]}).messages
    assert back == [
        {"role": "user", "content": "add 1"},
        {"role": "user", "content": SUMMARY_PREFIX + "a summary"},
    ]
    with pytest.raises(ResponsesError, match="compaction item this proxy did not make"):
        turn({"input": [{"type": "compaction", "encrypted_content": "atropos-compaction-v1:%%"}]})
    with pytest.raises(ResponsesError, match="`model` is required"):
        compact_to_turn({"input": "x"})

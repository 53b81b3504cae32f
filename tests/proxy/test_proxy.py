"""The rollout proxy end to end: the official `openai` SDK against `atropos.proxy` over the fake
inference server; sessions, trajectories, breaks, limits, bad input and upstream's routes."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from atropos.proxy.app import Proxy, build_app
from atropos.proxy.session import Limits
from atropos.testing import FakeInferenceServer, serve_in_thread

from .helpers import make_proxy

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
HELLO: Any = [{"role": "user", "content": "hi"}]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def responder(prompt: str) -> str:
    """Calls `add` until a tool result is in the prompt, then answers; echoes a task marker."""
    marker = re.findall(r"task-(\d+)", prompt)
    tag = f" [task-{marker[-1]}]" if marker else ""
    if "# Tools" in prompt and "<|im_start|>tool" not in prompt:
        return CALL
    if "broken" in prompt:
        return '<tool_call>{"name": "add", "arguments": 5}</tool_call>'
    return f"The answer is 5.{tag}"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeInferenceServer]:
    with FakeInferenceServer(responder=responder) as server:
        yield server


@contextlib.contextmanager
def running(proxy: Proxy) -> Iterator[str]:
    with serve_in_thread(build_app(proxy)) as url:
        yield url


def new_session(url: str, **body: Any) -> dict[str, Any]:
    answer = httpx.post(f"{url}/sessions", json=body)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def trajectory(url: str, session: dict[str, Any]) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {session['api_key']}"}
    answer = httpx.get(f"{url}/sessions/{session['id']}/trajectory", headers=headers)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def tool_loop(client: openai.OpenAI, task: str = "What is 2 + 3?", stream: bool = False) -> str:
    """The agent: ask, run the tool call it gets, send the result back, read the answer."""
    messages: list[Any] = [{"role": "user", "content": task}]
    first = client.chat.completions.create(
        model="atropos-tiny", messages=messages, tools=TOOLS, max_tokens=200
    )
    [call] = first.choices[0].message.tool_calls or []
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "add" and call.function.arguments == '{"a": 2, "b": 3}'
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
    if stream:
        chunks = client.chat.completions.create(
            model="atropos-tiny", messages=messages, tools=TOOLS, max_tokens=200, stream=True
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    second = client.chat.completions.create(
        model="atropos-tiny", messages=messages, tools=TOOLS, max_tokens=200
    )
    return second.choices[0].message.content or ""


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_loop_is_one_sequence_of_the_servers_own_tokens(fake, stream):
    proxy = make_proxy(fake.base_url)
    tok = proxy.tokenizer
    with running(proxy) as url:
        session = new_session(url)
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
        assert tool_loop(client, stream=stream) == "The answer is 5."
        doc = trajectory(url, session)
    assert doc["turns"] == 2 and doc["breaks"] == {"clean": 1, "realign": 0, "fork": 0, "new": 0}
    [seq] = doc["sequences"]
    tokens, masks, logprobs = seq["tokens"], seq["masks"], seq["logprobs"]
    assert len(tokens) == len(masks) == len(logprobs)
    outputs = proxy.server.recording.outputs
    assert [(s["end"] - s["start"]) for s in seq["spans"]] == [len(o) for o, _ in outputs]
    for span, (ids, lps) in zip(seq["spans"], outputs, strict=True):  # the server's own ids
        assert tokens[span["start"] : span["end"]] == ids
        assert masks[span["start"] : span["end"]] == ids
        assert logprobs[span["start"] : span["end"]] == lps
    trained = {i for s in seq["spans"] for i in range(s["start"], s["end"])}
    for i, (mask, lp) in enumerate(zip(masks, logprobs, strict=True)):
        if i not in trained:  # the prompt, the tool result and the template: masked
            assert mask == -100 and lp == 1.0
    assert CALL in tok.decode(tokens) and "<|im_start|>tool\n5<|im_end|>" in tok.decode(tokens)
    assert seq["token_source"] == "server"


def test_rewritten_history_starts_a_new_counted_sequence(fake):
    proxy = make_proxy(fake.base_url)
    with running(proxy) as url:
        session = new_session(url)
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
        tool_loop(client)
        edited = [  # the agent rewrites its first turn, then continues
            {"role": "user", "content": "What is 2 + 3, exactly?"},
            {"role": "assistant", "content": "The answer is 5."},
            {"role": "user", "content": "And again?"},
        ]
        client.chat.completions.create(model="m", messages=edited, max_tokens=50)
        summary = [{"role": "user", "content": "Summarise: the answer was 5."}]  # a sub-agent
        client.chat.completions.create(model="m", messages=summary, max_tokens=50)
        doc = trajectory(url, session)
    assert doc["turns"] == 4 and len(doc["sequences"]) == 3
    assert doc["breaks"]["clean"] == 1 and doc["breaks"]["fork"] + doc["breaks"]["new"] == 2


def test_64_concurrent_sessions_never_mix(fake):
    proxy = make_proxy(fake.base_url)
    with running(proxy) as url:
        sessions = [new_session(url) for _ in range(64)]

        async def agent(i: int, session: dict[str, Any]) -> str:
            client = openai.AsyncOpenAI(base_url=session["base_url"], api_key=session["api_key"])
            messages: list[Any] = [{"role": "user", "content": f"task-{i}: say the answer"}]
            for _ in range(2):
                reply = await client.chat.completions.create(
                    model="m", messages=messages, max_tokens=60
                )
                messages += [reply.choices[0].message.model_dump(exclude_none=True)]
                messages += [{"role": "user", "content": f"task-{i}: once more"}]
            await client.close()
            return str(messages[-2]["content"])

        async def main() -> list[str]:
            return await asyncio.gather(*(agent(i, s) for i, s in enumerate(sessions)))

        answers = asyncio.run(main())
        docs = [trajectory(url, s) for s in sessions]
    tok = proxy.tokenizer
    for i, (answer, doc) in enumerate(zip(answers, docs, strict=True)):
        assert answer.endswith(f"[task-{i}]")
        [seq] = doc["sequences"]
        text = tok.decode(seq["tokens"])
        assert set(re.findall(r"task-(\d+)", text)) == {str(i)}, text
        assert doc["turns"] == 2 and doc["breaks"]["clean"] == 1


def test_bad_input_gets_a_4xx_and_leaves_other_sessions_untouched(fake):
    proxy = make_proxy(fake.base_url, max_body_bytes=4096)
    with running(proxy) as url:
        good, other = new_session(url), new_session(url)
        client = openai.OpenAI(base_url=good["base_url"], api_key=good["api_key"])
        tool_loop(client)
        before = trajectory(url, good)
        chat = "/v1/chat/completions"
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        cases = {
            "unknown session": (f"{url}/s/nope/v1{chat}", good["api_key"], body, 404),
            "wrong key on its path": (
                f"{url}/s/{good['id']}{chat}",
                other["api_key"],
                body,
                401,
            ),
            "no session has the key": (f"{url}{chat}", "sk-atropos-guess", body, 401),
            "malformed tools": (
                f"{url}{chat}",
                good["api_key"],
                {**body, "tools": [{"type": "function", "function": {"description": "x"}}]},
                400,
            ),
            "non-function tools": (
                f"{url}{chat}",
                good["api_key"],
                {**body, "tools": [{"type": "web_search"}]},
                400,
            ),
            "no messages": (f"{url}{chat}", good["api_key"], {"model": "m"}, 400),
            "oversize body": (
                f"{url}{chat}",
                good["api_key"],
                {**body, "messages": [{"role": "user", "content": "x" * 5000}]},
                413,
            ),
        }
        for name, (target, key, payload, status) in cases.items():
            answer = httpx.post(target, json=payload, headers={"authorization": f"Bearer {key}"})
            assert answer.status_code == status, (name, answer.text)
            error = answer.json()["error"]
            assert error["message"] and error["type"], name
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong").chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
        assert trajectory(url, good) == before
        assert trajectory(url, other)["turns"] == 0


def test_plain_v1_paths_find_the_session_by_its_key(fake):
    proxy = make_proxy(fake.base_url)
    with running(proxy) as url:
        session = new_session(url)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=session["api_key"])
        assert tool_loop(client) == "The answer is 5."
        assert [m.id for m in client.models.list().data] == ["atropos-tiny"]
        assert trajectory(url, session)["turns"] == 2


def test_one_client_with_the_proxy_key_reaches_sessions_by_their_header(fake):
    """A multiplexing client (verifiers' interception server) keeps one pool and one key and
    names each rollout in `X-Session-ID`: an alias or the session id routes it."""
    proxy = make_proxy(fake.base_url, api_key="admin-key")
    with running(proxy) as url:
        admin = {"authorization": "Bearer admin-key"}
        a, b = (httpx.post(f"{url}/sessions", headers=admin).json() for _ in range(2))
        proxy.alias("trace-a", a["id"])
        with pytest.raises(ValueError, match="already names session"):
            proxy.alias("trace-a", b["id"])
        shared = openai.OpenAI(base_url=f"{url}/v1", api_key="admin-key")
        for name, task in (("trace-a", "task-1"), (b["id"], "task-2")):
            shared.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": task}],
                extra_headers={"X-Session-ID": name},
            )
        turns = {s["id"]: trajectory(url, s)["turns"] for s in (a, b)}
        assert turns == {a["id"]: 1, b["id"]: 1}
        with pytest.raises(openai.NotFoundError, match="unknown or expired session"):
            shared.chat.completions.create(
                model="m", messages=HELLO, extra_headers={"X-Session-ID": "trace-z"}
            )
        proxy.delete(a["id"])
        with pytest.raises(openai.NotFoundError):  # the alias went with its session
            shared.chat.completions.create(
                model="m", messages=HELLO, extra_headers={"X-Session-ID": "trace-a"}
            )
        own = openai.OpenAI(base_url=f"{url}/v1", api_key=b["api_key"])
        own.chat.completions.create(  # without the proxy key the header is not read
            model="m", messages=HELLO, extra_headers={"X-Session-ID": a["id"]}
        )
        assert trajectory(url, b)["turns"] == 2


def test_limits_reward_and_delete(fake):
    proxy = make_proxy(fake.base_url, limits=Limits(max_turns=2))
    with running(proxy) as url:
        session = new_session(url)
        client = openai.OpenAI(
            base_url=session["base_url"], api_key=session["api_key"], max_retries=0
        )
        tool_loop(client)
        with pytest.raises(openai.BadRequestError, match="max_turns=2"):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        headers = {"authorization": f"Bearer {session['api_key']}"}
        posted = httpx.post(f"{url}/sessions/{session['id']}/reward", json={"reward": 0.5},
                            headers=headers)  # fmt: skip
        assert posted.status_code == 200 and trajectory(url, session)["reward"] == 0.5
        bad = httpx.post(f"{url}/sessions/{session['id']}/reward", json={"reward": "high"},
                         headers=headers)  # fmt: skip
        assert bad.status_code == 400 and "reward" in bad.json()["error"]["message"]
        capped = new_session(url, limits={"max_tokens": 5})
        small = openai.OpenAI(base_url=capped["base_url"], api_key=capped["api_key"])
        reply = small.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hello"}], max_tokens=100
        )
        assert reply.usage is not None and reply.usage.completion_tokens <= 5
        assert httpx.delete(f"{url}/sessions/{session['id']}", headers=headers).status_code == 200
        assert httpx.get(f"{url}/sessions/{session['id']}/trajectory",
                         headers=headers).status_code == 404  # fmt: skip
        refused = httpx.post(f"{url}/sessions", json={"limits": {"max_turns": -1}})
        assert refused.status_code == 400 and "max_turns" in refused.json()["error"]["message"]


def test_malformed_tool_calls_come_back_as_text_and_are_counted(fake):
    proxy = make_proxy(fake.base_url)
    with running(proxy) as url:
        session = new_session(url)
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
        messages: list[Any] = [
            {"role": "user", "content": "broken"},
            {"role": "assistant", "content": "calling"},
            {"role": "tool", "tool_call_id": "c", "content": "1"},
        ]
        reply = client.chat.completions.create(
            model="m", messages=messages, tools=TOOLS, max_tokens=100
        )
        message = reply.choices[0].message
        assert not message.tool_calls and "<tool_call>" in (message.content or "")
        assert trajectory(url, session)["unparsed_tool_calls"] == 1


def test_a_text_only_server_is_retokenized_and_says_so(fake):
    proxy = make_proxy(fake.base_url, server_type="openai")
    with running(proxy) as url:
        session = new_session(url)
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
        for turn in range(2):
            reply = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"task-{turn}"}], max_tokens=50
            )
            assert reply.choices[0].message.content
        doc = trajectory(url, session)
    assert len(doc["sequences"]) == 2 and doc["breaks"]["new"] == 1
    for seq in doc["sequences"]:
        assert seq["token_source"] == "retokenized" and seq["logprobs"] is None
        assert any(m != -100 for m in seq["masks"])


def test_upstreams_managed_server_proxy_routes(fake):
    proxy = make_proxy(fake.base_url)
    with running(proxy) as url:
        created = httpx.post(f"{url}/sessions/create", json={"tool_parser": "hermes"}).json()
        assert {"uuid", "model_name", "tool_parser", "base_url", "created_at"} <= set(created)
        client = openai.OpenAI(base_url=f"{url}/{created['uuid']}/v1", api_key="unused")
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], tools=TOOLS, max_tokens=200
        )
        assert reply.choices[0].message.tool_calls
        nodes = httpx.get(f"{url}/{created['uuid']}/nodes").json()["nodes"]
        assert len(nodes) == 1 and len(nodes[0]["tokens"]) == len(nodes[0]["logprobs"])
        assert httpx.delete(f"{url}/{created['uuid']}").json() == {
            "status": "deleted",
            "uuid": created["uuid"],
        }
        assert httpx.get(f"{url}/{created['uuid']}/nodes").status_code == 404


def test_an_api_key_guards_session_management(fake):
    proxy = make_proxy(fake.base_url, api_key="admin-key")
    with running(proxy) as url:
        assert httpx.post(f"{url}/sessions").status_code == 401
        assert httpx.post(f"{url}/sessions/create").status_code == 401
        admin = {"authorization": "Bearer admin-key"}
        session = httpx.post(f"{url}/sessions", headers=admin).json()
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        listed = httpx.get(f"{url}/sessions", headers=admin).json()["sessions"]
        assert [s["id"] for s in listed] == [session["id"]]
        assert httpx.get(f"{url}/health").json()["sessions"] == 1


def test_idle_sessions_expire(fake):
    proxy = make_proxy(fake.base_url, session_ttl=60)

    async def main() -> None:
        session = await proxy.create_session()
        assert proxy.expire(now=session.last_used + 30) == 0
        assert proxy.expire(now=session.last_used + 61) == 1
        assert not proxy.sessions

    asyncio.run(main())


def test_the_responses_api_and_the_agents_sdk_through_the_proxy(fake):
    agents = pytest.importorskip("agents")
    proxy = make_proxy(fake.base_url)
    with running(proxy) as url:
        session = new_session(url)
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
        tools: Any = [{"type": "function", **TOOLS[0]["function"]}]
        first = client.responses.create(
            model="m", input="What is 2 + 3?", tools=tools, max_output_tokens=200
        )
        [call] = [item for item in first.output if item.type == "function_call"]
        assert (call.name, call.arguments) == ("add", '{"a": 2, "b": 3}')
        second = client.responses.create(
            model="m",
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": "5"}],
            tools=tools,
            max_output_tokens=200,
        )
        assert second.output_text == "The answer is 5."
        doc = trajectory(url, session)
        assert doc["turns"] == 2 and len(doc["sequences"]) == 1 and doc["breaks"]["clean"] == 1

        agent_session = new_session(url)
        agents.set_tracing_disabled(True)

        @agents.function_tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        model = agents.OpenAIResponsesModel(
            model="atropos-tiny",
            openai_client=openai.AsyncOpenAI(
                base_url=agent_session["base_url"], api_key=agent_session["api_key"]
            ),
        )
        agent = agents.Agent(
            name="adder",
            instructions="Use the tool.",
            tools=[add],
            model=model,
            model_settings=agents.ModelSettings(max_tokens=200),
        )
        run = asyncio.run(agents.Runner.run(agent, "What is 2 + 3?"))
        assert run.final_output == "The answer is 5."
        doc = trajectory(url, agent_session)
    assert doc["turns"] == 2 and len(doc["sequences"]) == 1 and doc["breaks"]["clean"] == 1
    [seq] = doc["sequences"]
    assert len(seq["spans"]) == 2 and seq["token_source"] == "server"


@pytest.mark.parametrize("stream", [False, True])
def test_the_anthropic_sdk_through_the_proxy(fake, stream):
    anthropic = pytest.importorskip("anthropic")
    proxy = make_proxy(fake.base_url)
    tools: Any = [
        {
            "name": "add",
            "description": "Add two integers.",
            "input_schema": TOOLS[0]["function"]["parameters"],
        }
    ]
    with running(proxy) as url:
        session = new_session(url)
        client = anthropic.Anthropic(
            base_url=session["anthropic_base_url"], api_key=session["api_key"]
        )
        messages: list[Any] = [{"role": "user", "content": "What is 2 + 3?"}]
        first = client.messages.create(
            model="atropos-tiny", max_tokens=200, messages=messages, tools=tools
        )
        assert first.stop_reason == "tool_use"
        [use] = [block for block in first.content if block.type == "tool_use"]
        assert (use.name, use.input) == ("add", {"a": 2, "b": 3})
        messages += [
            {"role": "assistant", "content": [b.model_dump() for b in first.content]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "5"}],
            },
        ]
        if stream:
            with client.messages.stream(
                model="atropos-tiny", max_tokens=200, messages=messages, tools=tools
            ) as events:
                text = "".join(events.text_stream)
        else:
            second = client.messages.create(
                model="atropos-tiny", max_tokens=200, messages=messages, tools=tools
            )
            text = "".join(b.text for b in second.content if b.type == "text")
        assert text == "The answer is 5."
        doc = trajectory(url, session)
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=url, api_key="wrong").messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
            )
    assert doc["turns"] == 2 and len(doc["sequences"]) == 1 and doc["breaks"]["clean"] == 1


def test_a_long_conversations_calls_send_ids_spelt_from_the_last_calls_json(fake, monkeypatch):
    """Through the proxy (its ManagedServer's rows reused): every call after the first sends
    its prompt ids as JSON made from the last call's (`prompt_json`), the same bytes as their
    own encoding, and the trajectory is the server's own tokens, every answer trainable."""
    import msgspec

    from atropos.inference import prompt_json, vllm

    spelt: list[tuple[bool, bool]] = []  # (from a prefix, equal to the ids' own JSON)

    def recording(ids: list[int]) -> bytes:
        known = prompt_json.PROMPT_JSON.get()
        made = prompt_json.ids_json(ids)
        prefixed = known is not None and known.ids is ids and known.prefix is not None
        spelt.append((prefixed, made == msgspec.json.encode(ids)))
        return made

    monkeypatch.setattr(vllm, "ids_json", recording)
    proxy = make_proxy(fake.base_url)
    with running(proxy) as url:
        session = new_session(url)
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
        messages: list[Any] = [{"role": "user", "content": "Read this. " * 300}]
        for turn in range(5):
            reply = client.chat.completions.create(
                model="atropos-tiny", messages=messages, max_tokens=20
            )
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            messages.append({"role": "user", "content": f"And step {turn}?"})
        doc = trajectory(url, session)
    assert spelt == [(False, True)] + [(True, True)] * 4
    assert doc["turns"] == 5 and doc["breaks"]["clean"] == 4
    [seq] = doc["sequences"]
    outputs = proxy.server.recording.outputs
    assert len(seq["spans"]) == 5
    for span, (ids, _) in zip(seq["spans"], outputs, strict=True):
        assert seq["tokens"][span["start"] : span["end"]] == ids
        assert seq["masks"][span["start"] : span["end"]] == ids

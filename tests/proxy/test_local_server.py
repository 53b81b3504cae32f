"""The proxy over `atropos local serve` (the tiny policy on CPU): what an agent's calls generate
is the server's own tokens and logprobs, across turns, streamed or not."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

pytest.importorskip("torch")

from atropos.proxy.app import build_app  # noqa: E402
from atropos.testing import serve_in_thread  # noqa: E402
from atropos.testing.serve import local_tiny_server  # noqa: E402

from .helpers import make_proxy  # noqa: E402


@pytest.fixture(scope="module")
def local_url() -> Iterator[str]:
    with local_tiny_server(max_model_len=2048) as url:
        yield url


@pytest.mark.parametrize("stream", [False, True])
def test_a_multi_turn_chat_is_the_local_servers_own_tokens(local_url, stream):
    proxy = make_proxy(local_url)
    with serve_in_thread(build_app(proxy)) as url:
        session = httpx.post(f"{url}/sessions").json()
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
        messages: list[Any] = [{"role": "user", "content": "What is 3 + 4?"}]
        for follow_up in ("And 5 + 6?", "And 1 + 1?"):
            if stream:
                chunks = client.chat.completions.create(
                    model="atropos-tiny", messages=messages, max_tokens=24, stream=True
                )
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                reply = client.chat.completions.create(
                    model="atropos-tiny", messages=messages, max_tokens=24
                )
                text = reply.choices[0].message.content or ""
            messages += [{"role": "assistant", "content": text}]
            messages += [{"role": "user", "content": follow_up}]
        headers = {"authorization": f"Bearer {session['api_key']}"}
        doc = httpx.get(f"{url}/sessions/{session['id']}/trajectory", headers=headers).json()
    outputs = proxy.server.recording.outputs
    assert doc["turns"] == 2 and len(outputs) == 2
    [seq] = doc["sequences"]  # the second call extended the first: one sequence
    assert doc["breaks"]["clean"] + doc["breaks"]["realign"] == 1
    for span, (ids, logprobs) in zip(seq["spans"], outputs, strict=True):
        assert seq["tokens"][span["start"] : span["end"]] == ids
        assert seq["logprobs"][span["start"] : span["end"]] == logprobs
        assert all(lp <= 0 for lp in logprobs)
        assert span["policy_version"] == 0  # the local server reports its weights' version
    trained = [i for i, m in enumerate(seq["masks"]) if m != -100]
    assert trained == [i for s in seq["spans"] for i in range(s["start"], s["end"])][: len(trained)]


def test_text_completions_through_the_proxy(local_url):
    proxy = make_proxy(local_url)
    with serve_in_thread(build_app(proxy)) as url:
        session = httpx.post(f"{url}/sessions").json()
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
        reply = client.completions.create(model="atropos-tiny", prompt="1 + 1 =", max_tokens=8)
        assert reply.choices[0].text is not None and reply.usage is not None
    [(ids, _)] = proxy.server.recording.outputs
    assert reply.usage.completion_tokens == len(ids)


def test_the_responses_api_with_tools_over_the_local_server(local_url):
    proxy = make_proxy(local_url)
    tools: Any = [
        {
            "type": "function",
            "name": "add",
            "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        }
    ]
    with serve_in_thread(build_app(proxy)) as url:
        session = httpx.post(f"{url}/sessions").json()
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
        first = client.responses.create(
            model="atropos-tiny", input="What is 3 + 4?", tools=tools, max_output_tokens=24
        )
        second = client.responses.create(
            model="atropos-tiny",
            previous_response_id=first.id,
            input="And 5 + 6?",
            tools=tools,
            max_output_tokens=24,
        )
        assert second.status in ("completed", "incomplete")
        headers = {"authorization": f"Bearer {session['api_key']}"}
        doc = httpx.get(f"{url}/sessions/{session['id']}/trajectory", headers=headers).json()
    [seq] = doc["sequences"]  # the second call continued the first
    tokens = seq["tokens"]
    assert "# Tools" in proxy.tokenizer.decode(tokens)  # the template rendered the tools
    for span, (ids, logprobs) in zip(seq["spans"], proxy.server.recording.outputs, strict=True):
        assert tokens[span["start"] : span["end"]] == ids
        assert seq["logprobs"][span["start"] : span["end"]] == logprobs

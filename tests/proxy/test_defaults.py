"""A call that names no token limit gets vLLM's defaults through the proxy: a chat (or a
Responses call) may write the rest of the context, bounded by the session's budget; a text
completion gets 16 tokens (null: the rest of the context)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from atropos.proxy.app import build_app
from atropos.proxy.session import _CONTEXT, context_length
from atropos.testing import FakeInferenceServer, serve_in_thread

from .helpers import make_proxy

LONG = " ".join(f"word{i}" for i in range(60))  # about 200 tokens, then eos
CONTEXT = 512
HELLO: Any = [{"role": "user", "content": "Say many words."}]


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeInferenceServer]:
    def responder(prompt: str) -> str:
        return LONG * 10 if "endless" in prompt else LONG

    with FakeInferenceServer(responder=responder, max_model_len=CONTEXT) as server:
        yield server


@pytest.fixture
def proxy_url(fake: FakeInferenceServer) -> Iterator[str]:
    with serve_in_thread(build_app(make_proxy(fake.base_url))) as url:
        yield url


def client(url: str, **body: Any) -> openai.OpenAI:
    session = httpx.post(f"{url}/sessions", json=body).json()
    return openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)


def test_a_chat_without_max_tokens_writes_past_16_tokens_and_stops_by_itself(proxy_url):
    for extra in ({}, {"max_tokens": None}, {"max_completion_tokens": None}):
        reply = client(proxy_url).chat.completions.create(
            model="atropos-tiny", messages=HELLO, **extra
        )
        assert reply.usage is not None and reply.usage.completion_tokens > 16
        assert reply.choices[0].finish_reason == "stop"
        assert reply.choices[0].message.content == LONG


def test_a_chat_without_max_tokens_ends_at_the_context_end(proxy_url):
    messages: Any = [{"role": "user", "content": "Say endless words."}]
    reply = client(proxy_url).chat.completions.create(model="atropos-tiny", messages=messages)
    assert reply.usage is not None and reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens + reply.usage.completion_tokens == CONTEXT


def test_the_session_budget_bounds_a_call_without_max_tokens(proxy_url):
    chat = client(proxy_url, limits={"max_tokens": 20})
    reply = chat.chat.completions.create(model="atropos-tiny", messages=HELLO)
    assert reply.usage is not None and reply.usage.completion_tokens == 20
    assert reply.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="max_tokens=20"):
        chat.chat.completions.create(model="atropos-tiny", messages=HELLO)


def test_a_responses_call_without_max_output_tokens_writes_past_16_tokens(proxy_url):
    reply = client(proxy_url).responses.create(model="atropos-tiny", input="Say many words.")
    assert reply.status == "completed" and reply.output_text == LONG
    assert reply.usage is not None and reply.usage.output_tokens > 16


def test_a_text_completion_without_max_tokens_gets_16_and_null_the_rest(proxy_url):
    openai_client = client(proxy_url)
    reply = openai_client.completions.create(model="atropos-tiny", prompt="Say many words.")
    assert reply.usage is not None and reply.usage.completion_tokens == 16
    assert reply.choices[0].finish_reason == "length"
    reply = openai_client.completions.create(
        model="atropos-tiny", prompt="Say many words.", max_tokens=None
    )
    assert reply.usage is not None and reply.usage.completion_tokens > 16
    assert reply.choices[0].finish_reason == "stop"


def test_context_length_is_the_model_cards_and_asked_once(fake):
    proxy = make_proxy(fake.base_url)
    backend = proxy.server.recording.backend
    assert backend not in _CONTEXT
    before = fake.requests["/v1/models"]
    assert asyncio.run(context_length(backend)) == CONTEXT
    assert asyncio.run(context_length(backend)) == CONTEXT
    assert fake.requests["/v1/models"] == before + 1
    assert asyncio.run(context_length(object())) is None  # cannot be asked: the server's default


def test_a_stale_context_length_is_asked_again_after_a_refusal(fake):
    proxy = make_proxy(fake.base_url)
    backend = proxy.server.recording.backend
    _CONTEXT[backend] = 100 * CONTEXT  # as if the server had restarted with a shorter context
    with serve_in_thread(build_app(proxy)) as url:
        chat = client(url)
        with pytest.raises(openai.BadRequestError, match="maximum context length"):
            chat.chat.completions.create(model="atropos-tiny", messages=HELLO)
        assert backend not in _CONTEXT
        reply = chat.chat.completions.create(model="atropos-tiny", messages=HELLO)
    assert reply.choices[0].message.content == LONG and _CONTEXT[backend] == CONTEXT

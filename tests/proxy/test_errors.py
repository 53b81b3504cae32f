"""Who is at fault, by status: a client's bad request is a 400 naming the field, in its dialect's
error shape; the inference server's own 4xx is passed on as that status; 502 only when the
server is unreachable or fails (5xx), 504 when it does not answer in time; a bug in the proxy a
logged 500. None of them is the old catch-all 502 "the inference server call failed"."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from jinja2 import TemplateError

from atropos.inference.errors import InferenceError, InferenceTimeout
from atropos.proxy.app import Proxy, build_app
from atropos.proxy.routes import inference_failure
from atropos.proxy.session import Session
from atropos.testing import FakeInferenceServer, serve_in_thread

from .helpers import make_proxy

HELLO: Any = [{"role": "user", "content": "hi"}]
BODIES: dict[str, dict[str, Any]] = {  # a good body per dialect
    "chat/completions": {"model": "m", "messages": HELLO, "max_tokens": 8},
    "completions": {"model": "m", "prompt": "hi", "max_tokens": 8},
    "responses": {"model": "m", "input": "hi", "max_output_tokens": 8},
    "messages": {"model": "m", "messages": HELLO, "max_tokens": 8},
}
LIMIT = {"responses": "max_output_tokens"}  # the dialect's token limit field


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeInferenceServer]:
    with FakeInferenceServer(responder=lambda prompt: "hello") as server:
        yield server


@contextlib.contextmanager
def session_url(proxy: Proxy) -> Iterator[tuple[httpx.Client, str]]:
    """A client with a new session's key, and the session's `/s/{id}/v1` root."""
    with serve_in_thread(build_app(proxy)) as url:
        made = httpx.post(f"{url}/sessions").json()
        headers = {"authorization": f"Bearer {made['api_key']}"}
        with httpx.Client(base_url=url, headers=headers) as client:
            yield client, f"/s/{made['id']}/v1"


def message_of(api: str, answer: httpx.Response) -> tuple[str, str | None]:
    """The error's message and param, checking the dialect's shape."""
    doc = answer.json()
    if api == "messages":
        assert doc["type"] == "error" and set(doc["error"]) == {"type", "message"}, doc
        return doc["error"]["message"], None
    assert set(doc["error"]) == {"message", "type", "param", "code"}, doc
    return doc["error"]["message"], doc["error"]["param"]


def post_raw(client: httpx.Client, path: str, raw: bytes) -> httpx.Response:
    return client.post(path, content=raw, headers={"content-type": "application/json"})


@pytest.mark.parametrize("api", sorted(BODIES))
def test_a_body_that_cannot_be_read_is_a_400(fake, api):
    proxy = make_proxy(fake.base_url)
    with session_url(proxy) as (client, root):
        deep = b'{"model": "m", "metadata": ' + b"[" * 100_000
        balanced = b'{"model": "m", "metadata": ' + b"[" * 200 + b"]" * 200 + b"}"
        cases = {
            deep: "nested too deeply",
            balanced: "nested too deeply",
            b'{"model": "m", "messages": "\xff\xfe"}': "not valid UTF-8",
            b'{"model": ': "not JSON",
            b"[1, 2]": "must be a JSON object",
        }
        for raw, words in cases.items():
            answer = post_raw(client, f"{root}/{api}", raw)
            assert answer.status_code == 400, answer.text
            assert words in message_of(api, answer)[0]
        [session] = proxy.sessions.values()
        assert session.turns == 0


@pytest.mark.parametrize("api", sorted(BODIES))
@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("max_tokens", 2**64, "expected an integer from 1 to"),
        ("max_tokens", "8", "integer"),
        ("temperature", "hot", "number"),
        ("temperature", 10**400, "number"),
        ("top_p", 2, "from 0"),
    ],
)
def test_a_field_of_the_wrong_type_or_range_is_a_400_naming_it(fake, api, field, value, words):
    if api == "completions" and field == "top_p":
        pytest.skip("the same reader as chat")
    field = LIMIT.get(api, "max_tokens") if field == "max_tokens" else field
    proxy = make_proxy(fake.base_url)
    with session_url(proxy) as (client, root):
        answer = client.post(f"{root}/{api}", json={**BODIES[api], field: value})
        assert answer.status_code == 400, answer.text
        message, param = message_of(api, answer)
        assert field in message and words in message
        assert param in (field, f"`{field}`", None if api == "messages" else field)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"stream_options": "yes", "stream": True}, "stream_options"),
        ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
        ({"stream": "yes"}, "stream"),
        ({"n": True}, "n"),
        ({"seed": 2**64}, "seed"),
        ({"logprobs": 2**64}, "logprobs"),
        ({"top_logprobs": "x"}, "top_logprobs"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"stop": 5}, "stop"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"tool_choice": {"function": "add"}}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "hi", "name": 5}]}, "messages[0].name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, None),
    ],
)
def test_chat_fields(fake, extra, param):
    proxy = make_proxy(fake.base_url)
    with session_url(proxy) as (client, root):
        answer = client.post(
            f"{root}/chat/completions", json={**BODIES["chat/completions"], **extra}
        )
        assert answer.status_code == 400, answer.text
        assert message_of("chat/completions", answer)[1] == (
            param or "tools[0].function.parameters"
        )


@pytest.mark.parametrize("value", [2**64, 10**400, -1, "x", [1], {"n": 1}, 21])
def test_completions_logprobs_out_of_range_is_a_400(fake, value):
    proxy = make_proxy(fake.base_url)
    with session_url(proxy) as (client, root):
        body = {**BODIES["completions"], "logprobs": value}
        answer = client.post(f"{root}/completions", json=body)
        assert answer.status_code == 400, answer.text
        assert message_of("completions", answer)[1] == "logprobs"


def test_session_and_upstream_bodies(fake):
    proxy = make_proxy(fake.base_url)
    with serve_in_thread(build_app(proxy)) as url:
        deep = b"[" * 1000 + b'"x"' + b"]" * 1000
        for raw in (
            b'{"metadata": ' + deep + b"}",
            b'{"metadata": ' + b"[" * 100_000,
            b'{"metadata": "x"}',
            b'{"limits": {"max_turns": "x"}}',
        ):
            assert httpx.post(f"{url}/sessions", content=raw).status_code == 400
        for parser in (b"5", b'"nonesuch"', b'{"a": [1]}'):
            raw = b'{"tool_parser": ' + parser + b"}"
            created = httpx.post(f"{url}/sessions/create", content=raw)
            assert created.status_code == 400 and created.json()["error"]["param"] == "tool_parser"
        assert not proxy.sessions
        cap = httpx.post(f"{url}/sessions/create", json={}).json()["uuid"]
        raw = b'{"messages": ' + deep + b"}"
        chat = httpx.post(f"{url}/{cap}/v1/chat/completions", content=raw)
        assert chat.status_code == 400 and "nested too deeply" in chat.text
        made = httpx.post(f"{url}/sessions").json()
        key = {"authorization": f"Bearer {made['api_key']}"}
        reward = f"{url}/sessions/{made['id']}/reward"
        for raw in (b'{"reward": 1e400}', b'{"reward": "x"}', b'{"reward": [[1]]}'):
            assert httpx.post(reward, content=raw, headers=key).status_code == 400


@pytest.mark.parametrize("api", sorted(BODIES))
@pytest.mark.parametrize("status", [400, 422])
def test_the_servers_own_4xx_is_passed_on(fake, api, status):
    proxy = make_proxy(fake.base_url)
    with session_url(proxy) as (client, root):
        fake.fail_next(1, status)
        answer = client.post(f"{root}/{api}", json=BODIES[api])
        fake.clear_failures()
        assert answer.status_code == status, answer.text
        message = message_of(api, answer)[0]
        assert "the inference server refused the request" in message
        assert f"injected failure ({status})" in message
        [session] = proxy.sessions.values()
        assert session.turns == 0
        assert client.post(f"{root}/{api}", json=BODIES[api]).status_code == 200


def test_a_failing_server_is_a_502(fake):
    proxy = make_proxy(fake.base_url)
    with session_url(proxy) as (client, root):
        fake.fail_next(3, 500, ["/v1/completions"])  # every attempt
        answer = client.post(f"{root}/messages", json=BODIES["messages"])
        fake.clear_failures()
        assert answer.status_code == 502, answer.text
        assert answer.json()["error"]["type"] == "api_error"
        assert "the inference server call failed" in answer.json()["error"]["message"]


@pytest.mark.parametrize(
    ("err", "status"),
    [
        (InferenceError.from_status(400, "too long"), 400),
        (InferenceError.from_status(429, "busy"), 429),
        (InferenceError.from_status(404, "no such model"), 502),  # the proxy's configuration
        (InferenceError.from_status(401, "bad key"), 502),
        (InferenceError.from_status(503, "down"), 502),
        (InferenceError("refused", kind="connection", retryable=True), 502),
        (InferenceTimeout("no answer"), 504),
    ],
)
def test_inference_failures_by_status(err, status):
    assert inference_failure(err).status == status


@pytest.mark.parametrize("api", sorted(BODIES))
def test_a_bug_is_a_logged_500_in_the_dialects_shape(fake, api, monkeypatch, caplog):
    async def broken(self: Session, request: Any) -> Any:
        raise KeyError("a bug")

    monkeypatch.setattr(Session, "complete", broken)
    proxy = make_proxy(fake.base_url)
    with session_url(proxy) as (client, root):
        with caplog.at_level(logging.ERROR, logger="atropos.proxy"):
            answer = client.post(f"{root}/{api}", json=BODIES[api])
    assert answer.status_code == 500
    assert "KeyError" in message_of(api, answer)[0]
    assert len([r for r in caplog.records if r.name == "atropos.proxy"]) == 1


def test_a_template_that_refuses_the_conversation_is_a_400(fake, monkeypatch):
    async def refused(self: Session, request: Any) -> Any:
        raise TemplateError("Conversation roles must alternate user/assistant")

    monkeypatch.setattr(Session, "complete", refused)
    proxy = make_proxy(fake.base_url)
    with session_url(proxy) as (client, root):
        answer = client.post(f"{root}/chat/completions", json=BODIES["chat/completions"])
    assert answer.status_code == 400 and "roles must alternate" in answer.text


def test_a_prompt_past_the_servers_context_is_its_400(fake):
    """2000 tools render past the server's max_model_len: vLLM's 400, passed on (was a 502)."""
    tools = [
        {"type": "function", "function": {"name": f"tool_{i}", "description": "does a thing"}}
        for i in range(2000)
    ]
    proxy = make_proxy(fake.base_url)
    with session_url(proxy) as (client, root):
        body = {**BODIES["chat/completions"], "tools": tools}
        answer = client.post(f"{root}/chat/completions", json=body)
    assert answer.status_code == 400, answer.text
    assert "maximum context length" in answer.json()["error"]["message"]

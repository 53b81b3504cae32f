"""The rollout proxy (`atropos.proxy`) in front of each server of the tiny policy (`target`:
`atropos local serve`, then real vLLM), driven in every dialect it serves: OpenAI chat
completions (whole and streamed, n > 1), text completions, the Responses API, Anthropic
messages, and atroposlib's ManagedServerProxy routes.

Each trajectory is held to the server itself: the generated spans are the ids the server
returned (recorded between the proxy and its `ServerManager`), with the logprobs it returned,
and those logprobs are the server's own `prompt_logprobs` for the same ids (one scoring pass
over the whole sequence: a later turn, generated on a prefix-cached prompt, must agree too).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from atropos.inference.managed import ManagedServer
from atropos.inference.manager import ServerManager
from atropos.inference.tokenizer import load_tokenizer
from atropos.proxy.app import Proxy, ProxySettings, build_app
from atropos.testing import serve_in_thread

from .helpers import MODEL, Target

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the first test starts the server
TOLERANCE = 1e-4  # float32 on both sides; measured: a few 1e-6
MAX_TOKENS = 16


class Recorder:
    """The proxy's server: a `ServerManager` whose token answers are kept in call order
    (`outputs`: one `(ids, logprobs)` per choice), so a trajectory can be held to them."""

    def __init__(self, manager: ServerManager) -> None:
        self.manager = manager
        self.outputs: list[tuple[list[int], list[float]]] = []

    def managed_server(self, tokenizer: Any) -> contextlib.AbstractAsyncContextManager[Any]:
        @contextlib.asynccontextmanager
        async def session() -> AsyncIterator[ManagedServer]:
            yield ManagedServer(self, tokenizer)

        return session()

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> Any:
        answer = await self.manager.tokens_and_logprobs_completion(**kwargs)
        self.outputs += [(list(o), list(lp)) for o, lp in zip(answer[1], answer[2], strict=True)]
        return answer

    async def chat_completion(self, **kwargs: Any) -> Any:
        return await self.manager.chat_completion(**kwargs)


@contextlib.contextmanager
def proxy_over(target: Target) -> Iterator[tuple[str, Recorder]]:
    """A proxy over `target` served on 127.0.0.1: (its URL, the recorder behind it)."""
    recorder = Recorder(target.manager())
    proxy = Proxy(recorder, load_tokenizer("tiny"), ProxySettings(model=MODEL))
    with serve_in_thread(build_app(proxy)) as url:
        yield url, recorder


def new_session(url: str) -> dict[str, Any]:
    answer = httpx.post(f"{url}/sessions", timeout=30)
    answer.raise_for_status()
    session: dict[str, Any] = answer.json()
    return session


def trajectory(url: str, session: dict[str, Any]) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {session['api_key']}"}
    answer = httpx.get(f"{url}/sessions/{session['id']}/trajectory", headers=headers, timeout=30)
    answer.raise_for_status()
    doc: dict[str, Any] = answer.json()
    return doc


def server_logprobs(target: Target, ids: list[int]) -> list[float | None]:
    """log p(ids[t] | ids[:t]) from the server's own `prompt_logprobs` (None at t = 0)."""
    body = {"model": MODEL, "prompt": ids, "max_tokens": 1, "temperature": 0}
    answer = httpx.post(f"{target.base_url}/completions", json=body | {"prompt_logprobs": 1})
    answer.raise_for_status()
    positions = answer.json()["choices"][0]["prompt_logprobs"]
    return [
        None if p is None else float(p[str(t)]["logprob"])
        for p, t in zip(positions, ids, strict=True)
    ]


def worst(a: list[float], b: list[float | None]) -> float:
    assert len(a) == len(b) and None not in b
    return max((abs(x - y) for x, y in zip(a, b, strict=True) if y is not None), default=0.0)


def check_sequence(
    target: Target, seq: dict[str, Any], outputs: list[tuple[list[int], list[float]]]
) -> None:
    """`seq`'s spans are `outputs` (the server's ids and logprobs, in order), they alone are
    trained, and their logprobs are the server's prompt logprobs of the whole sequence."""
    tokens, masks, logprobs = seq["tokens"], seq["masks"], seq["logprobs"]
    assert seq["token_source"] == "server" and len(tokens) == len(masks) == len(logprobs)
    assert len(seq["spans"]) == len(outputs)
    reference = server_logprobs(target, tokens)
    trained: list[int] = []
    for span, (ids, lps) in zip(seq["spans"], outputs, strict=True):
        start, end = span["start"], span["end"]
        assert ids and tokens[start:end] == ids and masks[start:end] == ids
        assert logprobs[start:end] == lps  # as the server returned them
        assert worst(lps, reference[start:end]) < TOLERANCE, (target.name, span)
        trained += range(start, end)
    assert [i for i, m in enumerate(masks) if m != -100] == trained


def test_chat_completions_over_turns_whole_then_streamed(target: Target) -> None:
    """Three calls of one conversation (the last streamed) make one sequence."""
    with proxy_over(target) as (url, recorder):
        session = new_session(url)
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
        messages: list[Any] = [{"role": "user", "content": "What is 3 + 4?"}]
        for turn, follow_up in enumerate(("And 5 + 6?", "And 1 + 1?", None)):
            kwargs: Any = {"model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS}
            if turn == 2:
                chunks = client.chat.completions.create(**kwargs, stream=True, seed=turn)
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                reply = client.chat.completions.create(**kwargs, seed=turn)
                text = reply.choices[0].message.content or ""
            messages.append({"role": "assistant", "content": text})
            if follow_up:
                messages.append({"role": "user", "content": follow_up})
        doc = trajectory(url, session)
    assert doc["turns"] == 3 and len(recorder.outputs) == 3
    [seq] = doc["sequences"]
    assert doc["breaks"]["clean"] + doc["breaks"]["realign"] == 2
    check_sequence(target, seq, recorder.outputs)


def test_chat_completions_with_n_choices_make_one_sequence_each(target: Target) -> None:
    with proxy_over(target) as (url, recorder):
        session = new_session(url)
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Name a colour."}],
            max_tokens=MAX_TOKENS,
            n=3,
        )
        doc = trajectory(url, session)
    assert len(reply.choices) == 3 and len(recorder.outputs) == 3
    assert len(doc["sequences"]) == 3
    for seq, output in zip(doc["sequences"], recorder.outputs, strict=True):
        check_sequence(target, seq, [output])


def test_text_completions(target: Target) -> None:
    with proxy_over(target) as (url, recorder):
        session = new_session(url)
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
        reply = client.completions.create(model=MODEL, prompt="1 + 1 =", max_tokens=MAX_TOKENS)
        doc = trajectory(url, session)
    [(ids, _)] = recorder.outputs
    assert reply.usage is not None and reply.usage.completion_tokens == len(ids)
    [seq] = doc["sequences"]
    check_sequence(target, seq, recorder.outputs)


def test_the_responses_api_continued_by_previous_response_id(target: Target) -> None:
    tools: Any = [
        {
            "type": "function",
            "name": "add",
            "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}},
        }
    ]
    with proxy_over(target) as (url, recorder):
        session = new_session(url)
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
        first = client.responses.create(
            model=MODEL, input="What is 3 + 4?", tools=tools, max_output_tokens=MAX_TOKENS
        )
        events = client.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            input="And 5 + 6?",
            tools=tools,
            max_output_tokens=MAX_TOKENS,
            stream=True,
        )
        kinds = [event.type for event in events]
        doc = trajectory(url, session)
    assert kinds[0] == "response.created" and kinds[-1] in (
        "response.completed",
        "response.incomplete",
    )
    [seq] = doc["sequences"]  # the second call continued the first
    check_sequence(target, seq, recorder.outputs)


def test_anthropic_messages_over_two_turns(target: Target) -> None:
    with proxy_over(target) as (url, recorder):
        session = new_session(url)
        client = anthropic.Anthropic(
            base_url=session["anthropic_base_url"], api_key=session["api_key"]
        )
        messages: list[Any] = [{"role": "user", "content": "What is 3 + 4?"}]
        first = client.messages.create(
            model=MODEL, max_tokens=MAX_TOKENS, messages=messages, system="Be brief."
        )
        text = "".join(b.text for b in first.content if b.type == "text")
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": "And 5 + 6?"},
        ]
        with client.messages.stream(
            model=MODEL, max_tokens=MAX_TOKENS, messages=messages, system="Be brief."
        ) as stream:
            stream.get_final_message()
        doc = trajectory(url, session)
    assert doc["turns"] == 2
    [seq] = doc["sequences"]
    check_sequence(target, seq, recorder.outputs)


def test_upstreams_managed_server_proxy_routes(target: Target) -> None:
    """atroposlib's `/sessions/create`, `/{uuid}/v1/chat/completions` and `/{uuid}/nodes`: the
    nodes hold the server's ids, with its logprobs (1.0 where masked, upstream's sentinel)."""
    with proxy_over(target) as (url, recorder):
        created = httpx.post(f"{url}/sessions/create", json={"tool_parser": "hermes"}).json()
        client = openai.OpenAI(base_url=f"{url}/{created['uuid']}/v1", api_key="unused")
        messages: list[Any] = [{"role": "user", "content": "Hi there."}]
        reply = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=MAX_TOKENS
        )
        messages += [
            {"role": "assistant", "content": reply.choices[0].message.content or ""},
            {"role": "user", "content": "Say more."},
        ]
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS)
        [node] = httpx.get(f"{url}/{created['uuid']}/nodes").json()["nodes"]
        assert httpx.delete(f"{url}/{created['uuid']}").status_code == 200
    tokens, masks, logprobs = node["tokens"], node["masked_tokens"], node["logprobs"]
    assert len(tokens) == len(masks) == len(logprobs)
    reference = server_logprobs(target, tokens)
    generated = [ids for ids, _ in recorder.outputs]
    trained = [i for i, m in enumerate(masks) if m != -100]
    assert [tokens[i] for i in trained] == [t for ids in generated for t in ids]
    assert all(logprobs[i] == 1.0 for i, m in enumerate(masks) if m == -100)
    ours = [logprobs[i] for i in trained]
    assert ours == [lp for _, lps in recorder.outputs for lp in lps]
    assert worst(ours, [reference[i] for i in trained]) < TOLERANCE


def test_a_stop_string_ends_the_answer_but_stays_in_the_trajectory(target: Target) -> None:
    """As the server answers: the text ends before the stop string (OpenAI chat and text
    completions, Anthropic's `stop_sequence`), while the sequence keeps the sampled token that
    spelled it, trained with the server's logprob. Greedy, so the stop is known beforehand."""
    ask: list[Any] = [{"role": "user", "content": "What is 12 + 7?"}]  # greedy: a number
    greedy = {"model": MODEL, "max_tokens": MAX_TOKENS, "temperature": 0}
    server = openai.OpenAI(base_url=target.base_url, api_key="unused")
    with proxy_over(target) as (url, recorder):
        session = new_session(url)
        client = openai.OpenAI(base_url=session["base_url"], api_key=session["api_key"])
        whole = client.chat.completions.create(messages=ask, **greedy).choices[0].message.content
        own = server.chat.completions.create(messages=ask, **greedy).choices[0].message.content
        assert whole and whole == own  # the proxy's render and ids: the server's own chat
        at = next(i for i in range(1, len(whole)) if whole[i] not in whole[:i] and whole[i] != " ")
        stop, before = whole[at], whole[:at]
        chat = client.chat.completions.create(messages=ask, stop=[stop], **greedy).choices[0]
        direct = server.chat.completions.create(messages=ask, stop=[stop], **greedy).choices[0]
        assert chat.message.content == direct.message.content == before
        assert chat.finish_reason == direct.finish_reason == "stop"
        messages = anthropic.Anthropic(
            base_url=session["anthropic_base_url"], api_key=session["api_key"]
        ).messages.create(
            model=MODEL,
            max_tokens=MAX_TOKENS,
            messages=ask,
            stop_sequences=[stop],
            extra_body={"temperature": 0},  # this SDK no longer takes it as an argument
        )
        assert messages.stop_reason == "stop_sequence" and messages.stop_sequence == stop
        assert [b.text for b in messages.content if b.type == "text"] == [before]
        prompt = "Once upon a time"
        text = client.completions.create(prompt=prompt, **greedy).choices[0].text
        cut = next(i for i in range(1, len(text)) if text[i] not in text[:i] and text[i] != " ")
        short = client.completions.create(prompt=prompt, stop=text[cut], **greedy).choices[0]
        assert short.text == text[:cut] and short.finish_reason == "stop"
        doc = trajectory(url, session)
    assert len(doc["sequences"]) == 5 and len(recorder.outputs) == 5
    for seq, output in zip(doc["sequences"], recorder.outputs, strict=True):
        check_sequence(target, seq, [output])
    tokenizer = load_tokenizer("tiny")
    stopped = [doc["sequences"][i] for i in (1, 2, 4)]
    for seq, spelled in zip(stopped, (stop, stop, text[cut]), strict=True):
        [span] = seq["spans"]
        assert spelled in tokenizer.decode(seq["tokens"][span["start"] : span["end"]])

"""What keeps many multi-turn rollouts in one process cheap: a `ManagedServer` turn that
continues a held conversation tokenizes only the text the turn adds (the same ids, and the same
drift label, as tokenizing the whole render), and a health probe that times out while the
server answers calls does not take the server out (`benchmarks/multiturn_scale.py`)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.inference.managed import DriftKind, ManagedServer
from atropos.inference.manager import ServerManager
from atropos.inference.tokenizer import TokenCodec
from atropos.testing import answer_lifespan, serve_in_thread
from atropos.testing.fake_engine import load_tokenizer

TOK = load_tokenizer()
EOS = TOK.eos_token_id


class Scripted:
    """An in-memory token server answering fixed output ids, one answer per call."""

    def __init__(self, *answers: tuple[list[int], str]) -> None:
        self.answers = list(answers)
        self.sent: list[list[int]] = []

    async def tokens_and_logprobs_completion(self, *, input_ids: list[int], n: int = 1, **kw: Any):
        self.sent.append(list(input_ids))
        out, finish = self.answers.pop(0)
        return input_ids, [out] * n, [[-0.5] * len(out)] * n, [finish] * n


def full_ids(messages: list[dict[str, Any]]) -> list[int]:
    text = TOK.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(TOK.encode(text, add_special_tokens=False))


async def converse(m: ManagedServer, turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"Tool result {i}: {i * 7}."})
        reply = await m.chat_turn(messages=msgs)
        msgs.append({"role": "assistant", "content": reply.contents[0]})
    return msgs


def test_a_continued_turn_tokenizes_only_what_it_adds(monkeypatch):
    answers = [(TOK.encode(f"Answer {i}.") + [EOS], "stop") for i in range(4)]
    server = Scripted(*answers)
    m = ManagedServer(server, TOK)
    codec = TokenCodec.of(TOK)
    encoded: list[str] = []
    encode = codec.encode
    monkeypatch.setattr(codec, "encode", lambda text: encoded.append(text) or encode(text))
    msgs = asyncio.run(converse(m, 4))
    assert m.drift_counts == {DriftKind.CLEAN: 3, DriftKind.REALIGN: 0, DriftKind.FORK: 0}
    for i, sent in enumerate(server.sent):  # the very ids the whole render tokenizes to
        assert sent == full_ids(msgs[: 2 + 2 * i])
    later = [text for text in encoded if "Tool result 0" in text]
    assert len(later) == 1  # the first turn's prompt only: later turns encode their suffix
    assert encoded[-1].startswith("\n<|im_start|>user\nTool result 3")  # not the history
    [node] = m.nodes
    assert node.drift is DriftKind.CLEAN and node.tokens[: len(server.sent[-1])] == server.sent[-1]


def test_held_ids_that_are_not_canonical_are_kept_and_labelled_realign():
    hello = [TOK.convert_tokens_to_ids(c) for c in "hello"]  # one token per letter
    server = Scripted((hello + [EOS], "stop"), (TOK.encode("ok") + [EOS], "stop"))
    server.answers.append((TOK.encode("fine") + [EOS], "stop"))
    m = ManagedServer(server, TOK)
    asyncio.run(converse(m, 3))
    assert m.drift_counts == {DriftKind.CLEAN: 0, DriftKind.REALIGN: 2, DriftKind.FORK: 0}
    first = server.sent[0] + hello + [EOS]
    assert server.sent[1][: len(first)] == first and server.sent[2][: len(first)] == first


def test_a_length_cut_reply_takes_the_full_path_and_an_edit_forks():
    cut = TOK.encode("Answer")  # no end of turn: the next render closes it, re-tokenized
    server = Scripted((cut, "length"), (TOK.encode("x") + [EOS], "stop"))
    server.answers.append((TOK.encode("y") + [EOS], "stop"))
    m = ManagedServer(server, TOK)
    msgs = asyncio.run(converse(m, 2))
    assert m.drift_counts[DriftKind.FORK] == 0 and sum(m.drift_counts.values()) == 1
    edited = [*msgs[:-1], {"role": "assistant", "content": "changed"}]  # the held reply, edited
    edited.append({"role": "user", "content": "more"})
    asyncio.run(m.chat_turn(messages=edited))
    assert m.drift_counts[DriftKind.FORK] == 1 and server.sent[-1] == full_ids(edited)


class SlowHealth:
    """A vLLM-style `/generate` server whose `/health` answers after `health_delay` seconds."""

    BODY = json.dumps({"logprobs": [[[{str(EOS): -0.5}]]], "finish_reasons": ["stop"]}).encode()

    def __init__(self, health_delay: float) -> None:
        self.health_delay = health_delay

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if await answer_lifespan(scope, receive, send):
            return
        while (await receive()).get("more_body"):
            pass
        if scope["path"] == "/health":
            await asyncio.sleep(self.health_delay)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": self.BODY})


def test_a_probe_that_times_out_while_calls_succeed_keeps_the_server_healthy():
    with serve_in_thread(SlowHealth(health_delay=0.6)) as url:
        config = APIServerConfig(
            base_url=url + "/v1", server_type="vllm", vllm_token_api="generate", model_name="m"
        )
        fast = ServerManagerConfig(health_check_interval=0.05, health_check_timeout=0.2)

        async def busy() -> tuple[bool, int]:
            async with ServerManager([config], fast) as m:
                end, calls = time.monotonic() + 1.5, 0
                while time.monotonic() < end:  # several probes time out meanwhile
                    await m.tokens_and_logprobs_completion(input_ids=[1, 2], max_tokens=1)
                    calls += 1
                    assert m._pool.slots[0].healthy
                return m._pool.slots[0].healthy, calls

        async def idle() -> bool:
            async with ServerManager([config], fast) as m:
                await m.tokens_and_logprobs_completion(input_ids=[1, 2], max_tokens=1)
                end = time.monotonic() + 10
                while m._pool.slots[0].healthy:  # no calls: a timed-out probe counts
                    assert time.monotonic() < end, "the probe never marked the server down"
                    await asyncio.sleep(0.02)
                return False

        healthy, calls = asyncio.run(busy())
        assert healthy and calls > 10
        assert asyncio.run(idle()) is False


def test_a_new_conversation_reuses_a_prompt_rendered_before(monkeypatch):
    tok = load_tokenizer()
    tok.chat_template = str(TOK.chat_template)  # a template of its own: a fresh cache key
    TokenCodec.of(tok)  # its probes render a template too
    rendered: list[int] = []
    apply = tok.apply_chat_template
    monkeypatch.setattr(
        tok, "apply_chat_template", lambda *a, **k: rendered.append(1) or apply(*a, **k)
    )
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}]
    server = Scripted(*[(TOK.encode("4") + [EOS], "stop")] * 5)

    async def start(messages: list[dict[str, Any]]) -> list[int]:
        turn = await ManagedServer(server, tok).chat_turn(messages=messages, n=2)
        return turn.prompt_tokens

    first, again = asyncio.run(start(msgs)), asyncio.run(start(msgs))
    assert rendered == [1] and first == again == full_ids(msgs) and first is not again
    again.append(0)  # the caller's copy: the cache keeps its own
    named = [msgs[0], {**msgs[1], "name": "bob"}]  # not only role and content: rendered
    asyncio.run(start(named))
    tok.chat_template = "{{ strftime_now('%Y') }}" + str(TOK.chat_template)  # reads the clock
    asyncio.run(start(msgs))
    asyncio.run(start(msgs))
    assert rendered == [1, 1, 1, 1]

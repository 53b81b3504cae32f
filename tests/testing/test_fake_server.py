"""FakeInferenceServer over real HTTP: every endpoint shape, ids and logprobs consistency, stop
and length, latency, failure injection, counters, concurrency and the process entry point."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import openai
import pytest

from atropos.testing import FakeInferenceServer, free_port
from atropos.testing.fake_engine import load_tokenizer

TOK = load_tokenizer()
EOS = TOK.eos_token_id
USER = [{"role": "user", "content": "What is 2 + 2?"}]


class Script:
    """A responder tests can re-point; None means random completions."""

    def __init__(self) -> None:
        self.fn: Any = None
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str | None:
        self.prompts.append(prompt)
        return None if self.fn is None else self.fn(prompt)


SCRIPT = Script()


@pytest.fixture(scope="module")
def srv() -> Iterator[FakeInferenceServer]:
    with FakeInferenceServer(responder=SCRIPT) as server:
        yield server


@pytest.fixture(autouse=True)
def _fresh(request: pytest.FixtureRequest) -> Iterator[None]:
    SCRIPT.fn, SCRIPT.prompts = None, []
    yield
    if "srv" in request.fixturenames:
        server = request.getfixturevalue("srv")
        server.reset_counters()
        server.latency = 0.0
        server.down = False
        server.clear_failures()


def post(srv: FakeInferenceServer, path: str, body: Any, status: int = 200) -> Any:
    url = srv.base_url if path.startswith("/chat") or path.startswith("/completions") else srv.url
    r = httpx.post(f"{url}{path}", json=body, timeout=10)
    assert r.status_code == status, r.text
    return r.json()


def rendered(messages: list[dict[str, Any]]) -> list[int]:
    text = TOK.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return TOK.encode(text, add_special_tokens=False)


# --- health, models, errors -------------------------------------------------------------------


def test_health_and_models(srv):
    assert httpx.get(f"{srv.url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{srv.url}/health/").json() == {"status": "ok"}
    models = httpx.get(f"{srv.base_url}/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "atropos-tiny"
    assert srv.requests["/health"] == 1 and srv.requests["/v1/models"] == 1


def test_base_url_before_start_raises():
    with pytest.raises(RuntimeError, match="not running"):
        _ = FakeInferenceServer().base_url


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/chat/completions", {}, "messages"),
        ("/chat/completions", {"messages": [{"content": "x"}]}, "messages"),
        ("/chat/completions", {"messages": USER, "n": 0}, "n"),
        ("/chat/completions", {"messages": USER, "max_tokens": 0}, "max_tokens"),
        ("/chat/completions", {"messages": USER, "temperature": "hot"}, "temperature"),
        ("/chat/completions", {"messages": USER, "stream": True}, "stream"),
        ("/chat/completions", {"messages": USER, "top_logprobs": 2}, "top_logprobs"),
        ("/chat/completions", {"messages": USER, "stop": [1]}, "stop"),
        ("/chat/completions", {"messages": USER, "max_tokens": 5000}, "max_tokens"),
        ("/completions", {"prompt": [1, 99999]}, "prompt"),
        ("/completions", {"prompt": []}, "prompt"),
        ("/completions", {"prompt": "x", "echo": True}, "echo"),
        ("/generate", {"prompt": {"prompt_token_ids": [1]}, "model": "m"}, "model"),
        ("/generate", {"prompt": 5}, "prompt"),
        ("/generate", {"input_ids": [1], "text": "x"}, "input_ids"),
        ("/generate", {"input_ids": [1], "sampling_params": {"max_tokens": 3}}, "max_tokens"),
        ("/generate", {"nothing": 1}, None),
        ("/generate/", {"prompts": []}, "prompts"),
    ],
)
def test_bad_requests_get_4xx_json(srv, path, body, param):
    error = post(srv, path, body, status=400)["error"]
    assert error["code"] == 400 and error["param"] == param and error["message"]


def test_not_json_not_found_and_wrong_method(srv):
    r = httpx.post(f"{srv.base_url}/chat/completions", content=b"{nope")
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{srv.base_url}/chat/completions", json=[1])
    assert r.status_code == 400
    assert httpx.get(f"{srv.url}/v2/nope").json()["error"]["code"] == 404
    assert httpx.post(f"{srv.url}/health").status_code == 405


def test_context_overflow_is_vllms_400(srv):
    body = {"prompt": [5] * 4090, "max_tokens": 10}
    error = post(srv, "/completions", body, status=400)["error"]
    assert "maximum context length is 4096" in error["message"]


# --- chat completions -------------------------------------------------------------------------


def test_chat_shape_ids_and_logprobs(srv):
    body = {
        "messages": USER,
        "n": 3,
        "max_tokens": 64,
        "logprobs": True,
        "top_logprobs": 3,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    data = post(srv, "/chat/completions", body)
    assert data["object"] == "chat.completion" and data["model"] == "atropos-tiny"
    assert data["prompt_token_ids"] == rendered(USER)
    assert len(data["choices"]) == 3
    texts = set()
    for i, choice in enumerate(data["choices"]):
        ids = choice["token_ids"]
        assert choice["index"] == i and choice["finish_reason"] == "stop"
        assert ids[-1] == EOS and EOS not in ids[:-1]
        assert choice["message"] == {"role": "assistant", "content": TOK.decode(ids[:-1])}
        content = choice["logprobs"]["content"]
        assert [c["token"] for c in content] == [f"token_id:{i}" for i in ids]
        assert all(c["logprob"] < 0 for c in content)
        for c in content:
            assert len(c["top_logprobs"]) == 3 and c["top_logprobs"][0]["token"] == c["token"]
            assert c["top_logprobs"][0]["logprob"] == c["logprob"]
            assert [t["logprob"] for t in c["top_logprobs"]] == sorted(
                (t["logprob"] for t in c["top_logprobs"]), reverse=True
            )
        texts.add(choice["message"]["content"])
    assert len(texts) == 3  # sampled choices differ
    usage = data["usage"]
    assert usage["prompt_tokens"] == len(rendered(USER))
    assert usage["completion_tokens"] == sum(len(c["token_ids"]) for c in data["choices"])


def test_chat_is_deterministic_and_greedy_choices_agree(srv):
    body = {"messages": USER, "n": 2, "return_token_ids": True, "logprobs": True}
    a, b = post(srv, "/chat/completions", body), post(srv, "/chat/completions", body)
    assert [c["token_ids"] for c in a["choices"]] == [c["token_ids"] for c in b["choices"]]
    assert [c["logprobs"] for c in a["choices"]] == [c["logprobs"] for c in b["choices"]]
    greedy = post(srv, "/chat/completions", {**body, "temperature": 0})["choices"]
    assert greedy[0]["token_ids"] == greedy[1]["token_ids"]
    seeded = post(srv, "/chat/completions", {**body, "seed": 7})["choices"]
    assert seeded[0]["token_ids"] != a["choices"][0]["token_ids"]


def test_chat_responder_text_is_tokenized_exactly(srv):
    SCRIPT.fn = lambda prompt: "The answer is 4."
    data = post(srv, "/chat/completions", {"messages": USER, "return_token_ids": True})
    choice = data["choices"][0]
    assert choice["message"]["content"] == "The answer is 4."
    assert choice["token_ids"] == TOK.encode("The answer is 4.", add_special_tokens=False) + [EOS]
    expected = TOK.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    assert SCRIPT.prompts == [expected]
    assert choice["logprobs"] is None and "prompt_token_ids" in data


def test_chat_responder_is_called_per_choice(srv):
    answers = itertools.cycle(["right", "wrong"])
    SCRIPT.fn = lambda prompt: next(answers)
    data = post(srv, "/chat/completions", {"messages": USER, "n": 4})
    assert [c["message"]["content"] for c in data["choices"]] == ["right", "wrong"] * 2


def test_chat_max_tokens_cuts_with_length(srv):
    SCRIPT.fn = lambda prompt: "one two three four five six seven"
    full = TOK.encode("one two three four five six seven", add_special_tokens=False)
    for key in ("max_tokens", "max_completion_tokens"):
        body = {"messages": USER, key: 3, "return_token_ids": True}
        choice = post(srv, "/chat/completions", body)["choices"][0]
        assert choice["finish_reason"] == "length" and choice["token_ids"] == full[:3]
    # exactly enough room for the content but not the eos: still "length"
    body = {"messages": USER, "max_tokens": len(full), "return_token_ids": True}
    choice = post(srv, "/chat/completions", body)["choices"][0]
    assert choice["finish_reason"] == "length" and choice["token_ids"] == full


def test_chat_stop_strings(srv):
    SCRIPT.fn = lambda prompt: "The answer is 4. Next question."
    body = {"messages": USER, "stop": [". Next", "zzz"], "return_token_ids": True}
    choice = post(srv, "/chat/completions", body)["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == ". Next"
    assert choice["message"]["content"] == "The answer is 4"
    assert choice["token_ids"] == TOK.encode("The answer is 4", add_special_tokens=False)
    # a stop string that starts inside a token cuts before that token: text and ids agree
    body = {"messages": USER, "stop": "swer", "return_token_ids": True}
    choice = post(srv, "/chat/completions", body)["choices"][0]
    assert "swer" not in choice["message"]["content"]
    assert TOK.decode(choice["token_ids"]) == choice["message"]["content"]


def test_chat_stop_token_ids_and_ignore_eos(srv):
    SCRIPT.fn = lambda prompt: "a b c"
    b_id = TOK.encode(" b", add_special_tokens=False)[0]
    body = {"messages": USER, "stop_token_ids": [b_id], "return_token_ids": True}
    choice = post(srv, "/chat/completions", body)["choices"][0]
    assert choice["token_ids"][-1] == b_id and choice["stop_reason"] == b_id
    body = {"messages": USER, "ignore_eos": True, "max_tokens": 12, "return_token_ids": True}
    choice = post(srv, "/chat/completions", body)["choices"][0]
    assert len(choice["token_ids"]) == 12 and EOS not in choice["token_ids"]
    assert choice["finish_reason"] == "length"


def test_chat_prompt_logprobs(srv):
    data = post(srv, "/chat/completions", {"messages": USER, "prompt_logprobs": 1})
    positions = data["prompt_logprobs"]
    ids = rendered(USER)
    assert len(positions) == len(ids) and positions[0] is None
    for token, position in zip(ids[1:], positions[1:], strict=True):
        assert str(token) in position and position[str(token)]["rank"] == 1
        assert all(v["logprob"] < 0 for v in position.values())


def test_openai_client_parses_the_answers(srv):
    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
        try:
            chat = await client.chat.completions.create(
                model="m",
                messages=USER,
                n=2,
                logprobs=True,
                top_logprobs=1,
                extra_body={"return_token_ids": True},
            )
            assert chat.model == "m" and len(chat.choices) == 2
            assert chat.choices[0].logprobs and chat.choices[0].logprobs.content
            assert (chat.choices[0].model_extra or {})["token_ids"][-1] == EOS
            text = await client.completions.create(model="m", prompt="Hello", logprobs=1)
            assert text.choices[0].logprobs and text.choices[0].logprobs.tokens
            models = await client.models.list()
            assert [m.id for m in models.data] == ["atropos-tiny"]
        finally:
            await client.close()

    asyncio.run(main())


# --- completions ------------------------------------------------------------------------------


def test_completions_text_and_token_prompts(srv):
    SCRIPT.fn = lambda prompt: " world"
    body = {"prompt": "Hello", "logprobs": 2, "return_token_ids": True}
    choice = post(srv, "/completions", body)["choices"][0]
    assert choice["text"] == " world" and choice["prompt_token_ids"] == TOK.encode("Hello")
    assert choice["token_ids"] == TOK.encode(" world") + [EOS]
    lp = choice["logprobs"]
    assert lp["tokens"] == [TOK.decode([i], skip_special_tokens=False) for i in choice["token_ids"]]
    assert len(lp["token_logprobs"]) == len(choice["token_ids"])
    assert all(len(top) == 3 for top in lp["top_logprobs"])  # sampled + 2
    assert lp["text_offset"][0] == 0
    ids = TOK.encode("Hello")
    by_ids = post(srv, "/completions", {"prompt": ids, "return_token_ids": True})["choices"][0]
    assert by_ids["prompt_token_ids"] == ids and SCRIPT.prompts[-1] == "Hello"


def test_completions_batches_and_n(srv):
    body = {"prompt": [[5, 6], [7, 8]], "n": 2, "return_token_ids": True}
    choices = post(srv, "/completions", body)["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] for c in choices] == [[5, 6]] * 2 + [[7, 8]] * 2
    assert post(srv, "/completions", {"prompt": ["a", "b", "c"]})["choices"][2]["index"] == 2


def test_completions_default_max_tokens_is_16(srv):
    SCRIPT.fn = lambda prompt: "word " * 40
    choice = post(srv, "/completions", {"prompt": "x", "return_token_ids": True})["choices"][0]
    assert len(choice["token_ids"]) == 16 and choice["finish_reason"] == "length"


def test_completions_prompt_logprobs_for_get_logprobs(srv):
    body = {"prompt": [5, 6, 7], "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2}
    choice = post(srv, "/completions", body)["choices"][0]
    positions = choice["prompt_logprobs"]
    assert positions[0] is None and len(positions) == 3
    assert list(positions[1])[0] == "6" and len(positions[1]) == 3


# --- /generate: vLLM --------------------------------------------------------------------------


def test_vllm_generate_shape(srv):
    body = {"prompt": {"prompt_token_ids": [1, 5, 6]}, "logprobs": 0, "n": 2, "max_tokens": 50}
    data = post(srv, "/generate", body)
    assert data["prompt_token_ids"] == [1, 5, 6] and len(data["text"]) == 2
    assert data["finish_reasons"] == ["stop", "stop"]
    for text, ids, positions in zip(data["text"], data["token_ids"], data["logprobs"], strict=True):
        # per position a one-element list holding {"<id>": logprob}, as upstream's client reads
        assert [int(next(iter(p[0]))) for p in positions] == ids
        assert all(len(p) == 1 and len(p[0]) == 1 for p in positions)
        assert all(v < 0 for p in positions for v in p[0].values())
        assert text == TOK.decode(ids, skip_special_tokens=True) and ids[-1] == EOS
    assert srv.requests["/generate"] == 1 and srv.tokens_generated == sum(
        map(len, data["token_ids"])
    )


def test_vllm_generate_without_logprobs_and_with_a_text_prompt(srv):
    SCRIPT.fn = lambda prompt: "ok"
    data = post(srv, "/generate", {"prompt": "Hello", "max_tokens": 5})
    assert data == {"text": ["ok"], "prompt": "Hello", "finish_reasons": ["stop"]}


def test_vllm_generate_top_logprobs_and_prompt_logprobs(srv):
    body = {"prompt": {"prompt_token_ids": [5, 6, 7]}, "logprobs": 2, "prompt_logprobs": 0}
    data = post(srv, "/generate", body)
    first = data["logprobs"][0][0][0]
    assert len(first) == 3 and int(next(iter(first))) == data["token_ids"][0][0]
    assert data["prompt_logprobs"][0] is None and list(data["prompt_logprobs"][1]) == ["6"]


# --- /generate: SGLang ------------------------------------------------------------------------


def test_sglang_generate_single_object(srv):
    SCRIPT.fn = lambda prompt: "four"
    body = {
        "input_ids": [1, 5, 6],
        "sampling_params": {"max_new_tokens": 20, "temperature": 1.0},
        "return_logprob": True,
        "return_text_in_logprobs": True,
    }
    data = post(srv, "/generate", body)
    assert isinstance(data, dict) and data["text"] == "four"
    ids = TOK.encode("four") + [EOS]
    assert data["output_ids"] == ids
    meta = data["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": EOS}
    assert meta["prompt_tokens"] == 3 and meta["completion_tokens"] == len(ids)
    assert [t[1] for t in meta["output_token_logprobs"]] == ids
    assert all(t[0] < 0 for t in meta["output_token_logprobs"])
    assert meta["output_token_logprobs"][-1][2] == "<|im_end|>"


def test_sglang_generate_n_batch_length_and_stop(srv):
    body = {"input_ids": [1, 5], "sampling_params": {"n": 2, "max_new_tokens": 2}}
    data = post(srv, "/generate", body)
    assert isinstance(data, list) and len(data) == 2
    assert all(d["meta_info"]["finish_reason"] == {"type": "length", "length": 2} for d in data)
    assert "output_token_logprobs" not in data[0]["meta_info"]
    batch = post(srv, "/generate", {"input_ids": [[1, 5], [1, 6]], "sampling_params": {}})
    assert isinstance(batch, list) and len(batch) == 2
    assert len({d["meta_info"]["id"] for d in batch}) == 2
    SCRIPT.fn = lambda prompt: "yes. no."
    body = {"text": "Q?", "sampling_params": {"stop": ["."]}, "return_logprob": True}
    data = post(srv, "/generate", body)
    assert data["text"] == "yes" and data["meta_info"]["finish_reason"] == {
        "type": "stop",
        "matched": ".",
    }


def test_sglang_input_logprobs(srv):
    body = {
        "text": "Hello world",
        "return_logprob": True,
        "logprob_start_len": 0,
        "top_logprobs_num": 2,
        "sampling_params": {"max_new_tokens": 1},
    }
    meta = post(srv, "/generate", body)["meta_info"]
    ids = TOK.encode("Hello world")
    assert [t[1] for t in meta["input_token_logprobs"]] == ids
    assert meta["input_token_logprobs"][0][0] is None
    assert meta["input_top_logprobs"][0] is None and len(meta["input_top_logprobs"][1]) == 2
    assert len(meta["output_top_logprobs"][0]) == 2


# --- TRL --------------------------------------------------------------------------------------


def test_trl_generate(srv):
    body = {"prompts": ["a", "b"], "n": 3, "max_tokens": 4, "temperature": 0.9, "top_k": -1}
    data = post(srv, "/generate/", body)
    assert len(data["completion_ids"]) == 6 and all(len(c) <= 4 for c in data["completion_ids"])
    assert data["prompt_ids"] == [TOK.encode("a"), TOK.encode("b")]
    assert [len(lp) for lp in data["logprobs"]] == [len(c) for c in data["completion_ids"]]


# --- latency, failures, counters, concurrency ------------------------------------------------


def test_latency_applies_to_generation_not_health(srv):
    srv.latency = 1.0  # long enough that a loaded machine's slow /health stays well below it
    start = time.monotonic()
    httpx.get(f"{srv.url}/health")
    assert time.monotonic() - start < 0.9
    start = time.monotonic()
    post(srv, "/chat/completions", {"messages": USER})
    assert time.monotonic() - start >= 1.0


def test_failure_injection(srv):
    srv.fail_next(2, status=503)
    for _ in range(2):
        r = httpx.post(f"{srv.base_url}/chat/completions", json={"messages": USER})
        assert r.status_code == 503 and r.json()["error"]["code"] == 503
    post(srv, "/chat/completions", {"messages": USER})
    srv.fail_next(1, status=500, paths=["/generate"])
    assert httpx.get(f"{srv.url}/health").status_code == 200
    assert httpx.post(f"{srv.url}/generate", json={"prompt": "x"}).status_code == 500
    assert httpx.post(f"{srv.url}/generate", json={"prompt": "x"}).status_code == 200
    assert srv.failures == 3 and srv.requests["/v1/chat/completions"] == 3
    with pytest.raises(ValueError):
        srv.fail_next(1, status=200)


def test_down_fails_everything_until_back_up(srv):
    srv.down = True
    assert httpx.get(f"{srv.url}/health").status_code == 503
    assert httpx.post(f"{srv.url}/generate", json={"prompt": "x"}).status_code == 503
    srv.down = False
    assert httpx.get(f"{srv.url}/health").status_code == 200
    assert srv.failures == 2 and srv.tokens_generated == 0


def test_queued_failures_can_be_cleared(srv):
    srv.fail_next(3)
    srv.clear_failures()
    assert httpx.get(f"{srv.url}/health").status_code == 200


def test_health_checks_spend_no_tokens(srv):
    for _ in range(20):
        httpx.get(f"{srv.url}/health")
    assert srv.requests["/health"] == 20 and srv.tokens_generated == 0 and srv.prompt_tokens == 0
    post(srv, "/generate", {"prompt": "x", "max_tokens": 3})
    assert 0 < srv.tokens_generated <= 3 and srv.prompt_tokens == 1


def test_concurrent_requests_overlap(srv):
    # aiohttp as the client: httpx's connection pool alone takes seconds for 500 connections
    srv.latency = 0.2

    async def main() -> float:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(srv.url, connector=connector) as session:

            async def one(i: int) -> int:
                body = {"prompt": {"prompt_token_ids": [1, i]}, "logprobs": 0}
                async with session.post("/generate", json=body) as r:
                    data = await r.json()
                    assert data["prompt_token_ids"] == [1, i]
                    return r.status

            start = time.monotonic()
            statuses = await asyncio.gather(*(one(i) for i in range(500)))
            assert statuses == [200] * 500
            return time.monotonic() - start

    elapsed = asyncio.run(main())
    assert srv.requests["/generate"] == 500
    # overlapped: one 0.2 s wait for all, not 500 in turn (100 s); the bound leaves room for a
    # loaded 2-core machine, where 1.5 s was once missed at 1.7 s
    assert 0.2 <= elapsed < 5.0, elapsed


def test_async_responder_and_fallback_to_random():
    async def answer(prompt: str) -> str | None:
        return "async!" if "async" in prompt else None

    with FakeInferenceServer(responder=answer, seed=3, completion_tokens=(2, 2)) as srv:
        one = post(srv, "/generate", {"prompt": "say async", "logprobs": 0})
        two = post(srv, "/generate", {"prompt": "other", "logprobs": 0})
    assert one["text"] == ["async!"]
    assert len(two["token_ids"][0]) == 3 and two["finish_reasons"] == ["stop"]  # 2 + eos


def test_stop_is_idempotent_and_restartable():
    server = FakeInferenceServer()
    with server:
        first = server.url
    server.stop()
    assert server.url is None
    with server:
        assert httpx.get(f"{server.url}/health").status_code == 200
    assert first is not None


def test_process_entry_point(tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "atropos.testing.fake_server", "--port", str(port)]
    cmd += ["--latency", "0.05", "--model", "proc"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the fake server process did not start"
            time.sleep(0.1)
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions", json={"messages": USER}, timeout=10
        )
        assert r.status_code == 200 and r.json()["model"] == "proc"
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=10)
    assert b"fake inference server on http://127.0.0.1:" in out

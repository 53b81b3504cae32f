"""`atropos local serve` over real HTTP: shapes, sampling fields, logprobs, batching, errors."""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

import httpx
import pytest

from atropos.local.decode import Row
from atropos.local.protocol import Sampling

USER = [{"role": "user", "content": "What is 2 + 2?"}]
CHOICE_KEYS = {
    "index",
    "text",
    "logprobs",
    "finish_reason",
    "stop_reason",
    "token_ids",
    "prompt_logprobs",
    "prompt_token_ids",
}


def greedy(server: Any, prompt: Any, max_tokens: int = 12, **body: Any) -> dict[str, Any]:
    data = server.complete(
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0,
        ignore_eos=True,
        return_token_ids=True,
        logprobs=0,
        **body,
    )
    choice: dict[str, Any] = data["choices"][0]
    return choice


def wait_for(predicate: Any, deadline: float = 10.0) -> None:
    end = time.monotonic() + deadline
    while not predicate():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.005)


def test_health_and_models_spend_no_tokens(server):
    before = server.engine.tokens_generated
    health = server.get("/health")
    assert health.status_code == 200 and health.json() == {"status": "ok", "policy_version": 0}
    models = server.get("/v1/models").json()
    assert models["object"] == "list"
    assert [(m["id"], m["max_model_len"], m["parent"]) for m in models["data"]] == [
        ("tiny", 256, None)
    ]
    assert server.engine.tokens_generated == before


def test_completion_has_vllm_shape_ids_and_token_id_spelling(server):
    tok = server.engine.tokenizer
    data = server.complete(
        prompt="The cat sat",
        max_tokens=5,
        n=2,
        logprobs=1,
        return_token_ids=True,
        return_tokens_as_token_ids=True,
        seed=1,
    )
    assert data["object"] == "text_completion" and data["model"] == "tiny"
    assert data["id"].startswith("cmpl-") and data["policy_version"] == 0
    prompt_ids = tok.encode("The cat sat")
    assert [c["index"] for c in data["choices"]] == [0, 1]
    for choice in data["choices"]:
        assert set(choice) == CHOICE_KEYS
        ids = choice["token_ids"]
        assert choice["prompt_token_ids"] == prompt_ids and 1 <= len(ids) <= 5
        lp = choice["logprobs"]
        assert lp["tokens"] == [f"token_id:{i}" for i in ids]
        assert len(lp["token_logprobs"]) == len(ids) == len(lp["top_logprobs"])
        assert all(f"token_id:{i}" in top for i, top in zip(ids, lp["top_logprobs"], strict=True))
        assert all(1 <= len(top) <= 2 for top in lp["top_logprobs"])
        assert lp["text_offset"][0] == 0
        assert choice["text"] == tok.decode(
            ids[:-1] if choice["finish_reason"] == "stop" else ids, skip_special_tokens=True
        )
    completion = sum(len(c["token_ids"]) for c in data["choices"])
    assert data["usage"]["prompt_tokens"] == len(prompt_ids)
    assert data["usage"]["completion_tokens"] == completion
    assert data["usage"]["total_tokens"] == len(prompt_ids) + completion


def test_plain_completion_has_nulls_where_vllm_has_them(server):
    choice = server.complete(prompt="hello", max_tokens=3)["choices"][0]
    assert choice["logprobs"] is None and choice["token_ids"] is None
    assert choice["prompt_token_ids"] is None and choice["prompt_logprobs"] is None


def test_several_prompts_in_one_request_and_a_one_token_prompt(server):
    data = server.complete(
        prompt=[[5], [7, 8, 9]], n=2, max_tokens=2, prompt_logprobs=2, return_token_ids=True
    )
    choices = data["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] for c in choices] == [[5], [5], [7, 8, 9], [7, 8, 9]]
    assert choices[0]["prompt_logprobs"] == [None]
    second = choices[2]["prompt_logprobs"]
    assert second[0] is None and [list(p)[0] for p in second[1:]] == ["8", "9"]
    assert all(2 <= len(p) <= 3 for p in second[1:])  # own token + best 2, deduplicated
    assert data["usage"]["prompt_tokens"] == 4


def test_chat_renders_the_template_with_the_generation_prompt(server):
    tok = server.engine.tokenizer
    body = {
        "messages": USER,
        "max_completion_tokens": 4,
        "logprobs": True,
        "top_logprobs": 3,
        "return_token_ids": True,
        "ignore_eos": True,
        "seed": 3,
    }
    data = server.post("/v1/chat/completions", body).json()
    text = tok.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert data["prompt_token_ids"] == tok.encode(text, add_special_tokens=False)
    assert data["object"] == "chat.completion" and data["policy_version"] == 0
    choice = data["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 4
    assert choice["message"]["role"] == "assistant"
    assert choice["message"]["content"] == tok.decode(choice["token_ids"], skip_special_tokens=True)
    content = choice["logprobs"]["content"]
    assert [e["token"] for e in content] == [tok.decode([i]) for i in choice["token_ids"]]
    for entry in content:
        assert len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["token"] == entry["token"]  # vLLM lists it first
        assert entry["bytes"] == list(entry["token"].encode())


def test_n_rows_and_max_tokens_give_length(server):
    data = server.complete(prompt="abc", n=3, max_tokens=4, ignore_eos=True, return_token_ids=True)
    assert [len(c["token_ids"]) for c in data["choices"]] == [4, 4, 4]
    assert {c["finish_reason"] for c in data["choices"]} == {"length"}
    assert {c["stop_reason"] for c in data["choices"]} == {None}


def test_greedy_is_deterministic_across_rows_and_requests(server):
    body = {"prompt": "Once upon", "n": 3, "max_tokens": 10, "temperature": 0}
    first = server.complete(**body, return_token_ids=True)
    again = server.complete(**body, return_token_ids=True)
    ids = [c["token_ids"] for c in first["choices"] + again["choices"]]
    assert all(i == ids[0] for i in ids)


def test_a_seed_reproduces_sampling(server):
    body = {"prompt": "Once upon", "n": 4, "max_tokens": 10, "temperature": 1.0}
    one = server.complete(**body, seed=11, return_token_ids=True)["choices"]
    two = server.complete(**body, seed=11, return_token_ids=True)["choices"]
    other = server.complete(**body, seed=12, return_token_ids=True)["choices"]
    assert [c["token_ids"] for c in one] == [c["token_ids"] for c in two]
    assert [c["token_ids"] for c in one] != [c["token_ids"] for c in other]
    assert len({tuple(c["token_ids"]) for c in one}) > 1  # rows draw independently


def test_a_stop_string_ends_the_text_before_it(server):
    base = greedy(server, "Tell me", max_tokens=16)
    text = base["text"]
    stop = text[4:7]
    at = text.find(stop)
    assert at > 0
    cut = greedy(server, "Tell me", max_tokens=16, stop=[stop, "never-there"])
    assert cut["text"] == text[:at] and cut["finish_reason"] == "stop"
    assert cut["stop_reason"] == stop
    ids = cut["token_ids"]
    assert ids == base["token_ids"][: len(ids)]  # ids keep the token that completed the stop
    kept = greedy(server, "Tell me", max_tokens=16, stop=stop, include_stop_str_in_output=True)
    assert kept["text"] == text[: at + len(stop)]


def test_a_stop_token_id_ends_the_row_with_it(server):
    base = greedy(server, "Tell me", max_tokens=8)["token_ids"]
    target = base[3]
    first = base.index(target)
    cut = greedy(server, "Tell me", max_tokens=8, stop_token_ids=[target])
    assert cut["token_ids"] == base[: first + 1]
    assert cut["finish_reason"] == "stop" and cut["stop_reason"] == target
    tok = server.engine.tokenizer
    assert cut["text"] == tok.decode(base[:first], skip_special_tokens=True)


def test_eos_ends_a_row_unless_ignored():
    decode = lambda ids, skip: "".join(chr(97 + i % 26) for i in ids)  # noqa: E731
    row = Row(None, 0, 0, [5], Sampling(max_tokens=10), 10, None)
    assert row.add(3, -0.1, [], frozenset({2}), decode) is False
    assert row.add(2, -0.2, [], frozenset({2}), decode) is True
    out = row.output()
    assert (out.ids, out.finish_reason, out.stop_reason, out.text) == ([3, 2], "stop", None, "d")
    ignoring = Row(None, 0, 0, [5], Sampling(ignore_eos=True), 2, None)
    assert ignoring.add(2, -0.1, [], frozenset({2}), decode) is False
    assert ignoring.add(2, -0.1, [], frozenset({2}), decode) is True
    assert ignoring.output().finish_reason == "length"


def test_concurrent_requests_share_a_batch_and_logprobs_match_a_plain_forward(
    server, forward_logprobs
):
    tok = server.engine.tokenizer
    texts = ["Hi", "A much longer prompt, with several more words in it", "Mid length prompt"]
    bodies = [
        {"prompt": tok.encode(t), "max_tokens": 7, "n": n, "temperature": temp, "seed": 5}
        | {"logprobs": 0, "return_token_ids": True, "prompt_logprobs": 1}
        for t, n, temp in zip(texts, [1, 2, 3], [0.0, 1.0, 0.7], strict=True)
    ]
    with concurrent.futures.ThreadPoolExecutor(len(bodies)) as pool:
        with server.engine.hold():
            futures = [
                pool.submit(httpx.post, server.url + "/v1/completions", json=b, timeout=60)
                for b in bodies
            ]
            wait_for(lambda: server.engine.waiting == len(bodies))
        answers = [f.result() for f in futures]
    batch = server.engine.batches[-1]
    assert (batch.requests, batch.rows) == (3, 6)
    worst = 0.0
    for body, answer in zip(bodies, answers, strict=True):
        assert answer.status_code == 200, answer.text
        for choice in answer.json()["choices"]:
            expected = forward_logprobs(body["prompt"], choice["token_ids"])
            got = choice["logprobs"]["token_logprobs"]
            worst = max(worst, *(abs(a - b) for a, b in zip(expected, got, strict=True)))
            prompt_lps = choice["prompt_logprobs"]
            assert prompt_lps[0] is None and len(prompt_lps) == len(body["prompt"])
            for pos, token in enumerate(body["prompt"][1:], start=1):
                entry = prompt_lps[pos][str(token)]
                assert list(prompt_lps[pos])[0] == str(token)
                ref = forward_logprobs(body["prompt"][:pos], [token])[0]
                worst = max(worst, abs(entry["logprob"] - ref))
    assert worst <= 1e-4


def test_batches_hold_at_most_max_batch_size_rows_and_one_request_is_never_split(
    model_dir, start_server
):
    body = {"prompt": "Hi", "max_tokens": 3, "return_token_ids": True}
    with start_server(model_dir, max_batch_size=2) as live:
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            with live.engine.hold():
                futures = [
                    pool.submit(live.post, "/v1/completions", body | {"n": n}) for n in (1, 1, 1)
                ]
                wait_for(lambda: live.engine.waiting == 3)
            assert all(f.result().status_code == 200 for f in futures)
            big = live.complete(**body, n=5)
        assert [(b.requests, b.rows) for b in live.engine.batches] == [(2, 2), (1, 1), (1, 5)]
        assert len(big["choices"]) == 5


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "x", "n": 0}, "n"),
        ("/v1/completions", {"prompt": "x", "temperature": "hot"}, "temperature"),
        ("/v1/completions", {"prompt": "x", "top_p": 0}, "top_p"),
        ("/v1/completions", {"prompt": "x", "max_tokens": -1}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 300}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "stop": 5}, "stop"),
        ("/v1/completions", {"prompt": "x", "seed": 1.5}, "seed"),
        ("/v1/completions", {"prompt": "x", "logprobs": 50}, "logprobs"),
        ("/v1/completions", {"prompt": "x", "prompt_logprobs": -1}, "prompt_logprobs"),
        ("/v1/completions", {"prompt": "x", "stream": True}, "stream"),
        ("/v1/completions", {"prompt": "x", "echo": True}, "echo"),
        ("/v1/completions", {"prompt": "x", "skip_special_tokens": "no"}, "skip_special_tokens"),
        ("/v1/completions", {"prompt": "x", "stop_token_ids": [10**6]}, "stop_token_ids"),
        ("/v1/completions", {"prompt": []}, "prompt"),
        ("/v1/completions", {"prompt": ""}, "prompt"),
        ("/v1/completions", {"prompt": [1, 10**6]}, "prompt"),
        ("/v1/completions", {"prompt": [1] * 250, "max_tokens": 16}, "max_tokens"),
        ("/v1/completions", {"prompt": "x", "model": 3}, "model"),
        ("/v1/chat/completions", {}, "messages"),
        ("/v1/chat/completions", {"messages": [{"content": "x"}]}, "messages"),
        ("/v1/chat/completions", {"messages": USER, "top_logprobs": 2}, "top_logprobs"),
        (
            "/v1/chat/completions",
            {"messages": USER, "max_completion_tokens": 0},
            "max_completion_tokens",
        ),
        ("/v1/chat/completions", {"messages": USER, "logprobs": 1}, "logprobs"),
    ],
)
def test_bad_fields_get_a_400_naming_them(server, path, body, param):
    r = server.post(path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] and error["code"] == 400
    assert param in error["message"] or param in ("prompt", "max_tokens", "messages")


def test_broken_json_unknown_model_and_unknown_route(server):
    r = server.client.post("/v1/completions", content=b"{not json")
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    assert server.post("/v1/completions", [1, 2]).status_code == 400
    r = server.post("/v1/completions", {"prompt": "x", "model": "gpt-9"})
    assert r.status_code == 404
    assert r.json()["error"] == {
        "message": "The model `gpt-9` does not exist.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    assert server.get("/v1/nothing").status_code == 404
    assert server.get("/v1/completions").status_code == 405


def test_the_api_key_guards_everything_but_health(model_dir, start_server):
    with start_server(model_dir, api_key="sesame") as live:
        assert live.get("/health").status_code == 200
        r = live.get("/v1/models")
        assert r.status_code == 401 and r.json()["error"]["message"] == "Unauthorized"
        assert live.post("/v1/completions", {"prompt": "x"}).status_code == 401
        headers = {"Authorization": "Bearer sesame"}
        assert live.get("/v1/models", headers=headers).status_code == 200
        r = live.post("/v1/completions", {"prompt": "x", "max_tokens": 2}, headers=headers)
        assert r.status_code == 200


def test_metrics_serve_vllm_ttft_histograms_an_env_reads(server):
    """`GET /metrics` has vLLM's TTFT and queue-time histograms; an env's reader notes what
    grew between two reads into its `ttft` and `server_queue` stages."""
    import asyncio

    from atropos.inference.config import APIServerConfig
    from atropos.inference.latency import Latencies
    from atropos.inference.server_metrics import ServerMetrics

    config = APIServerConfig(base_url=server.url + "/v1", server_type="vllm", model_name="tiny")
    metrics, stages = ServerMetrics([config]), Latencies()
    asyncio.run(metrics.poll(stages, now=0.0))  # the baseline
    for _ in range(3):
        greedy(server, [1, 2, 3], max_tokens=4)
    text = server.get("/metrics").text
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text
    assert "vllm:request_queue_time_seconds_count" in text
    asyncio.run(metrics.poll(stages, now=10.0))
    assert metrics.servers[0].read, "the reader found the histograms"
    assert stages.stages["ttft"].summary()["count"] == 3
    assert stages.stages["server_queue"].summary()["count"] == 3
    assert 0 < stages.stages["ttft"].summary()["max"] < 60

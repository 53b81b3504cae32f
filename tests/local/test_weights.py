"""Changing what the local server generates with: reloads from disk and LoRA adapters."""

from __future__ import annotations

import concurrent.futures
import copy
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from atropos.local.lora import load_adapter, merge_adapter, save_adapter

PROMPT = "Reload me"


def greedy(live: Any, model: str | None = None, max_tokens: int = 10) -> dict[str, Any]:
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    body |= {"logprobs": 0, "return_token_ids": True} | ({"model": model} if model else {})
    data = live.complete(**body)
    return {
        "ids": data["choices"][0]["token_ids"],
        "lps": data["choices"][0]["logprobs"]["token_logprobs"],
        "prompt": live.engine.tokenizer.encode(PROMPT),
        "version": data["policy_version"],
    }


def random_adapter(reference: Any, path: Path, scale: float = 0.5) -> Path:
    generator = torch.Generator().manual_seed(3)
    weights = {}
    for layer in range(2):
        for name in ("q_proj", "v_proj"):
            module = f"model.layers.{layer}.self_attn.{name}"
            out, inp = reference.get_submodule(module).weight.shape
            a = torch.randn(4, inp, generator=generator) * scale
            b = torch.randn(out, 4, generator=generator) * scale
            weights[module] = (a, b)
    save_adapter(path, weights, r=4, alpha=8, target_modules=["q_proj", "v_proj"], base_model="t")
    return path


def assert_close(expected: list[float], got: list[float]) -> None:
    assert max(abs(a - b) for a, b in zip(expected, got, strict=True)) <= 1e-4


def test_update_weights_from_disk_reloads_in_place_and_counts_versions(
    model_dir, other_model_dir, start_server, forward_logprobs
):
    from atropos.local.weights import load_fp32

    other = load_fp32(str(other_model_dir))
    with start_server(model_dir, policy_version=3) as live:
        base = greedy(live)
        assert base["version"] == 3
        r = live.post("/update_weights_from_disk", {"model_path": str(other_model_dir)})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["success"] is True and answer["policy_version"] == 4
        assert answer["message"]
        moved = greedy(live)
        assert moved["version"] == 4 and moved["ids"] != base["ids"]
        assert_close(forward_logprobs(moved["prompt"], moved["ids"], other), moved["lps"])
        assert live.get("/health").json()["policy_version"] == 4
        body = {"model_path": str(model_dir), "policy_version": 10}
        assert live.post("/update_weights_from_disk", body).json()["policy_version"] == 10
        back = greedy(live)
        assert (back["ids"], back["lps"], back["version"]) == (base["ids"], base["lps"], 10)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({}, "model_path"),
        ({"model_path": "no/such/dir"}, "not a directory"),  # under the working dir
        ({"model_path": "."}, "no model.safetensors"),
        ({"model_path": "MODEL", "policy_version": "7"}, "policy_version"),
    ],
)
def test_a_bad_reload_is_a_400_and_changes_nothing(server, model_dir, body, needle):
    if body.get("model_path") == "MODEL":
        body = body | {"model_path": str(model_dir)}
    r = server.post("/update_weights_from_disk", body)
    assert r.status_code == 400, r.text
    answer = r.json()
    assert answer["success"] is False and needle in answer["message"]
    assert answer["error"]["code"] == 400
    assert server.engine.policy_version == 0


def test_a_checkpoint_of_another_shape_is_refused(server, tmp_path):
    from safetensors.torch import save_file

    save_file({"model.embed_tokens.weight": torch.zeros(3, 3)}, tmp_path / "model.safetensors")
    r = server.post("/update_weights_from_disk", {"model_path": str(tmp_path)})
    assert r.status_code == 400 and "shape" in r.json()["message"]


def test_a_reload_waits_for_the_running_batch(
    model_dir, other_model_dir, start_server, forward_logprobs
):
    body = {"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "ignore_eos": True}
    body |= {"logprobs": 0, "return_token_ids": True}
    with start_server(model_dir) as live, concurrent.futures.ThreadPoolExecutor(1) as pool:
        long = pool.submit(live.complete, **body)
        deadline = time.monotonic() + 10
        while not (live.engine.busy or long.done()):
            assert time.monotonic() < deadline
            time.sleep(0.001)
        r = live.post("/update_weights_from_disk", {"model_path": str(other_model_dir)})
        assert r.json()["policy_version"] == 1
        data = long.result()
        choice = data["choices"][0]
        assert data["policy_version"] == 0  # every token from the old weights
        prompt = live.engine.tokenizer.encode(PROMPT)
        assert_close(
            forward_logprobs(prompt, choice["token_ids"]), choice["logprobs"]["token_logprobs"]
        )


def test_lora_adapters_load_generate_and_unload_exactly(
    model_dir, start_server, reference, forward_logprobs, tmp_path
):
    path = random_adapter(reference, tmp_path / "adapter")
    with start_server(model_dir) as live:
        base = greedy(live)
        r = live.post("/v1/load_lora_adapter", {"lora_name": "sql", "lora_path": str(path)})
        assert r.status_code == 200 and r.text == "Success: LoRA adapter 'sql' added successfully."
        cards = live.get("/v1/models").json()["data"]
        assert [(c["id"], c["parent"], c["root"]) for c in cards][1] == ("sql", "tiny", str(path))
        adapted = greedy(live, model="sql")
        assert adapted["ids"] != base["ids"]
        merged = copy.deepcopy(reference)
        merge_adapter(merged, load_adapter(path))
        assert_close(forward_logprobs(adapted["prompt"], adapted["ids"], merged), adapted["lps"])
        assert greedy(live) == base  # the base is restored exactly between batches
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            with live.engine.hold():
                jobs = [pool.submit(greedy, live, m) for m in ("sql", None, "sql", None)]
                while live.engine.waiting < 4:
                    time.sleep(0.005)
            results = [j.result() for j in jobs]
        for got, want in zip(results, [adapted, base, adapted, base], strict=True):
            assert got["ids"] == want["ids"]  # batched with a twin: same tokens, near-same lps
            assert_close(want["lps"], got["lps"])
        assert sorted((b.adapter or "", b.requests) for b in list(live.engine.batches)[-2:]) == [
            ("", 2),
            ("sql", 2),
        ]
        r = live.post("/v1/unload_lora_adapter", {"lora_name": "sql"})
        assert (
            r.status_code == 200 and r.text == "Success: LoRA adapter 'sql' removed successfully."
        )
        assert greedy(live) == base
        r = live.post("/v1/completions", {"prompt": PROMPT, "model": "sql"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "model"
        assert [c["id"] for c in live.get("/v1/models").json()["data"]] == ["tiny"]


def test_lora_endpoint_errors_match_vllm(server, reference, tmp_path):
    path = random_adapter(reference, tmp_path / "ok")
    load, unload = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"

    def error(r: Any, status: int) -> dict[str, Any]:
        assert r.status_code == status, r.text
        body: dict[str, Any] = r.json()["error"]
        assert body["code"] == status
        return body

    missing = error(server.post(load, {"lora_name": "x"}), 400)
    assert missing["message"] == "Both 'lora_name' and 'lora_path' must be provided."
    assert missing["param"] == "lora_path" and missing["type"] == "InvalidUserInput"
    gone = error(server.post(load, {"lora_name": "x", "lora_path": str(tmp_path / "no")}), 404)
    assert "No adapter found" in gone["message"] and gone["type"] == "NotFoundError"
    wrong = tmp_path / "wrong"
    save_adapter(
        wrong, {"model.layers.0.mlp.up_proj": (torch.ones(2, 5), torch.ones(64, 2))},
        r=2, alpha=2, target_modules=["up_proj"],
    )  # fmt: skip
    shape = error(server.post(load, {"lora_name": "x", "lora_path": str(wrong)}), 400)
    assert "shape mismatch" in shape["message"] and "up_proj" in shape["message"]
    assert server.post(load, {"lora_name": "a", "lora_path": str(path)}).status_code == 200
    again = error(server.post(load, {"lora_name": "a", "lora_path": str(path)}), 400)
    assert again["message"] == "The lora adapter 'a' has already been loaded."
    assert error(server.post(load, {"lora_name": "tiny", "lora_path": str(path)}), 400)
    unknown = error(server.post(unload, {"lora_name": "b"}), 404)
    assert unknown["message"] == "The lora adapter 'b' cannot be found."
    assert error(server.post(unload, {}), 400)["param"] == "lora_name"
    assert server.post(unload, {"lora_name": "a"}).status_code == 200


def test_load_inplace_replaces_an_adapter_of_the_same_name(
    model_dir, start_server, reference, forward_logprobs, tmp_path
):
    first = random_adapter(reference, tmp_path / "v1", scale=0.5)
    second = random_adapter(reference, tmp_path / "v2", scale=1.5)
    load = "/v1/load_lora_adapter"
    with start_server(model_dir) as live:
        assert live.post(load, {"lora_name": "p", "lora_path": str(first)}).status_code == 200
        one = greedy(live, model="p")
        body = {"lora_name": "p", "lora_path": str(second), "load_inplace": True}
        assert live.post(load, body).status_code == 200
        two = greedy(live, model="p")
        assert two["ids"] != one["ids"]
        merged = copy.deepcopy(reference)
        merge_adapter(merged, load_adapter(second))
        assert_close(forward_logprobs(two["prompt"], two["ids"], merged), two["lps"])

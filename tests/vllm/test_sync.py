"""The trainer's weight sync against vLLM itself: `--sync reload` through the route vLLM has,
`restart` with a vLLM command, `lora` hot swaps, and `transfer`'s refusal on a CPU with advice
that works. Each test that changes weights gets a vLLM of its own (`private=`)."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")

from atropos.api.app import create_app  # noqa: E402
from atropos.local.weights import untied_copy  # noqa: E402
from atropos.testing import serve_in_thread  # noqa: E402
from atropos.testing.vllm import VLLMServer, tiny_policy_path  # noqa: E402
from atropos.trainer.sync import SyncError  # noqa: E402
from atropos.trainer.train import train  # noqa: E402

from ..trainer.helpers import config, push_groups  # noqa: E402
from ..trainer.helpers import trained as train_against  # noqa: E402

pytestmark = pytest.mark.slow
PROMPT = [11, 40, 300, 77, 5, 210, 99, 4, 18, 400]


def vllm_prompt_logprobs(server: VLLMServer, model: str | None = None) -> list[float]:
    """vLLM's logprob of each prompt token after the first (its own forward pass)."""
    body = {
        "model": model or server.served_model_name,
        "prompt": PROMPT,
        "max_tokens": 1,
        "temperature": 0,
        "prompt_logprobs": 0,
    }
    answer = httpx.post(f"{server.base_url}/completions", json=body, timeout=60).json()
    rows = answer["choices"][0]["prompt_logprobs"]
    return [float(rows[i][str(PROMPT[i])]["logprob"]) for i in range(1, len(PROMPT))]


def hf_prompt_logprobs(model_dir: Path) -> list[float]:
    """transformers' logprobs of the same tokens, float32, on the weights in `model_dir`."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    return [float(logp[i - 1, PROMPT[i]]) for i in range(1, len(PROMPT))]


def gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def trained(server_url: str, out: Path, **kw) -> tuple[list[dict], dict]:
    """Train the tiny policy (or `model=`) against `server_url` (`helpers.trained`)."""
    return train_against(server_url, out, Path(kw.pop("model", tiny_policy_path())), **kw)


@pytest.fixture(scope="module")
def untied(tmp_path_factory) -> Path:
    """The tiny policy with an LM head of its own (`untied_copy`): vLLM reloads it whole."""
    return untied_copy(tiny_policy_path(), tmp_path_factory.mktemp("untied") / "policy")


def test_untied_copy_is_the_same_model(untied):
    assert gap(hf_prompt_logprobs(untied), hf_prompt_logprobs(tiny_policy_path())) < 1e-6
    assert json.loads((untied / "config.json").read_text())["tie_word_embeddings"] is False


def test_reload_goes_through_vllms_own_route_and_serves_the_new_weights(
    vllm_servers, untied, tmp_path
):
    server = vllm_servers.get(private="its weights are replaced", model=untied)
    before = vllm_prompt_logprobs(server)
    out = tmp_path / "run"
    rows, status = trained(server.base_url, out, sync="reload", model=str(untied))
    assert [r["served_policy_version"] for r in rows] == [1, 2]
    assert status["policy_version"] == 2  # said to the API once each sync completed
    after = vllm_prompt_logprobs(server)
    expected = hf_prompt_logprobs(out / "weights" / "v2")
    assert gap(after, expected) < 1e-4  # vLLM serves exactly the trainer's v2
    assert gap(before, after) > 1e-3  # and they did move
    log = server.log_path.read_text(errors="replace")
    assert '/update_weights_from_disk HTTP/1.1" 404' in log  # tried first, then detected
    assert '/collective_rpc HTTP/1.1" 200' in log


def test_restart_runs_the_documented_vllm_command(vllm_python, tmp_path):
    """`--sync restart` with a vLLM command template: the trainer starts it, restarts it on
    the new checkpoint, and stops it at the end (one step: each start costs ~40 s)."""
    template = VLLMServer(vllm_python, tmp_path / "srv")
    argv = template.command()
    argv[argv.index("--model") + 1] = "{model}"
    argv[argv.index("--port") + 1] = "{port}"
    env_prefix = ["env", *(f"{k}={v}" for k, v in template.environ().items() if k.startswith(
        ("VLLM_", "OMP_", "HF_", "TRANSFORMERS_", "DO_NOT", "TOKENIZERS", "ATROPOS_TEST")
    ))]  # fmt: skip
    command = shlex.join([*env_prefix, *argv])
    out = tmp_path / "run"
    rows, status = trained(template.base_url, out, sync="restart", server_command=command, steps=1)
    assert [r["served_policy_version"] for r in rows] == [1]
    assert status["policy_version"] == 1
    with pytest.raises(httpx.TransportError):  # the trainer stopped the server it started
        httpx.get(f"{template.root}/health", timeout=2)


def test_lora_hot_swaps_adapters_into_vllm(vllm_lora_server, tmp_path):
    """On the session's LoRA server (shared: an adapter name of its own, unloaded after)."""
    server, name = vllm_lora_server, f"policy-{tmp_path.name[-8:]}"
    out = tmp_path / "run"
    try:
        rows, status = trained(
            server.base_url, out, sync="lora", lora_r=4, lora_alpha=8.0,
            lora_targets=["q_proj", "v_proj"], lora_name=name, lr=1e-2,
        )  # fmt: skip
        assert [r["served_policy_version"] for r in rows] == [1, 2]
        assert status["policy_version"] == 2
        models = httpx.get(f"{server.base_url}/models").json()["data"]
        policy = [m for m in models if m["id"] == name]
        assert policy and Path(policy[0]["root"]).name == "v2", models
        answer = httpx.post(
            f"{server.base_url}/completions",
            json={"model": name, "prompt": PROMPT, "max_tokens": 4, "temperature": 0},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
    finally:
        httpx.post(f"{server.base_url}/unload_lora_adapter", json={"lora_name": name}, timeout=60)


def test_transfer_on_a_cpu_is_refused_with_advice_that_works(vllm_server, tmp_path):
    out = tmp_path / "run"
    with serve_in_thread(create_app()) as url:
        push_groups(url, 2)
        cfg = config(
            tiny_policy_path(), url, out, steps=1, server_url=vllm_server.base_url,
            sync="transfer", transfer_timeout=30,
        )  # fmt: skip
        with pytest.raises(SyncError) as refused:
            train(cfg)
    message = str(refused.value)
    assert "--sync reload" in message and "VLLM_SERVER_DEV_MODE=1" in message, message
    assert "--transfer-backend gloo" not in message
    assert math.isfinite(vllm_prompt_logprobs(vllm_server)[0])  # the server is unharmed

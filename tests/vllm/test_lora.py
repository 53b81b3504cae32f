"""LoRA adapters through our client against both servers of the tiny policy: an adapter loaded
with vLLM's `/v1/load_lora_adapter` is asked for by name (`model_name`), and its ids and logprobs
are the adapted policy's (transformers with the adapter merged, `atropos.local.lora`), while the
base name still answers with the base policy. The vLLM one is `vllm_lora_server`, an instance of
its own (`--enable-lora`; vLLM 0.32's CPU LoRA path cannot take prompt_logprobs)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from atropos.inference.config import ServerManagerConfig
from atropos.inference.manager import ServerManager
from atropos.testing.vllm import VLLMServer, tiny_policy_path

from .helpers import MODEL, Target

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
torch = pytest.importorskip("torch")
TOLERANCE = 1e-4
MODULES = ("q_proj", "v_proj")


@pytest.fixture(scope="session", params=["local", "vllm"])
def lora_target(request: pytest.FixtureRequest) -> Target:
    """A server of the tiny policy that loads adapters at run time, each in turn."""
    if request.param == "local":
        found: Target = request.getfixturevalue("local_target")
        return found
    server: VLLMServer = request.getfixturevalue("vllm_lora_server")
    return Target("vllm", server.base_url)


def make_adapter(path: Path, seed: int) -> Any:
    """A rank-8 adapter on every layer's q_proj and v_proj, large enough to move logprobs."""
    from atropos.local.lora import load_adapter, save_adapter

    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(4):
        for name in MODULES:
            out = 64 if name == "v_proj" else 128  # 2 kv heads of 32, 4 heads of 32
            a = torch.randn(8, 128, generator=generator) * 0.3
            b = torch.randn(out, 8, generator=generator) * 0.3
            weights[f"model.layers.{layer}.self_attn.{name}"] = (a, b)
    save_adapter(path, weights, r=8, alpha=16, target_modules=list(MODULES))
    return load_adapter(path)


def adapted_reference(adapter: Any) -> Callable[[list[int], list[int]], list[float]]:
    """`fn(prompt, output)`: logprobs of the tiny policy with `adapter` merged (float32)."""
    from atropos.inference.tokenizer import import_transformers_quietly
    from atropos.local.lora import merge_adapter

    transformers = import_transformers_quietly()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(tiny_policy_path()), dtype=torch.float32
    ).eval()
    merge_adapter(model, adapter)

    def logprobs(prompt: list[int], output: list[int]) -> list[float]:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + output]), use_cache=False).logits[0]
        table = torch.log_softmax(logits.float(), dim=-1)
        return [float(table[len(prompt) - 1 + i, t]) for i, t in enumerate(output)]

    return logprobs


def worst(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def post(target: Target, path: str, body: dict[str, Any]) -> None:
    root = target.base_url.removesuffix("/v1")
    answer = httpx.post(root + path, json=body, timeout=120)
    assert answer.status_code == 200, answer.text


def sample(target: Target, model: str, ids: list[int]) -> tuple[list[list[int]], Any]:
    async def main() -> Any:
        config = target.config(model_name=model)
        async with ServerManager([config], ServerManagerConfig(deadline=120.0)) as m:
            return await m.tokens_and_logprobs_completion(
                input_ids=ids, n=3, max_tokens=8, temperature=1.0, seed=11, ignore_eos=True
            )

    _, outputs, logprobs, _ = asyncio.run(main())
    return outputs, logprobs


def test_an_adapter_asked_for_by_name_is_the_adapted_policy(
    lora_target: Target,
    tmp_path: Path,
    tokenizer: Any,
    reference: Callable[[list[int], list[int]], list[float]],
) -> None:
    name = f"policy-{uuid.uuid4().hex[:8]}"
    first, second = make_adapter(tmp_path / "v1", 1), make_adapter(tmp_path / "v2", 2)
    ids = tokenizer.encode("Question: what is 12 + 7? Answer:")
    post(lora_target, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(first.path)})
    try:
        for adapter in (first, second):
            if adapter is second:  # a new version under the same name, as the trainer does
                body = {"lora_name": name, "lora_path": str(adapter.path), "load_inplace": True}
                post(lora_target, "/v1/load_lora_adapter", body)
            expected = adapted_reference(adapter)
            outputs, logprobs = sample(lora_target, name, ids)
            moved = 0.0
            for out, lps in zip(outputs, logprobs, strict=True):
                assert len(out) == len(lps) == 8
                assert worst(lps, expected(ids, out)) < TOLERANCE
                moved = max(moved, worst(lps, reference(ids, out)))
            assert moved > 1e-2, "the adapter did not change the policy"
        outputs, logprobs = sample(lora_target, MODEL, ids)  # the base, on the same server
        for out, lps in zip(outputs, logprobs, strict=True):
            assert worst(lps, reference(ids, out)) < TOLERANCE
    finally:
        post(lora_target, "/v1/unload_lora_adapter", {"lora_name": name})

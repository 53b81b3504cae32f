"""What the SGLang tests share: our client's configuration of a server, and the reference they
are held to (transformers' float32 forward pass over the same ids)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.inference.manager import ServerManager
from atropos.testing.sglang import SGLangServer

MODEL = "atropos-tiny"
TOLERANCE = 1e-4  # float32 on both sides
PROMPT = [11, 40, 300, 77, 5, 210, 99, 4, 18, 400]


def manager(server: SGLangServer, **settings: Any) -> ServerManager:
    """Our client (`server_type="sglang"`) through a `ServerManager` over `server` alone."""
    config = APIServerConfig(base_url=server.base_url, server_type="sglang", model_name=MODEL)
    options = ServerManagerConfig(**{"health_check_interval": 0.5, "deadline": 60.0, **settings})
    return ServerManager([config], options)


def hf_logprobs(model_dir: str | Path, ids: list[int]) -> Any:
    """transformers' log-softmax over `ids` on the weights in `model_dir` (float32, one
    uncached forward pass); row i is the distribution of the id after ids[: i + 1]."""
    import torch

    from atropos.inference.tokenizer import import_transformers_quietly

    transformers = import_transformers_quietly()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    with torch.no_grad():
        logits = model.eval()(torch.tensor([ids]), use_cache=False).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


def hf_prompt_logprobs(model_dir: str | Path, ids: list[int] = PROMPT) -> list[float]:
    """transformers' logprob of each id after the first."""
    table = hf_logprobs(model_dir, ids)
    return [float(table[i - 1, ids[i]]) for i in range(1, len(ids))]


def served_prompt_logprobs(server: SGLangServer, ids: list[int] = PROMPT) -> list[float]:
    """SGLang's logprob of each id after the first (its own forward pass, `/generate`)."""
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 1, "temperature": 0},
        "return_logprob": True,
        "logprob_start_len": 0,
    }
    answer = httpx.post(f"{server.root}/generate", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    rows = answer.json()["meta_info"]["input_token_logprobs"]
    assert [row[1] for row in rows] == ids
    return [float(row[0]) for row in rows[1:]]


def gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)

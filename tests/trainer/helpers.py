"""Shared pieces of the trainer tests (and the trainer's metrics tests): scored groups pushed to
a live API, a small training config, and the metrics the trainer wrote."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import httpx

from atropos.trainer.train import TrainConfig


def push_groups(url: str, n: int, seed: int = 0, size: int = 4) -> None:
    """`n` random groups of `size` sequences (mixed scores, logprobs) posted to the API at `url`."""
    rng = random.Random(seed)
    groups = []
    for _ in range(n):
        prompt = [rng.randrange(10, 500) for _ in range(4)]
        tokens, masks, logprobs = [], [], []
        for _ in range(size):
            out = [rng.randrange(10, 500) for _ in range(rng.randrange(2, 6))]
            tokens.append(prompt + out)
            masks.append([-100] * len(prompt) + out)
            logprobs.append([1.0] * len(prompt) + [-rng.uniform(3, 9) for _ in out])
        scores = [float(rng.random() < 0.5) for _ in range(size)]
        scores[0] = 1.0 - scores[1]  # never all equal
        groups.append(
            {"tokens": tokens, "masks": masks, "scores": scores, "inference_logprobs": logprobs}
        )
    r = httpx.post(f"{url}/scored_data_list", json=groups)
    assert r.status_code == 200, r.text


def config(model: Path, url: str, out: Path, **kw: Any) -> TrainConfig:
    """Batches of 8 in micro-batches of 4, 64 tokens, no weight sync; `kw` on top."""
    base: dict[str, Any] = dict(
        model=str(model), api_url=url, out_dir=out, batch_size=8, micro_batch_size=4,
        seq_len=64, lr=1e-3, sync="none", patience=10.0,
    )  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


def metrics(out: Path) -> list[dict[str, Any]]:
    """The records of `out/metrics.jsonl`, in order."""
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def trained(
    server_url: str, out: Path, model: Path, **kw: Any
) -> tuple[list[dict[str, Any]], dict]:
    """Train `model` 2 steps (or `steps=`) against a live API and the inference server at
    `server_url` (`kw`: more `TrainConfig` fields); the trainer's metrics and the API's
    `/status` at the end (`policy_version`: what the trainer last published)."""
    from atropos.api.app import create_app
    from atropos.testing import serve_in_thread
    from atropos.trainer.train import train

    kw.setdefault("steps", 2)
    with serve_in_thread(create_app()) as url:
        push_groups(url, 2 * kw["steps"])
        train(config(model, url, out, server_url=server_url, **kw))
        status = httpx.get(f"{url}/status").json()
    return metrics(out), status

"""TRL's GRPOTrainer on Atropos batches, for real: `python -m atropos.integrations.trl` in the
TRL venv (`scripts/upstream_venv.py trl`) trains the tiny policy for a few steps on batches a real
API serves, publishing to a real local server after every step; what TRL's loss saw is what the
API served (tokens, trained positions, advantages by the contract's rules, inference logprobs)."""

from __future__ import annotations

import json
import math
import random
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch")

from atropos.api import create_app  # noqa: E402
from atropos.rewards.group import group_advantages  # noqa: E402
from atropos.testing import serve_in_thread  # noqa: E402
from atropos.testing.serve import local_tiny_server  # noqa: E402
from atropos.tiny.warmstart import policy_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STEPS, BATCH, GROUP = 3, 4, 2


def group(rng: random.Random, kind: str) -> dict[str, Any]:
    """A group of GROUP sequences: a prompt (untrained), a completion (trained), and what
    `kind` adds: inference logprobs, per-token advantages, or an override."""
    tokens, masks, logprobs = [], [], []
    for _ in range(GROUP):
        prompt = [rng.randrange(4, 1000) for _ in range(rng.randrange(3, 7))]
        completion = [rng.randrange(4, 1000) for _ in range(rng.randrange(2, 9))]
        tokens.append(prompt + completion)
        masks.append([-100] * len(prompt) + completion)
        logprobs.append([1.0] * len(prompt) + [-rng.uniform(0.1, 5) for _ in completion])
    g: dict[str, Any] = {"tokens": tokens, "masks": masks, "scores": [1.0, -0.5]}
    if kind != "no-logprobs":
        g["inference_logprobs"] = logprobs
    if kind == "per-token":
        g["advantages"] = [[rng.uniform(-1, 1) for _ in t] for t in tokens]
    if kind == "override":
        g["overrides"] = [{}, {"set_advantage_to_zero": True}]
    return g


def expected(g: dict[str, Any]) -> list[dict[str, Any]]:
    """What TRL should see of each sequence of `g` (the contract's advantage rules)."""
    rows = []
    by_score = group_advantages(g["scores"])
    for i, (toks, msk) in enumerate(zip(g["tokens"], g["masks"], strict=True)):
        trained = [k for k in range(1, len(toks)) if msk[k] != -100]
        if "advantages" in g:
            adv = [g["advantages"][i][k] for k in trained]
        else:
            adv = [by_score[i]] * len(trained)
        if (g.get("overrides") or [{}, {}])[i].get("set_advantage_to_zero"):
            adv = [0.0] * len(trained)
        lps = g.get("inference_logprobs")
        old = [lps[i][k] for k in trained] if lps else [0.0] * len(trained)
        rows.append(
            {"tokens": toks, "trained": trained, "advantages": adv, "inference_logprobs": old}
        )
    return rows


def served_version(server: str) -> int:
    body = {"model": "atropos-tiny", "prompt": "hi", "max_tokens": 2, "temperature": 0}
    r = httpx.post(f"{server}/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return int(r.json()["policy_version"])


def trained_away(final: Path) -> bool:
    """Whether the final checkpoint's weights differ from the warm start's."""
    from safetensors.torch import load_file

    before = load_file(str(policy_path() / "model.safetensors"))
    after = load_file(str(final / "model.safetensors"))
    return any(not after[k].equal(v) for k, v in before.items() if k in after)


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) < 1e-5 for x, y in zip(a, b, strict=True))


def test_trl_trains_on_served_batches_and_publishes(trl_python: Path, tmp_path: Path) -> None:
    rng = random.Random(0)
    kinds = ["logprobs", "per-token", "override", "no-logprobs", "logprobs", "logprobs"]
    groups = [group(rng, kind) for kind in kinds]  # 2 groups a batch, 3 batches
    with local_tiny_server(max_model_len=256) as server, serve_in_thread(create_app()) as url:
        assert httpx.post(f"{url}/scored_data_list", json=groups).status_code == 200
        argv = [
            str(trl_python), "-m", "atropos.integrations.trl", "--model", str(policy_path()),
            "--api-url", url, "--server-url", server, "--steps", str(STEPS),
            "--batch-size", str(BATCH), "--out-dir", str(tmp_path / "run"),
            "--record", str(tmp_path / "seen.jsonl"), "--lr", "1e-3",
        ]  # fmt: skip
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        assert served_version(server) == STEPS  # published after every step
        assert httpx.get(f"{url}/status").json()["policy_version"] == STEPS
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(math.isfinite(m["loss"]) for m in metrics)
    assert trained_away(tmp_path / "run" / "checkpoints" / f"step_{STEPS}")
    seen = [json.loads(x) for x in (tmp_path / "seen.jsonl").read_text().splitlines()]
    assert [s["step"] for s in seen] == [1, 2, 3] and all(math.isfinite(s["loss"]) for s in seen)
    for step, batch in zip(seen, [groups[0:2], groups[2:4], groups[4:6]], strict=True):
        want = sorted((r for g in batch for r in expected(g)), key=lambda r: r["tokens"])
        got = sorted(step["rows"], key=lambda r: r["tokens"])  # TRL shuffles the rows
        assert [r["tokens"] for r in got] == [r["tokens"] for r in want]
        assert [r["trained"] for r in got] == [r["trained"] for r in want]
        for g_row, w_row in zip(got, want, strict=True):
            assert close(g_row["advantages"], w_row["advantages"]), (g_row, w_row)
            assert close(g_row["inference_logprobs"], w_row["inference_logprobs"])

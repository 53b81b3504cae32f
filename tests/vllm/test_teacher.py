"""The teacher step of on-policy distillation (`--teacher.*`, `atropos.envs.teacher`) with each
server of the tiny policy (`target`: `atropos local serve`, then real vLLM) as both the policy
and the teacher: `atropos env process arithmetic` writes groups whose `distill_token_ids` /
`distill_logprobs` are that server's own top-k `prompt_logprobs` of the groups' tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from atropos.envs import registry
from atropos.envs.cli import main

from .helpers import MODEL, Target

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]  # the first test starts the server
TOP_K = 3
TOLERANCE = 1e-4  # the same server scoring the same ids twice; measured: 0 on vLLM


def top_k(target: Target, tokens: list[int]) -> list[tuple[list[int], list[float]]]:
    """The server's own top-k per position (best first; empty at position 0), asked directly."""
    body = {"model": MODEL, "prompt": tokens, "max_tokens": 1, "temperature": 0}
    answer = httpx.post(f"{target.base_url}/completions", json=body | {"prompt_logprobs": TOP_K})
    answer.raise_for_status()
    rows = []
    for position in answer.json()["choices"][0]["prompt_logprobs"]:
        ranked = sorted((position or {}).items(), key=lambda kv: -kv[1]["logprob"])[:TOP_K]
        rows.append(([int(i) for i, _ in ranked], [float(v["logprob"]) for _, v in ranked]))
    return rows


@pytest.fixture(scope="module")
def groups(target: Target, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Three groups of two from `atropos env process arithmetic`, the server as both."""
    out = Path(tmp_path_factory.mktemp(f"teacher-{target.name}")) / "arithmetic.jsonl"
    argv = [
        "process", "--openai.base_url", target.base_url, "--openai.server_type", "vllm",
        "--openai.model_name", MODEL, "--env.tokenizer_name", "tiny",
        "--env.use_wandb", "false", "--env.group_size", "2", "--env.total_steps", "3",
        "--env.data_path_to_save_groups", str(out),
        "--teacher.base_url", target.base_url, "--teacher.model_name", MODEL,
        "--teacher.top_k", str(TOP_K),
    ]  # fmt: skip
    assert main(registry.get("arithmetic"), argv) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_the_distill_arrays_are_the_servers_top_k_prompt_logprobs(
    target: Target, groups: list[dict[str, Any]]
) -> None:
    """Shapes [sequence][position][k] (position 0 empty), ids and values as the server's."""
    assert len(groups) == 3
    for g in groups:
        assert g["token_source"] == "server"
        ids, lps = g["distill_token_ids"], g["distill_logprobs"]
        assert len(ids) == len(lps) == len(g["tokens"]) == 2
        for seq, seq_ids, seq_lps in zip(g["tokens"], ids, lps, strict=True):
            assert len(seq_ids) == len(seq_lps) == len(seq)
            assert seq_ids[0] == [] and seq_lps[0] == []
            assert all(len(row) == TOP_K for row in seq_ids[1:])
            assert all(len(row) == TOP_K for row in seq_lps[1:])
            expected = top_k(target, seq)
            assert seq_ids == [e[0] for e in expected]
            for t, (row, (_, want)) in enumerate(zip(seq_lps, expected, strict=True)):
                assert row == pytest.approx(want, abs=TOLERANCE), (target.name, t)
                assert row == sorted(row, reverse=True)


def test_where_the_teacher_is_the_policy_it_agrees_with_the_rollouts_logprobs(
    groups: list[dict[str, Any]],
) -> None:
    """The teacher is the policy's own server: at each generated position whose sampled id is
    in the teacher's top-k, the teacher's logprob for it is the one the rollout recorded."""
    compared = 0
    for g in groups:
        rows = zip(
            g["tokens"],
            g["masks"],
            g["inference_logprobs"],
            g["distill_token_ids"],
            g["distill_logprobs"],
            strict=True,
        )
        for tokens, masks, sampled, top_ids, top_lps in rows:
            for t, (token, mask) in enumerate(zip(tokens, masks, strict=True)):
                if mask == -100 or token not in top_ids[t]:
                    continue
                teacher = top_lps[t][top_ids[t].index(token)]
                assert teacher == pytest.approx(sampled[t], abs=TOLERANCE)
                compared += 1
    assert compared > 0

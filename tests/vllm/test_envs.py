"""Environments in process mode (`atropos env process NAME`) against both servers of the tiny
policy (`target`): the groups they write hold the server's ids, and every trained position's
logprob is the policy's own for that id (transformers, float32, over the whole sequence)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from atropos.envs import registry
from atropos.envs.cli import main
from atropos.inference.sequence import MASKED

from .helpers import MODEL, Target

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
TOLERANCE = 1e-4


def process(name: str, target: Target, out: Path, *extra: str) -> list[dict[str, Any]]:
    argv = ["process", "--openai.base_url", target.base_url, "--openai.server_type", "vllm"]
    argv += ["--openai.model_name", MODEL, "--env.tokenizer_name", "tiny"]
    argv += ["--env.max_token_length", "1024", "--env.use_wandb", "false"]
    argv += ["--env.total_steps", "2", "--env.group_size", "3"]
    argv += ["--env.data_path_to_save_groups", str(out), *extra]
    assert main(registry.get(name), argv) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.parametrize("name", ["arithmetic", "gsm8k"])
def test_process_writes_groups_of_the_servers_ids_and_logprobs(
    name: str, target: Target, tmp_path: Path, logprob_table: Callable[[list[int]], Any]
) -> None:
    groups = process(name, target, tmp_path / f"{name}.jsonl")
    assert len(groups) == 2
    for group in groups:
        assert group["token_source"] == "server" and len(group["tokens"]) == 3
        assert len(group["scores"]) == len(group["masks"]) == 3
        for tokens, masks, logprobs in zip(
            group["tokens"], group["masks"], group["inference_logprobs"], strict=True
        ):
            assert len(tokens) == len(masks) == len(logprobs)
            rows = logprob_table(tokens)
            trained = [i for i, m in enumerate(masks) if m != MASKED]
            assert trained and all(masks[i] == tokens[i] for i in trained)
            for i in trained:
                assert abs(float(rows[i - 1, tokens[i]]) - logprobs[i]) < TOLERANCE, (i, tokens)

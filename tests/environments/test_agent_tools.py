"""`agent_tools`: an OpenAI Agents SDK agent through the rollout proxy, end to end in `process`
against the fake server playing the policy (`tasks.demo_responder`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("agents")

from atropos.environments.agent_tools import AgentTools  # noqa: E402
from atropos.environments.agent_tools.tasks import (  # noqa: E402
    calculator,
    demo_responder,
    lookup,
    make_tasks,
)
from atropos.envs.cli import main  # noqa: E402
from atropos.inference.tokenizer import load_tokenizer  # noqa: E402
from atropos.testing import FakeInferenceServer  # noqa: E402


def test_tasks_and_tools():
    train, test = make_tasks("train", 50), make_tasks("test", 50)
    assert not {t["question"] for t in train} & {t["question"] for t in test}
    assert make_tasks("train", 5) == make_tasks("train", 5)  # seeded
    assert calculator("2 * (3 + 4) - 1") == "13" and calculator("__import__('os')").startswith(
        "error"
    )
    assert "error" in lookup("Pluto") and lookup("zorb")["planet"] == "Zorb"


def test_process_writes_token_exact_groups_of_whole_agent_episodes(tmp_path: Path):
    out = tmp_path / "groups.jsonl"
    with FakeInferenceServer(responder=demo_responder) as fake:
        code = main(
            AgentTools,
            [
                "process",
                "--openai.base_url", fake.base_url,
                "--openai.server_type", "vllm",
                "--openai.model_name", "atropos-tiny",
                "--env.total_steps", "3",
                "--env.group_size", "2",
                "--env.data_path_to_save_groups", str(out),
            ],
        )  # fmt: skip
    assert code == 0
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 3
    tok = load_tokenizer("tiny")
    for group in groups:
        assert len(group["tokens"]) == 2 and group["token_source"] == "server"
        assert set(group["scores"]) <= {0.0, 1.0}
        for tokens, masks, logprobs in zip(
            group["tokens"], group["masks"], group["inference_logprobs"], strict=True
        ):
            assert len(tokens) == len(masks) == len(logprobs)
            trained = tok.decode([m for m in masks if m != -100])
            assert trained.count("<tool_call>") == 3 and "The answer is" in trained
            assert '"name": "Zorb"' not in trained or "lookup" in trained
            text = tok.decode(tokens)
            assert text.count("<|im_start|>tool") == 3  # every tool result is in, masked
            assert all(lp == 1.0 for lp, m in zip(logprobs, masks, strict=True) if m == -100)
    assert {s for g in groups for s in g["scores"]} == {0.0, 1.0}  # mixed by the responder

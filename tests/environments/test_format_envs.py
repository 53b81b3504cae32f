"""What the four format environments (`answer_format`, `json_schema`, `infinimath`,
`swe_patch`) share: `check_env` against the fake inference server with each one's demo
responder, registration and defaults (the think block on), and `process` against the CPU
server (`atropos local serve`: the shipped tiny policy, whose answers are noise here; `process`
keeps equal-score groups)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from atropos.environments import answer_format, infinimath, json_schema, swe_patch
from atropos.envs import registry

from .helpers import check_against, env_defaults, make_env

ENVS: dict[str, Any] = {
    "answer_format": (answer_format.AnswerFormat, answer_format.demo_responder),
    "json_schema": (json_schema.JsonSchema, json_schema.demo_responder),
    "infinimath": (infinimath.InfiniMath, infinimath.demo_responder),
    "swe_patch": (swe_patch.SwePatch, swe_patch.demo_responder),
}


@pytest.mark.parametrize("name", sorted(ENVS))
def test_check_env_passes_with_the_demo_responder(name: str) -> None:
    cls, responder = ENVS[name]
    report = check_against(partial(make_env, cls), responder, items=4)
    assert report.groups == 4 and report.token_sources == {"server"}
    assert responder("What is 2 + 2?") is None  # not a prompt of this env: random text


@pytest.mark.parametrize("name", sorted(ENVS))
def test_registered_with_their_defaults(name: str) -> None:
    cls, _ = ENVS[name]
    config, [server] = env_defaults(cls)
    assert isinstance(config, cls.env_config_cls)
    assert (config.group_size, config.thinking_mode, config.use_wandb) == (8, True, False)
    assert (server.base_url, server.server_type) == ("http://127.0.0.1:9001/v1", "vllm")
    assert name in registry.names(), "run `pip install -e .` to install entry points"
    assert registry.get(name) is cls


@pytest.fixture(scope="module")
def local_url():
    pytest.importorskip("torch")
    from atropos.testing.serve import local_tiny_server

    with local_tiny_server() as url:
        yield url


@pytest.mark.parametrize("name", sorted(ENVS))
def test_process_against_the_cpu_server(name: str, local_url: str, tmp_path: Path) -> None:
    from atropos.envs.cli import main

    out = tmp_path / f"{name}.jsonl"
    argv = ["process", "--openai.base_url", local_url, "--openai.server_type", "vllm"]
    argv += ["--openai.model_name", "atropos-tiny", "--env.tokenizer_name", "tiny"]
    argv += ["--env.max_token_length", "96", "--env.total_steps", "2"]  # completions: noise
    argv += ["--env.group_size", "2", "--env.data_path_to_save_groups", str(out)]
    assert main(registry.get(name), argv) == 0
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2 and out.with_suffix(".html").exists()
    for g in groups:
        assert len(g["tokens"]) == len(g["masks"]) == len(g["scores"]) == 2
        assert g["token_source"] == "server"
        assert [len(lp) for lp in g["inference_logprobs"]] == [len(t) for t in g["tokens"]]
        assert all(0.0 <= s <= 1.0 for s in g["scores"])
        assert g["messages"][0][0]["role"] == "system"  # the thinking prompt

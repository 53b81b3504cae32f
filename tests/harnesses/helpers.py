"""Helpers of the harness tests: a scripted policy (`Script`: the fake inference server answers
step by step in the tiny template's tool-call format, which the proxy turns into each harness's
dialect), `make_env` and `collect` (one group of a `HarnessEnv`), `trained_tokens`; the
greet.py task (`greet_task`) and `collect_harness` that the real harnesses' tests share."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from atropos.envs.outcome import RolloutFailed, failure_reason
from atropos.harnesses.env import HarnessEnv
from atropos.harnesses.tasks import load_tasks
from atropos.inference.config import APIServerConfig
from atropos.testing import FakeInferenceServer

TOOL_TURN = "<|im_start|>tool"


def tool_call(name: str, **arguments: Any) -> str:
    """One tool call in the tiny template's (Hermes) format."""
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class Script:
    """A scripted policy: answer `steps[k]` when the prompt holds k tool results (the last
    step repeats). `first` alternates between the given openings: rollouts of one group get
    them in turn (the later steps follow from what the prompt already holds)."""

    def __init__(self, steps: Sequence[str], first: Sequence[str] | None = None) -> None:
        self.steps = list(steps)
        self.first = itertools.cycle(first or [self.steps[0]])
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        done = prompt.count(TOOL_TURN)
        if done == 0:
            return next(self.first)
        return self.steps[min(done, len(self.steps) - 1)]


def make_env(server: FakeInferenceServer, tasks: Path, **config: Any) -> HarnessEnv:
    settings = {
        "group_size": 2,
        "use_wandb": False,
        "tokenizer_name": "tiny",
        "tasks": str(tasks),
        "agent_timeout": 120.0,
        "verifier_timeout": 60.0,
        **config,
    }
    api = APIServerConfig(base_url=server.base_url, server_type="vllm", model_name="atropos-tiny")
    return HarnessEnv(HarnessEnv.env_config_cls(**settings), [api])


async def failing_as_none(env: HarnessEnv, task: Any) -> Any:
    """`env.collect_trajectories(task)`; a failed group (`RolloutFailed`: never scored) is
    `(None, [])`, its reason kept in `env.failed_reason` (the runner's `failed/<reason>`)."""
    try:
        return await env.collect_trajectories(task)
    except RolloutFailed as err:
        env.failed_reason = failure_reason(err)  # type: ignore[attr-defined]
        return None, []


def collect(env: HarnessEnv) -> tuple[Any, list[Any]]:
    """One group of the env's first task (None: it failed), and its rollouts' exits."""

    async def main() -> Any:
        await env.setup()
        try:
            return await failing_as_none(env, env.items[0])
        finally:
            await env.aclose()

    group, _ = asyncio.run(main())
    return group, list(env.exits.elements())


def trained_tokens(group: dict[str, Any]) -> int:
    """Tokens the group trains on (unmasked), over all its rows."""
    return sum(1 for masks in group["masks"] for m in masks if m != -100)


def greet_task(tmp_path: Path, marker: str) -> str:
    """A JSONL of one task: make greet.py print goodbye (the test checks it); `marker` in the
    instruction lets a scripted policy tell tasks apart."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "greet.py").write_text("print('hello')\n")
    task = {
        "id": marker,
        "instruction": f"Make greet.py print goodbye instead of hello. {marker}",
        "snapshot": "repo",
        "test": 'test "$(python3 greet.py)" = goodbye',
    }
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(task) + "\n")
    return str(path)


def collect_harness(harness: str, url: str, source: str, **config: Any) -> tuple[Any, HarnessEnv]:
    """One group of `harness` on the only task of `source` against the server at `url`:
    ((group, backlog), the env)."""
    settings = {
        "harness": harness,
        "tasks": source,
        "group_size": 2,
        "tokenizer_name": "tiny",
        "agent_timeout": 60.0,
        **config,
    }
    server = APIServerConfig(base_url=url, server_type="vllm", model_name="atropos-tiny")
    env = HarnessEnv(HarnessEnv.env_config_cls(**settings), [server])

    async def main() -> Any:
        await env.setup()
        try:
            [task] = load_tasks(source)
            return await failing_as_none(env, task)
        finally:
            await env.aclose()

    return asyncio.run(main()), env

"""BaseEnv pieces: default group collection, checkpoints, the serve runner's step logic, and
the conversion of a plain config into the env's config class."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pydantic import Field, ValidationError

from atropos.envs.config import BaseEnvConfig
from atropos.envs.runner.serve import ServeRunner
from atropos.envs.types import EvalHandlingEnum

from .synth import SynthEnv, resolved


class PerRollout(SynthEnv):
    """Uses upstream's per-rollout hook; every third rollout fails to produce anything."""

    calls = 0

    async def collect_trajectory(self, item: Any) -> tuple[Any, list[Any]]:
        PerRollout.calls += 1
        if PerRollout.calls % 3 == 0:
            return None, ["retry-me"]
        extra = {"advantages": [1.0, 1.0]} if PerRollout.calls % 2 else {}
        return {"tokens": [1, 2], "masks": [-100, 2], "scores": 1.0, **extra}, []

    collect_trajectories = SynthEnv.__mro__[1].collect_trajectories  # BaseEnv's default


def make(env_cls: type[SynthEnv] = SynthEnv, **kw: Any) -> SynthEnv:
    cfg = resolved(**kw)
    return env_cls(cfg.env, cfg.servers, manager=cfg.manager)


def test_default_collection_skips_none_and_never_misaligns_optional_rows():
    env = make(PerRollout, group_size=6)
    group, backlog = asyncio.run(env.collect_trajectories(1))
    assert len(group["tokens"]) == 4 and backlog == ["retry-me", "retry-me"]
    assert group["advantages"] is None  # only some rollouts had it: dropped, not misaligned
    assert group["scores"] == [1.0] * 4


def test_checkpoints_are_atomic_and_found_after_a_restart(tmp_path: Path):
    env = make(env_key="host-a:gsm8k")
    env.checkpoint_dir = str(tmp_path)
    asyncio.run(env.setup())
    env.next = 41
    path = env.save_checkpoint(40)
    assert path is not None and path.name == "step-40.json"
    assert not list(path.parent.glob("*.tmp*"))
    env.next = 99
    env.save_checkpoint(80)

    again = make(env_key="host-a:gsm8k")  # a restarted env: same identity, new process
    again.checkpoint_dir = str(tmp_path)
    asyncio.run(again.setup())
    again.curr_step = 60
    assert again.load_checkpoint() == {"next": 41}  # the newest at or before step 60
    assert again.next == 41


def test_evals_and_checkpoints_trigger_on_every_crossing_even_on_jumps(tmp_path: Path):
    env = make(steps_per_eval=10)
    env.checkpoint_interval = 5
    env.checkpoint_dir = str(tmp_path)
    runner = ServeRunner(env, resolved(), tmp_path)

    async def main() -> None:
        await env.setup()
        env.evaluate = fake_eval  # type: ignore[method-assign]
        for step in (3, 9, 19, 29, 31):  # jumps of a whole period: 9 -> 19, 19 -> 29
            await runner._on_status({"current_step": step, "queue_size": 0})
            await asyncio.sleep(0)

    evals: list[int] = []

    async def fake_eval() -> None:
        evals.append(env.curr_step)

    asyncio.run(main())
    assert evals == [19, 29, 31]  # upstream's test (9 % 10 > 19 % 10) missed both jumps
    saved = sorted(int(p.stem.split("-")[1]) for p in tmp_path.rglob("step-*.json"))
    assert saved == [5, 15, 25, 30]


def test_capacity_follows_eval_handling_and_offpolicy_budget(tmp_path: Path):
    env = make(max_num_workers=10, max_batches_offpolicy=2, group_size=2)
    env.config.batch_size = 8
    runner = ServeRunner(env, resolved(), tmp_path)
    runner.last_status = 1e18  # fresh
    env.status_dict = {"queue_size": 3, "max_group_size": 2, "self_queue_size": 3}
    assert runner.capacity() == 2 * 8 // 2 - 3  # 5 more groups may be queued
    runner.submitted = 4  # made since the status was asked for: not in it yet
    assert runner.capacity() == 1

    async def with_eval(handling: EvalHandlingEnum) -> int:
        env.config.eval_handling = handling
        env.config.max_batches_offpolicy = 0
        runner.eval_task = asyncio.create_task(asyncio.sleep(1))
        cap = runner.capacity()
        runner.eval_task.cancel()
        return cap

    assert asyncio.run(with_eval(EvalHandlingEnum.STOP_TRAIN)) == 0
    assert asyncio.run(with_eval(EvalHandlingEnum.LIMIT_TRAIN)) == 5
    assert asyncio.run(with_eval(EvalHandlingEnum.NONE)) == 10
    runner.last_status = 0.0  # no word from the API for a long time
    assert runner.capacity() == 0


class WithOwnConfig(SynthEnv):
    """An env with its own config class: a rule on a base field and a field of its own."""

    class Config(BaseEnvConfig):
        group_size: int = Field(default=2, le=2)
        extra: str = "own default"

    env_config_cls = Config
    config: Config


def test_a_plain_config_becomes_the_env_config_keeping_what_the_caller_set():
    given = BaseEnvConfig(use_wandb=False, tokenizer_name="tiny", max_token_length=64)
    env = WithOwnConfig(given, [])
    assert type(env.config) is WithOwnConfig.Config
    assert (env.config.use_wandb, env.config.tokenizer_name, env.config.max_token_length) == (
        False,
        "tiny",
        64,
    )
    assert (env.config.group_size, env.config.extra) == (2, "own default")  # the env's defaults
    assert given.max_num_workers == env.config.max_num_workers == 8  # resolved in both
    assert WithOwnConfig(env.config, []).config is env.config  # already one: kept as it is
    with pytest.raises(ValidationError, match="group_size"):  # a value the caller set, refused
        WithOwnConfig(BaseEnvConfig(group_size=4), [])

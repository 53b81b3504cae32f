"""Environments for the outage tests (test_server_gone.py), run as `atropos env MODE FILE:CLASS`.

Each item (and each evaluation step) asks the role's servers once and, when they answered,
appends the role's name to the file `$OUTAGE_MARKS`, so a test knows its server answered before
it kills it. The run ends on its own (no more items, or the evaluation done) once the file
`$OUTAGE_STOP` exists. Groups are made up: distinct scores, token ids of the tiny tokenizer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field

from atropos.envs.base import BaseEnv
from atropos.envs.config import BaseEnvConfig
from atropos.envs.judge import JudgeConfig, JudgedEnv


def stopped() -> bool:
    stop = os.environ.get("OUTAGE_STOP")
    return bool(stop) and Path(stop).exists()


def mark(role: str) -> None:
    marks = os.environ.get("OUTAGE_MARKS")
    if marks:
        with open(marks, "a") as out:
            out.write(f"{role}\n")


class PolicyOutage(BaseEnv):
    """Asks the policy once per item."""

    name = "policy_outage"

    async def setup(self) -> None:
        self.next = 0

    async def get_next_item(self) -> Any:
        if stopped():
            return None
        self.next += 1
        return self.next

    async def ask(self, item: int, split: str = "train") -> None:
        messages = [{"role": "user", "content": f"item {item}"}]
        await self.server.chat_completion(messages=messages, max_tokens=2, split=split)
        mark("policy")

    async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
        await self.ask(item)
        g = self.config.group_size
        group = {
            "tokens": [[20 + item % 50, 30, 40, 50 + i] for i in range(g)],
            "masks": [[-100, 30, 40, 50 + i] for i in range(g)],
            "scores": [float(i) for i in range(g)],
            "token_source": "server",
        }
        return group, []

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        item = 0
        while not stopped():
            item += 1
            await self.ask(item, split="eval")
        return {"eval/items": float(item)}


class JudgedOutageConfig(BaseEnvConfig):
    judge: JudgeConfig = Field(default_factory=JudgeConfig)


class JudgedOutage(PolicyOutage, JudgedEnv):
    """Asks the policy, then the judge, once per item."""

    name = "judged_outage"
    env_config_cls = JudgedOutageConfig

    async def ask(self, item: int, split: str = "train") -> None:
        await super().ask(item, split)
        await self.judge.complete([{"role": "user", "content": f"judge item {item}"}], n=1)
        mark("judge")

"""A synthetic environment that needs no inference server: groups are made up locally."""

from __future__ import annotations

import asyncio
from typing import Any

from atropos.envs.base import BaseEnv
from atropos.envs.config import BaseEnvConfig, ResolvedConfig
from atropos.inference.config import ServerManagerConfig


class SynthEnv(BaseEnv):
    name = "synth"
    rollout_seconds = 0.01

    async def setup(self) -> None:
        self.next = 0
        self.evals = 0
        self.fail_every = 0

    async def get_next_item(self) -> Any:
        self.next += 1
        return self.next

    async def collect_trajectories(self, item: Any) -> tuple[Any, list[Any]]:
        await asyncio.sleep(self.rollout_seconds)
        if self.fail_every and item % self.fail_every == 0:
            raise RuntimeError(f"item {item} broke")
        g = self.config.group_size
        group = {
            "tokens": [[item, 1, 2, i] for i in range(g)],
            "masks": [[-100, 1, 2, i] for i in range(g)],
            "scores": [float(i) for i in range(g)],
            "messages": [[{"role": "assistant", "content": f"<b>{item}</b>"}] for _ in range(g)],
            "token_source": "server",
        }
        return group, []

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        self.evals += 1

    def checkpoint_state(self) -> dict[str, Any]:
        return {"next": self.next}


def resolved(mode: str = "serve", **env: Any) -> ResolvedConfig:
    config = BaseEnvConfig(
        group_size=env.pop("group_size", 2),
        max_num_workers=env.pop("max_num_workers", 8),
        use_wandb=False,
        tokenizer_name="tiny",
        **env,
    )
    return ResolvedConfig(config, [], ServerManagerConfig(), mode)  # type: ignore[arg-type]

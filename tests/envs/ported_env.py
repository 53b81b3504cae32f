"""An environment written the way atroposlib 0.4.0 environments are, ported by changing only
its imports (`atroposlib.envs.base` -> `atropos.envs.base`, `atroposlib.utils.tokenize_for_trainer`
-> `atropos.inference.tokenize`). The body is upstream style: config_init, setup,
get_next_item, collect_trajectories through `self.server.managed_server`, its own `score`.
"""

from __future__ import annotations

import random
from typing import Any

from atropos.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, Item, ScoredDataGroup


class PortedEnv(BaseEnv):
    name = "ported"

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, list[APIServerConfig]]:
        env_config = BaseEnvConfig(
            tokenizer_name="tiny",
            group_size=4,
            use_wandb=False,
            max_token_length=256,
            wandb_name="ported",
        )
        servers = [APIServerConfig(model_name="atropos-tiny", base_url="", server_type="vllm")]
        return env_config, servers

    async def setup(self) -> None:
        self.train = [{"question": f"What is {a} + 1?", "gold": str(a + 1)} for a in range(10)]
        self.iter = 0

    async def get_next_item(self) -> Item:
        item = self.train[self.iter % len(self.train)]
        self.iter += 1
        return item

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        messages = [{"role": "user", "content": item["question"]}]
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(
                messages=messages, n=self.config.group_size, max_tokens=32, temperature=1.0
            )
            nodes = managed.get_state()["nodes"]
        rollouts = [
            (node, choice.message.content)
            for node, choice in zip(nodes, completion.choices, strict=True)
        ]
        return await self.score((item, rollouts)), []

    async def score(self, data: Any) -> ScoredDataGroup | None:
        item, rollouts = data
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], inference_logprobs=[])
        random.shuffle(rollouts)
        for node, text in rollouts:
            group["tokens"].append(node.tokens)
            group["masks"].append(node.masked_tokens)
            group["inference_logprobs"].append(node.logprobs)
            group["scores"].append(1.0 if item["gold"] in text else -1.0)
        group["token_source"] = "server"
        return group

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        return None

"""The env-throughput benchmark's task on atroposlib 0.4.0's `BaseEnv` (run with upstream's venv).

The same work as `ours_single_turn.py`: the task of `single_turn_task.py` (same items, same
order, same prompt, same score), one `n = group_size` request per item through upstream's
recommended path, `self.server.managed_server(tokenizer=...)` over its vLLM backend (`POST
/generate` with token ids, `logprobs: 0`), and a group of tokens, masks, scores, inference
logprobs and messages. It is upstream's own CLI (`serve`, `process`), so every flag is upstream's:

    python benchmarks/envs/upstream_single_turn.py serve --env.group_size 8 \
        --env.tokenizer_name PATH --env.use_wandb False --env.wandb_name bench \
        --openai.base_url http://127.0.0.1:9004/v1 --openai.server_type vllm \
        --openai.model_name atropos-tiny --openai.tokenizer_name PATH

Nothing here comes from atroposlib's example environments; this file only uses its public API.
`BENCH_MAX_TOKENS` (environment variable, default 8) is the completion limit.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from atroposlib.envs.base import (  # noqa: E402
    APIServerConfig,
    BaseEnv,
    BaseEnvConfig,
    ScoredDataGroup,
)
from single_turn_task import MAX_TOKENS, Order, messages, questions, trivial_score  # noqa: E402


class UpstreamSingleTurn(BaseEnv):
    name = "bench_single_turn"

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, list[APIServerConfig]]:
        # Everything that matters is set on the command line by benchmarks/env_throughput.py.
        return BaseEnvConfig(use_wandb=False), [APIServerConfig(server_type="vllm")]

    async def setup(self) -> None:
        self.order = Order(questions())

    async def get_next_item(self) -> dict[str, Any]:
        return self.order.next()

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[ScoredDataGroup, list]:
        chat = messages(item)
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            reply = await managed.chat_completion(
                messages=chat, n=self.config.group_size, max_tokens=MAX_TOKENS, temperature=1.0
            )
            nodes = managed.get_state()["nodes"]
        texts = [choice.message.content or "" for choice in reply.choices]
        group = ScoredDataGroup(
            tokens=[node.tokens for node in nodes],
            masks=[node.masked_tokens for node in nodes],
            scores=[trivial_score(text) for text in texts],
            inference_logprobs=[node.logprobs for node in nodes],
            messages=[[*chat, {"role": "assistant", "content": text}] for text in texts],
        )
        return group, []

    async def evaluate(self, *args: Any, **kwargs: Any) -> None:
        return None


if __name__ == "__main__":
    UpstreamSingleTurn.cli()

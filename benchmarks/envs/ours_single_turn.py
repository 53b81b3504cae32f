"""The env-throughput benchmark's task on our runtime (`atropos.envs.simple.Env`).

A single-turn chat task (`single_turn_task.py`): a system prompt and a short question per item,
`group_size` completions per item requested as one `n = group_size` call with token ids and
logprobs from the server (through `ManagedServer`), and a trivial score, so the environment's
own code costs next to nothing and what is measured is the runtime.
`upstream_single_turn.py` beside it is the same task on atroposlib 0.4.0's `BaseEnv`.

Run it as any env (`benchmarks/env_throughput.py` does):

    .venv/bin/python benchmarks/envs/ours_single_turn.py process --env.group_size 8 \
        --openai.base_url http://127.0.0.1:9004/v1 --openai.server_type vllm \
        --openai.vllm_token_api generate --openai.model_name atropos-tiny \
        --env.tokenizer_name tiny --env.use_wandb false

`BENCH_MAX_TOKENS` (environment variable, default 8) is the completion limit.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from single_turn_task import MAX_TOKENS, SEED, SYSTEM_PROMPT, questions, trivial_score  # noqa: E402

from atropos.envs.simple import Env  # noqa: E402


class SingleTurn(Env):
    name = "bench_single_turn"
    system_prompt = SYSTEM_PROMPT
    temperature = 1.0
    max_tokens = MAX_TOKENS
    seed = SEED

    def load(self) -> list[dict[str, Any]]:
        return questions()

    def score(self, item: dict[str, Any], completion: str) -> float:
        return trivial_score(completion)


if __name__ == "__main__":
    SingleTurn.cli()

"""TRL's own ORS integration (`trl.experimental.openreward.OpenRewardSpec`, the
`environment_factory` of `GRPOTrainer`) training a small policy against an ORS server on CPU,
without vLLM; run by the TRL venv's python with the interop venv's `openreward` on its path.

`python trl_ors.py URL ENV POLICY_DIR OUT_DIR [SITE]`: SITE (the interop venv's site-packages)
is put at the end of `sys.path`, so the TRL venv's own packages come first and `openreward` is
found there. Two GRPO steps (two tasks, two generations
each, transformers' own generation); prints one JSON object: the steps, the dataset's rows,
the tools TRL bound and the rewards the rollouts got.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.extend(sys.argv[5:6])

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402
from trl.chat_template_utils import qwen3_template  # noqa: E402
from trl.experimental.openreward import OpenRewardSpec  # noqa: E402


def main(url: str, env_name: str, policy: str, out: str) -> dict:
    torch.manual_seed(0)
    spec = OpenRewardSpec(url, env_name=env_name, num_tasks=2)
    rewards: list = []
    rollouts: list = []

    def reward(environments, **kw):  # TRL's outcome-only rule: the last reward a tool gave
        found = [env.reward for env in environments]
        rewards.extend(found)
        rollouts.extend(env.rewards for env in environments)  # the steps' rewards
        return [0.0 if r is None else r for r in found]

    config = GRPOConfig(
        output_dir=out, per_device_train_batch_size=2, num_generations=2,
        gradient_accumulation_steps=1, max_steps=2, max_completion_length=16,
        max_tool_calling_iterations=2, learning_rate=1e-4, beta=0.0, logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=True, bf16=False, disable_tqdm=True,
        seed=0,
    )  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(policy)
    # TRL parses tool calls by the templates it knows; ours writes Qwen's <tool_call> JSON blocks
    # (TRL's error message says to set it by hand for another template)
    tokenizer.response_template = qwen3_template
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model, args=config, train_dataset=spec.train_dataset,
        environment_factory=spec.environment_factory, reward_funcs=[reward],
        processing_class=tokenizer,
    )  # fmt: skip
    trainer.train()
    tools = sorted(n for n in dir(spec.environment_factory()) if n == "answer")
    return {
        "steps": trainer.state.global_step,
        "rows": len(spec.train_dataset),
        "tools": tools,
        "rewards": rewards,
        "rollouts": len(rollouts),
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])))

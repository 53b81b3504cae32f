"""TRL's `GRPOTrainer` trained on Atropos batches, its weights published back every step.

    python -m atropos.integrations.trl --model DIR --steps 100 --batch-size 64 --lr 5e-4

Under `atropos launch` (a run file's `trainer.command`) the API, the inference servers and their
keys come from the environment the launch sets (`ATROPOS_API_URL`, `ATROPOS_SERVER_URLS`, ...),
which `atropos.client.TrainerClient` reads. Needs `trl` (1.16; `scripts/upstream_venv.py trl`
makes a venv with it, the project editable).

**The design, and why.** TRL 1.16 offers three ways to bring rollouts from elsewhere:

1. `rollout_func(prompts, trainer)`: TRL's dataloader picks the prompts, the function returns
   `prompt_ids`/`completion_ids`/`logprobs`, and TRL then scores them with its reward functions
   and computes the group advantages itself. Atropos decides the items (the environments), has
   already scored them, and may carry per-token advantages, `set_advantage_to_zero` overrides,
   multi-turn masks and groups of any size: none of that passes through `rollout_func` (it is
   also marked experimental).
2. vLLM server mode: TRL asks a vLLM server for completions. Generation stays TRL's.
3. A `GRPOTrainer` subclass overriding `_generate_and_score_completions(inputs)`, the one hook
   between TRL's dataloader and its loss (`_prepare_inputs` buffers and splits what it returns;
   `_compute_loss` reads `prompt_ids`, `prompt_mask`, `completion_ids`, `completion_mask`,
   `advantages` (shape (B,) or per token (B, T)), `old_per_token_logps`, `tool_mask`,
   `num_items_in_batch`). We take this one: the hook returns an Atropos batch, and TRL keeps
   everything else (its loss types, clipping, optimizer, scheduler, accelerate, logging).

An Atropos batch (`Batch.tensors(layout="padded")`: position j predicts token j + 1) maps onto
TRL's layout without re-tokenizing anything: the "prompt" is each row's first token and the
"completion" the rest, so TRL's per-token logprob k is the logprob of token k + 1, which is where
the client puts the targets, advantages and inference logprobs. `completion_mask` is the row's
attention mask (so prompts and tool output are attended to) and `tool_mask` the trained positions
(TRL multiplies them). Advantages are the client's per token (GRPO over the served scores, or
the group's own per-token advantages, then overrides: the contract's rules, docs/trainer-
contract.md). The old logprobs of TRL's ratio are the inference server's where it sent them, else
the trainer's own before the step (ratio 1), as `atropos train` does. One TRL optimizer step is
one Atropos batch (`num_generations = per_device_train_batch_size = batch_size`, one process, no
gradient accumulation); TRL's dataset is a placeholder with a row per step. After each step a
callback publishes the weights (`TrainerClient.publish(model, version=step)`) and acknowledges
the batch.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from atropos.client import Batch, Sample, TrainerClient

if TYPE_CHECKING:
    import torch

    from atropos.client.tensors import MicroBatch

log = logging.getLogger("atropos.integrations.trl")


@dataclass
class TrlOptions:
    """The run's knobs (the command line's flags)."""

    model: str
    out_dir: Path = Path("runs/trl")
    steps: int = 100
    batch_size: int = 64  # sequences per step: whole groups, as the API packs them
    max_len: int = 2048  # the longest sequence the API sends (`max_token_len`)
    lr: float = 5e-4
    loss_type: str = "bnpo"  # TRL's: token mean over the batch, as `atropos train`
    epsilon: float = 0.2
    temperature: float = 1.0  # what the servers sampled at
    seed: int = 0
    lease: float = 600.0
    sync: str = "reload"
    api_url: str | None = None  # default: $ATROPOS_API_URL
    servers: str | None = None  # default: $ATROPOS_SERVER_URLS
    record: Path | None = None  # JSONL of what TRL's loss saw, for the fidelity test
    extra: dict[str, Any] = field(default_factory=dict)  # more GRPOConfig fields


def trl_inputs(t: MicroBatch, samples: Sequence[Sample]) -> dict[str, torch.Tensor]:
    """A padded `MicroBatch` (and its samples, for each row's last token, which no input holds)
    in the layout `GRPOTrainer._compute_loss` reads (see the module docstring): prompt = the
    first token, completion = the rest, so completion position j is the client's target j. The
    old logprobs are still missing where the server sent none (`has_old` says where)."""
    import torch

    completion = torch.zeros_like(t.input_ids)
    for row, s in enumerate(samples):
        completion[row, : len(s.tokens) - 1] = torch.tensor(s.tokens[1:], dtype=torch.long)
    mask = t.mask.to(torch.float32)
    assert t.attention_mask is not None  # padded
    return {
        "prompt_ids": t.input_ids[:, :1],
        "prompt_mask": t.attention_mask[:, :1],
        "completion_ids": completion,
        "completion_mask": t.attention_mask,
        "tool_mask": mask,
        "advantages": t.advantages.to(torch.float32),
        "sampling_per_token_logps": t.inference_logprobs,
        "has_old": t.has_old,
        "num_items_in_batch": mask.sum(),
    }


@functools.cache
def trainer_class() -> type:
    """`AtroposGRPOTrainer`, made on first use (TRL is imported only then)."""
    import torch
    from trl import GRPOTrainer

    from atropos.client.tensors import collate

    class AtroposGRPOTrainer(GRPOTrainer):  # type: ignore[misc]
        """`GRPOTrainer` whose rollouts are Atropos batches (`client.next_batch`)."""

        def __init__(self, *args: Any, client: TrainerClient, options: TrlOptions, **kw: Any):
            super().__init__(*args, **kw)
            self.atropos, self.options = client, options
            self.batch: Batch | None = None
            self.batch_stats: dict[str, Any] = {}

        def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
            batch = None
            while batch is None:
                batch = self.atropos.next_batch(lease=self.options.lease)
            self.batch = batch
            pad = self.processing_class.pad_token_id or 0
            samples = [s for s in batch.samples(self.options.max_len) if len(s.tokens) > 1]
            t = collate(samples, pad_id=pad)
            out = trl_inputs(t, samples)
            has_old = out.pop("has_old")
            own = self._own_logps(out)
            out["old_per_token_logps"] = torch.where(has_old, out["sampling_per_token_logps"], own)
            self.batch_stats = batch_stats(t, has_old, own, out, self.state.global_step)
            self._metrics["train"]["reward"].append(self.batch_stats["reward_mean"])
            return out

        @torch.no_grad()
        def _own_logps(self, out: dict[str, torch.Tensor]) -> torch.Tensor:
            ids = torch.cat([out["prompt_ids"], out["completion_ids"]], dim=1)
            attention = torch.cat([out["prompt_mask"], out["completion_mask"]], dim=1)
            keep = out["completion_ids"].shape[1]
            logps, _, _ = self._get_per_token_logps_and_entropies(
                self.model, ids, attention, keep, batch_size=ids.shape[0]
            )
            return cast("torch.Tensor", logps)

        def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> torch.Tensor:
            loss = cast("torch.Tensor", super()._compute_loss(model, inputs))
            if self.options.record is not None:
                record(self.options.record, self.state.global_step + 1, inputs, float(loss))
            return loss

    return AtroposGRPOTrainer


def batch_stats(
    t: MicroBatch, has_old: torch.Tensor, own: torch.Tensor, out: dict[str, Any], version: int
) -> dict[str, Any]:
    """The step's figures for metrics.jsonl, named as `atropos train` names them: the mean
    score, the share of sequences generated by the weights being trained (`version`), and the
    mean |trainer - server| logprob over their trained tokens that have a server logprob."""
    import torch

    assert t.scores is not None
    on = torch.tensor([v == version for v in t.policy_versions], dtype=torch.bool)
    where = has_old & out["tool_mask"].bool() & on[:, None]
    gap = (own - out["sampling_per_token_logps"]).abs()[where]
    return {
        "reward_mean": float(t.scores.float().mean()),
        "on_policy_fraction": float(on.float().mean()),
        "logprob_mismatch": float(gap.mean()) if gap.numel() else None,
        "sequences": int(t.input_ids.shape[0]),
        "trained_tokens": int(out["tool_mask"].sum()),
    }


def record(path: Path, step: int, inputs: dict[str, Any], loss: float) -> None:
    """Append what TRL's loss saw at `step`, one row per sequence: its tokens (prompt +
    completion, padding cut), the trained positions and their advantages and old logprobs."""
    rows = []
    ids = inputs["completion_ids"].tolist()
    real = inputs["completion_mask"].tolist()
    train = inputs["tool_mask"].tolist()
    adv = inputs["advantages"].tolist()
    old = inputs["sampling_per_token_logps"].tolist()
    for i, first in enumerate(inputs["prompt_ids"][:, 0].tolist()):
        n = int(sum(real[i]))
        trained = [k for k in range(n) if train[i][k]]
        rows.append(
            {
                "tokens": [first, *ids[i][:n]],
                "trained": [k + 1 for k in trained],  # positions in `tokens`
                "advantages": [adv[i][k] for k in trained],
                "inference_logprobs": [old[i][k] for k in trained],
            }
        )
    with path.open("a") as f:
        f.write(json.dumps({"step": step, "loss": loss, "rows": rows}) + "\n")


def atropos_scores(*args: Any, **kw: Any) -> list[float]:
    """TRL requires a reward source; the scores are the environments' (in the batch), and
    `_generate_and_score_completions`, which would call this, is replaced."""
    raise RuntimeError("Atropos batches carry their scores: TRL's reward functions never run")


def grpo_config(options: TrlOptions) -> Any:
    """TRL's `GRPOConfig` for one optimizer step per Atropos batch on this process."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(options.out_dir / "trl"),
        per_device_train_batch_size=options.batch_size,
        num_generations=options.batch_size,  # one placeholder prompt per step (TRL's sampler)
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        max_steps=options.steps,
        learning_rate=options.lr,
        lr_scheduler_type="constant",
        loss_type=options.loss_type,
        epsilon=options.epsilon,
        temperature=options.temperature,
        beta=0.0,  # no reference model: Atropos batches carry `ref_logprobs` only when asked
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=options.seed,
        use_cpu=True,
        bf16=False,
        disable_tqdm=True,
        **options.extra,
    )


def step_callback(options: TrlOptions, client: TrainerClient, tokenizer: Any) -> Any:
    """A `TrainerCallback` that, after every optimizer step, publishes the weights as version
    `step`, acknowledges the batch, and appends the step's row to `metrics.jsonl`."""
    from transformers import TrainerCallback

    metrics = options.out_dir / "metrics.jsonl"

    class Publish(TrainerCallback):
        trainer: Any = None

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            trainer = self.trainer
            client.publish(trainer.model, version=state.global_step, tokenizer=tokenizer)
            if trainer.batch is not None and trainer.batch.batch_id is not None:
                client.ack(trainer.batch.batch_id)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            logs = logs or {}
            if "loss" not in logs:
                return
            row = {"step": state.global_step, **self.trainer.batch_stats}
            row |= {k: logs[k] for k in ("loss", "grad_norm", "learning_rate") if k in logs}
            with metrics.open("a") as f:
                f.write(json.dumps(row) + "\n")

    return Publish()


def train(options: TrlOptions) -> Path:
    """Register, train `options.steps` TRL steps on the API's batches, publishing every step;
    the final weights are saved as `{out_dir}/checkpoints/step_{steps}`, which is returned."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(options.seed)
    options.out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(options.model)
    model = AutoModelForCausalLM.from_pretrained(options.model, dtype=torch.float32)
    client = TrainerClient(
        options.api_url, sync=options.sync, servers=options.servers,
        out_dir=options.out_dir / "published",
    )  # fmt: skip
    client.wait_ready()
    client.register(
        wandb_group="", wandb_project="", batch_size=options.batch_size,
        max_token_len=options.max_len, checkpoint_dir=str(options.out_dir / "checkpoints"),
        save_checkpoint_interval=options.steps, starting_step=0, num_steps=options.steps,
    )  # fmt: skip
    client.publish(model, version=0, tokenizer=tokenizer)  # the servers serve what we train
    callback = step_callback(options, client, tokenizer)
    trainer = trainer_class()(
        model=model,
        reward_funcs=[atropos_scores],  # never called: the hook above replaces scoring
        args=grpo_config(options),
        train_dataset=Dataset.from_dict({"prompt": ["(an Atropos batch)"] * options.steps}),
        processing_class=tokenizer,
        callbacks=[callback],
        client=client,
        options=options,
    )
    callback.trainer = trainer
    try:
        trainer.train()
    finally:
        client.close()
    final = options.out_dir / "checkpoints" / f"step_{options.steps}"
    model.save_pretrained(final)
    tokenizer.save_pretrained(final)
    return final


def parse(argv: Sequence[str] | None = None) -> TrlOptions:
    p = argparse.ArgumentParser(
        prog="python -m atropos.integrations.trl",
        description="TRL's GRPOTrainer on Atropos batches (docs/integrations.md#trl).",
    )
    p.add_argument("--model", required=True, help="a Hugging Face causal LM directory or id")
    p.add_argument("--out-dir", type=Path, default=TrlOptions.out_dir)
    p.add_argument("--steps", type=int, default=TrlOptions.steps)
    p.add_argument("--batch-size", type=int, default=TrlOptions.batch_size)
    p.add_argument("--max-len", type=int, default=TrlOptions.max_len)
    p.add_argument("--lr", type=float, default=TrlOptions.lr)
    p.add_argument("--loss-type", default=TrlOptions.loss_type, help="TRL's loss_type")
    p.add_argument("--epsilon", type=float, default=TrlOptions.epsilon)
    p.add_argument("--temperature", type=float, default=TrlOptions.temperature)
    p.add_argument("--seed", type=int, default=TrlOptions.seed)
    p.add_argument("--lease", type=float, default=TrlOptions.lease)
    p.add_argument("--sync", default=TrlOptions.sync, help="atropos.client's publish mode")
    p.add_argument("--api-url", default=None, help="default: $ATROPOS_API_URL")
    p.add_argument("--server-url", dest="servers", default=None, help="$ATROPOS_SERVER_URLS")
    p.add_argument("--record", type=Path, default=None, help="JSONL of what TRL's loss saw")
    args = vars(p.parse_args(argv))
    return TrlOptions(**args)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    options = parse(argv)
    final = train(options)
    rows = [json.loads(x) for x in (options.out_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows]
    log.info("trained %d steps; final weights %s", len(rows), final)
    return 0 if all(math.isfinite(x) for x in losses) else 1


if __name__ == "__main__":
    raise SystemExit(main())

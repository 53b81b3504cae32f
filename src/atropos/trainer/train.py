"""Reference GRPO trainer: `atropos train --model DIR [--flags]`, on one process or many.

The variant, exactly:
- GRPO advantages: per group, ``A = (r - mean) / max(std, 1e-8)`` (population std), the same
  advantage for every completion token of a sequence (per-token `advantages` from the
  environment take precedence).
- Token-level PPO-clip against the **inference server's logprobs** (the behaviour policy),
  ``-min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)`` for both signs of ``A``; mean over each
  sequence's tokens, then over sequences. Optional k3 KL to the starting weights (`--kl-coef`).
- One optimizer step (AdamW, linear warmup, global-norm clipping) per API batch of
  `--batch-size` sequences, accumulated over micro-batches of `--micro-batch-size`; under
  torchrun the batch is split across the processes by tokens and the gradient is the same.
- Logits at temperature 1: the servers return raw (temperature-1) logprobs, so ratios compare
  like with like.
- `--loss opd`: on-policy distillation toward the teacher logprobs the environments attach
  (`distill.py`: a reverse-KL advantage in the same clipped loss, or a top-k forward KL).

Data flow (`train()` below, its parts in `session.py`): lease a batch from the API, train on it
(`step.py`), publish the weights (`sync.py`), write a checkpoint every `--checkpoint-every`
steps (`checkpoint.py`) and only then acknowledge the batches it covers, so a crash loses
nothing and trains nothing twice. Resumes from the newest checkpoint in `--out-dir`, with any
number of processes. Metrics per step go to ``{out_dir}/metrics.jsonl`` and, with `--wandb`, to a
W&B run whose project and group are registered with the API so the environments log beside it
(docs/metrics.md). SIGTERM or SIGINT finishes the step in progress, checkpoints and returns; one
that comes while the trainer waits (for its inference server, the API, registration or a batch)
ends the wait at once.

Many processes: ``torchrun --nproc-per-node N -m atropos.trainer [--flags]`` shards the model
with FSDP2 over its blocks (`fsdp.py`; bf16 weights in forward and backward on GPUs, float32 on
the CPU), each process training on its share of every batch; rank 0 alone talks to the API and
the inference servers (`ranks.py`, docs/trainer.md "Many processes").
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from atropos.metrics import MetricsSink, WandbRun, run_name

log = logging.getLogger("atropos.trainer")


class TrainConfig(BaseSettings):
    """Everything `atropos train` takes: each field is a flag in kebab case (`--batch-size`),
    parsed by `atropos.cli.train`, or an `ATROPOS_TRAIN_<FIELD>` variable below the flags."""

    model_config = SettingsConfigDict(env_prefix="ATROPOS_TRAIN_")

    model: str = Field(
        description="the weights to start from: a Hugging Face model directory (config.json,"
        " weights, tokenizer), a Hub model id this machine can download, or the tiny policy"
        " that ships with atropos: --model tiny"
    )
    api_url: str = Field("http://127.0.0.1:8000", description="the trajectory API to train from")
    api_key: SecretStr | None = Field(
        None, description="the trajectory API's key, sent as 'Authorization: Bearer KEY'"
    )
    out_dir: Path = Field(
        Path("runs/train"),
        description="checkpoints, weights, metrics.jsonl and config.json; a run resumes from"
        " the newest checkpoint here",
    )
    steps: int = Field(100, ge=1, description="optimizer steps to reach (one API batch each)")
    batch_size: int = Field(64, ge=1, description="sequences per optimizer step")
    micro_batch_size: int = Field(
        16, ge=1, description="sequences per forward/backward pass (gradients accumulate)"
    )
    seq_len: int = Field(
        2048, ge=2, description="longest sequence in tokens; registered as the API's max_token_len"
    )
    lr: float = Field(1e-5, ge=0, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    warmup_steps: int = Field(0, ge=0, description="steps of linear warmup to --lr")
    clip_eps: float = Field(0.2, gt=0, description="PPO clip range: ratios outside 1 +- eps")
    kl_coef: float = Field(0.0, ge=0, description="weight of a KL penalty to the starting model")
    loss: Literal["grpo", "opd"] = Field(
        "grpo",
        description="grpo: the environments' rewards; opd: on-policy distillation toward the"
        " teacher logprobs the environments attach (--teacher.*; docs/trainer.md)",
    )
    opd_mode: Literal["reverse", "topk_forward"] = Field(
        "reverse",
        description="opd: reverse (per-token reverse-KL advantage, clipped policy gradient) or"
        " topk_forward (forward KL over the teacher's top-k)",
    )
    opd_reward_coef: float = Field(
        0.0,
        ge=0,
        description="opd: weight of the environments' GRPO advantage (0: pure distillation)",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="clip the global gradient norm to this")
    lease_seconds: float = Field(600.0, gt=0, description="how long a leased batch is held")
    checkpoint_every: int = Field(10, ge=0, description="steps between checkpoints; 0: at the end")
    keep_checkpoints: int = Field(2, ge=1, description="newest checkpoints kept on disk")
    sync: Literal["none", "reload", "restart", "lora", "transfer"] = Field(
        "reload", description="how new weights reach the inference server (docs/trainer.md)"
    )
    sync_every: int = Field(1, ge=1, description="steps between weight syncs")
    server_url: str = Field(
        "http://127.0.0.1:9001/v1",
        description="the inference server's OpenAI base URL; several, comma-separated, all get"
        " the new weights (reload, lora and transfer modes)",
    )
    server_api_key: SecretStr | None = Field(
        None, description="the inference servers' key, sent when syncing weights into them"
    )
    server_type: Literal["vllm", "sglang"] = Field(
        "vllm", description="transfer mode: whose weight-transfer routes the servers speak"
    )
    transfer_backend: Literal["auto", "nccl", "gloo", "ipc"] = Field(
        "auto",
        description="transfer mode: the process group's backend (auto: nccl when the"
        " model is on CUDA, else gloo); ipc: the servers share the trainer's GPU and map"
        " each tensor by its CUDA IPC handle (vLLM's ipc backend; no group)",
    )
    transfer_pause: Literal["keep", "wait", "abort"] = Field(
        "keep",
        description="transfer mode: requests in flight during a sync continue under the"
        " new weights (keep), finish first (wait) or fail and are retried (abort)",
    )
    transfer_master_address: str = Field(
        "",
        description="transfer mode: this host's address as the servers reach it (default:"
        " found from the first --server-url)",
    )
    transfer_master_port: int = Field(
        0, ge=0, le=65535, description="transfer mode: the group's TCP store port (0: a free one)"
    )
    transfer_timeout: float = Field(
        300.0,
        gt=0,
        description="transfer mode: seconds for the group's rendezvous, each broadcast and each"
        " weight-transfer HTTP call (a large model over a slow link may need more)",
    )
    server_command: str = Field(
        "", description="restart mode: the command that starts the server, with {model}, {port}"
    )
    lora_r: int = Field(16, ge=1, description="lora mode: rank of the adapters")
    lora_alpha: float = Field(32.0, gt=0, description="lora mode: scale of the adapters")
    lora_targets: list[str] = Field(
        ["q_proj", "v_proj"], min_length=1, description="lora mode: modules that get adapters"
    )
    lora_name: str = Field("policy", description="lora mode: the adapter's name on the server")
    seed: int = Field(0, description="seed of torch")
    device: str = Field("auto", description="'auto' (cuda when available, else cpu), 'cpu', 'cuda'")
    layout: Literal["auto", "padded", "packed"] = Field(
        "auto",
        description="each pass's sequences padded to the longest, or packed end to end in one"
        " row (no padding computed; pays with an attention that runs packed rows as separate"
        " sequences: flash_attention_2/3 or flex_attention); auto: packed with those, padded"
        " otherwise and for --loss opd",
    )
    attention: str = Field(
        "auto",
        description="the model's attention implementation, as transformers names it: sdpa,"
        " eager, flash_attention_2 (needs the flash-attn package), flex_attention; auto:"
        " transformers' default for the model",
    )
    activation_checkpointing: bool = Field(
        False,
        description="recompute each block's activations in backward instead of keeping them"
        " (less memory for about a third more compute)",
    )
    rank_timeout: float = Field(
        900.0,
        gt=0,
        description="under torchrun: seconds a process waits for the others (at a gather, or"
        " while rank 0 talks to the API or the servers) before it fails; a process that died"
        " ends the run within this",
    )
    patience: float = Field(120.0, ge=0, description="seconds to keep retrying an unreachable API")
    wandb: bool = Field(False, description="also log metrics to W&B (needs the wandb extra)")
    wandb_project: str = Field(
        "atropos", description="W&B project, registered with the API for the environments too"
    )
    wandb_group: str | None = Field(
        None, description="W&B group the environments join (unset: the run's name)"
    )
    wandb_name: str | None = Field(None, description="W&B run name (unset: trainer-DATE-XXXXXX)")

    @field_validator("model")
    @classmethod
    def _model_source(cls, value: str) -> str:
        """'tiny' becomes the shipped policy's directory; a path must be a model directory."""
        if value == "tiny":
            from atropos.tiny.warmstart import policy_path

            return str(policy_path())
        path = Path(value).expanduser()
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise ValueError(f"{value} has no config.json: not a Hugging Face model directory")
            return value
        if path.exists():
            raise ValueError(f"{value} is a file: pass the model's directory")
        if not _HUB_ID.fullmatch(value):
            raise ValueError(
                f"no directory {value}: pass a Hugging Face model directory, a Hub model id,"
                " or the tiny policy that ships with atropos: --model tiny"
            )
        return value


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")  # "org/name" or "name", never "./x"


# The JSONL keeps the short names (docs/trainer.md); W&B gets upstream's names where they exist
# (docs/metrics.md), the rest under the same prefixes.
WANDB_NAMES = {
    "api_step": "train/api_step",
    "loss": "train/loss",
    "grad_norm": "train/grad_norm",
    "lr": "train/lr",
    "mean_ratio": "grpo/mean_ratio",
    "clip_fraction": "grpo/clipped_fraction",
    "kl": "train/kl",
    "reward_mean": "train/reward_mean",
    "logprob_mismatch": "alignment/logprob_mismatch",
    "logprob_mismatch_all": "alignment/logprob_mismatch_all",
    "on_policy_fraction": "alignment/on_policy_fraction",
    "trained_tokens": "train/trained_tokens",
    "sequences": "train/sequences",
    "served_policy_version": "train/served_policy_version",
    "data_wait_s": "train/data_fetch_time",
    "sync_s": "train/sync_time",
    "step_s": "train/step_time",
}
OPD_WANDB_NAMES = {  # the metrics `--loss opd` adds (distill.opd_loss)
    "reverse_kl": "opd/reverse_kl",
    "forward_kl": "opd/forward_kl",
    "teacher_topk_share": "opd/teacher_topk_share",
}


def open_metrics(cfg: TrainConfig) -> tuple[MetricsSink, str, str]:
    """The trainer's sink (`{out}/metrics.jsonl`, plus W&B with `--wandb`) and the W&B group
    and project to register ("" and "" without W&B, as upstream's trainer sent)."""
    if not cfg.wandb:
        return MetricsSink(cfg.out_dir / "metrics.jsonl", "trainer"), "", ""
    name = cfg.wandb_name or run_name("trainer")
    group = cfg.wandb_group or name
    run = WandbRun.start(
        project=cfg.wandb_project,
        group=group,
        name=name,
        config=cfg.model_dump(mode="json", exclude={"api_key", "server_api_key"}),
        dir=os.environ.get("WANDB_DIR") or cfg.out_dir,
        names={**WANDB_NAMES, **OPD_WANDB_NAMES},
        off_hint="leave out --wandb",
    )
    return MetricsSink(cfg.out_dir / "metrics.jsonl", "trainer", run), group, cfg.wandb_project


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run until `cfg.steps` or a signal; returns the last step's metrics. Under torchrun every
    rank runs this (module docstring)."""
    from atropos.inference.tokenizer import quiet_progress_bars
    from atropos.trainer.ranks import Ranks
    from atropos.trainer.session import Session
    from atropos.trainer.stop import stop_on_signals

    quiet_progress_bars()
    ranks = Ranks.from_env(cfg.device, cfg.rank_timeout)
    stopping, restore_signals, waiting = stop_on_signals()
    session: Session | None = None
    sink: MetricsSink | None = None
    try:
        session = Session(cfg, ranks, waiting)  # the model (sharded under torchrun), AdamW
        sink, wandb_group, wandb_project = open_metrics(cfg) if ranks.main else (None, "", "")
        if not session.start(sink, wandb_group, wandb_project):  # servers, API registration
            return {}
        while session.step < cfg.steps:
            batch = session.next_batch(stopping)  # rank 0 leases it, every rank gets it
            if batch is None:  # a signal to some rank
                break
            session.train_on(batch)  # step, publish, checkpoint, acknowledge, log
        session.finish()  # checkpoint and acknowledge what is left
        return session.last
    finally:
        restore_signals()
        if sink is not None:
            sink.close()
        if session is not None:
            session.close()
        ranks.close()

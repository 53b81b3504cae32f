"""Reference GRPO trainer: `atropos train --model DIR [--flags]`.

The variant, exactly:
- GRPO advantages: per group, ``A = (r - mean) / max(std, 1e-8)`` (population std), the same
  advantage for every completion token of a sequence (per-token `advantages` from the
  environment take precedence).
- Token-level PPO-clip against the **inference server's logprobs** (the behaviour policy),
  ``-min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)`` for both signs of ``A``; mean over each
  sequence's tokens, then over sequences. Optional k3 KL to the starting weights (`--kl-coef`).
- One optimizer step (AdamW, linear warmup, global-norm clipping) per API batch of
  `--batch-size` sequences, accumulated over micro-batches of `--micro-batch-size`.
- Logits at temperature 1: the servers return raw (temperature-1) logprobs, so ratios compare
  like with like.
- `--loss opd`: on-policy distillation toward the teacher logprobs the environments attach
  (`distill.py`: a reverse-KL advantage in the same clipped loss, or a top-k forward KL).

Data flow: lease a batch from the API, train on it, publish the weights (`sync.py`), write a
checkpoint every `--checkpoint-every` steps and only then acknowledge the batches it covers, so a
crash loses nothing and trains nothing twice. Resumes from the newest checkpoint in `--out-dir`.
Metrics per step go to ``{out_dir}/metrics.jsonl`` and, with `--wandb`, to a W&B run whose
project and group are registered with the API so the environments log beside it
(docs/metrics.md). SIGTERM or SIGINT finishes the step in progress, checkpoints and returns; one
that comes while the trainer waits (for its inference server, the API, registration or a batch)
ends the wait at once.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
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


def step_lr(cfg: TrainConfig, step: int) -> float:
    """Linear warmup to `lr` over `warmup_steps`, then constant."""
    return cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Run until `cfg.steps` or SIGTERM; returns the last step's metrics.

    Long because it is the training loop read top to bottom: setup, the step loop and shutdown share
    the model, the optimizer, the client and the weight sync.
    """
    import torch
    from transformers.utils import logging as hf_logging

    from atropos.inference.tokenizer import load_tokenizer
    from atropos.local.weights import load_fp32
    from atropos.trainer.client import TrainerClient
    from atropos.trainer.data import micro_batches, samples_from_groups
    from atropos.trainer.distill import opd_loss
    from atropos.trainer.lora import apply_lora
    from atropos.trainer.loss import policy_loss, token_logprobs
    from atropos.trainer.sync import WeightSync

    quiet_progress: Any = hf_logging.disable_progress_bar  # typed in some releases only
    quiet_progress()
    torch.manual_seed(cfg.seed)
    device = (
        cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    )
    out = cfg.out_dir
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    resume = latest_checkpoint(out)
    tokenizer = load_tokenizer(cfg.model)
    lora = cfg.sync == "lora"
    source = cfg.model if (resume is None or lora) else str(resume)
    model: Any = load_fp32(source)
    model = model.to(device)
    reference = copy.deepcopy(model).eval().requires_grad_(False) if cfg.kl_coef else None
    lora_args: dict[str, Any] = {}
    if lora:
        apply_lora(model, cfg.lora_targets, cfg.lora_r, cfg.lora_alpha)
        lora_args = dict(
            r=cfg.lora_r, alpha=cfg.lora_alpha, targets=cfg.lora_targets, base=cfg.model
        )
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    step, covered = 0, list[str]()
    if resume is not None:
        step, covered = load_state(resume, model, opt, lora)
        log.info("resumed from %s at step %d", resume, step)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    sync = WeightSync(
        cfg.sync, out, cfg.server_url, server_command=cfg.server_command,
        lora_name=cfg.lora_name, lora=lora_args, keep=cfg.keep_checkpoints,
        server_key=cfg.server_api_key.get_secret_value() if cfg.server_api_key else None,
        transfer=dict(
            server_type=cfg.server_type, backend=cfg.transfer_backend, pause=cfg.transfer_pause,
            master_address=cfg.transfer_master_address, master_port=cfg.transfer_master_port,
            timeout=cfg.transfer_timeout,
        ),
    )  # fmt: skip
    api = TrainerClient(
        cfg.api_url, cfg.api_key.get_secret_value() if cfg.api_key else None, cfg.patience
    )
    stopping, restore_signals, waiting = _stop_on_sigterm()
    (out / "config.json").write_text(
        cfg.model_dump_json(indent=2, exclude={"api_key", "server_api_key"})
    )
    sink: MetricsSink | None = None
    last: dict[str, Any] = {}
    unacked: list[str] = []
    try:
        sink, wandb_group, wandb_project = open_metrics(cfg)
        with waiting("the inference server"):
            if cfg.sync == "restart":
                sync.start_server(str(resume.resolve()) if resume and not lora else cfg.model, step)
            elif step > 0 or lora or cfg.sync == "transfer":  # the server may hold other weights
                sync.publish(model, tokenizer, step)
        with waiting("the API"):
            api.wait_ready()
            api.register(
            wandb_group=wandb_group, wandb_project=wandb_project, batch_size=cfg.batch_size,
            max_token_len=cfg.seq_len, checkpoint_dir=str(out / "checkpoints"),
            save_checkpoint_interval=cfg.checkpoint_every or cfg.steps,
                starting_step=step, num_steps=cfg.steps,
            )  # fmt: skip
        for batch_id in covered:  # in the checkpoint; a crash may have come before their ack
            api.ack(batch_id, missing_ok=True)
        log.info(
            "registered with %s; training steps %d..%d on %s",
            cfg.api_url, step + 1, cfg.steps, device,
        )  # fmt: skip
        while step < cfg.steps and not stopping():
            t0 = time.perf_counter()
            try:
                with waiting("a batch"):
                    batch = api.next_batch(cfg.lease_seconds, stop=stopping)
            except _Interrupted as why:
                log.warning("%s; stopping after step %d", why, step)
                batch = None
            if batch is None:
                break
            t_data = time.perf_counter() - t0
            samples = samples_from_groups(batch.groups, cfg.seq_len, teacher=cfg.loss == "opd")
            lr = step_lr(cfg, step)
            for group in opt.param_groups:
                group["lr"] = lr

            # ---- one optimizer step over micro-batches -----------------------------------
            model.train()
            acc: dict[str, float] = {k: 0.0 for k in ("loss", "ratio", "clip", "kl", "tokens")}
            extra: dict[str, float] = {}  # the loss's own metrics (opd), per trained token
            diffs: dict[str, list[float]] = {"on": [], "all": []}
            for mb in micro_batches(samples, cfg.micro_batch_size, pad_id):
                mb_ids, targets = mb.input_ids.to(device), mb.targets.to(device)
                logits = model(input_ids=mb_ids).logits
                logp = token_logprobs(logits, targets)
                mask = mb.mask.to(device)
                has_old = mb.has_old.to(device)
                old = torch.where(has_old, mb.old_logp.to(device), logp.detach())
                ref = None
                if reference is not None:
                    with torch.no_grad():
                        ref = token_logprobs(reference(input_ids=mb_ids).logits, targets)
                if cfg.loss == "opd" and mb.teacher is not None:
                    loss, stats = opd_loss(
                        cfg.opd_mode, logits=logits, logp=logp, old_logp=old,
                        env_advantages=mb.advantages.to(device), targets=targets, mask=mask,
                        teacher=mb.teacher.to(device), reward_coef=cfg.opd_reward_coef,
                        clip_eps=cfg.clip_eps, ref_logp=ref, kl_coef=cfg.kl_coef,
                    )  # fmt: skip
                else:
                    loss, stats = policy_loss(
                        logp, old, mb.advantages.to(device), mask, cfg.clip_eps, ref, cfg.kl_coef
                    )
                del logits  # not kept alive through backward ([B, T, vocab] floats)
                share = len(mb.policy_versions) / len(samples)  # mean over the whole batch
                scaled: torch.Tensor = loss * share
                scaled.backward()  # type: ignore[no-untyped-call]
                _mismatch(logp.detach(), old, has_old, mb.policy_versions, step, diffs)
                n = stats.tokens
                acc["loss"] += float(loss.detach()) * share
                acc["ratio"] += stats.mean_ratio * n
                acc["clip"] += stats.clip_fraction * n
                acc["kl"] += stats.kl * n
                acc["tokens"] += n
                for key, value in stats.extra.items():
                    extra[key] = extra.get(key, 0.0) + value * n
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm))
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1

            # ---- publish, checkpoint, acknowledge -----------------------------------------
            t_sync = 0.0
            if cfg.sync != "none" and (step % cfg.sync_every == 0 or step == cfg.steps):
                try:
                    t_sync = sync.publish(model, tokenizer, step, waiting)
                except _Interrupted as why:  # the step is done: checkpoint it, then stop
                    log.warning("%s; stopping after step %d", why, step)
            if batch.batch_id:
                unacked.append(batch.batch_id)
            if step == cfg.steps or (cfg.checkpoint_every and step % cfg.checkpoint_every == 0):
                save_state(
                    out, step, model, tokenizer, opt, lora_args, cfg.keep_checkpoints, unacked
                )
            if not cfg.checkpoint_every or latest_step(out) == step:
                for batch_id in unacked:
                    api.ack(batch_id)
                unacked.clear()
            tokens = max(acc["tokens"], 1.0)
            last = {
                "step": step, "api_step": batch.step, "loss": acc["loss"],
                "grad_norm": grad_norm, "lr": lr, "mean_ratio": acc["ratio"] / tokens,
                "clip_fraction": acc["clip"] / tokens, "kl": acc["kl"] / tokens,
                "reward_mean": sum(s.score for s in samples) / len(samples),
                "logprob_mismatch": _mean(diffs["on"]), "logprob_mismatch_all": _mean(diffs["all"]),
                "on_policy_fraction": len(diffs["on"]) / max(len(diffs["all"]), 1),
                "trained_tokens": int(acc["tokens"]), "sequences": len(samples),
                "served_policy_version": sync.served_version,
                "data_wait_s": t_data, "sync_s": t_sync, "step_s": time.perf_counter() - t0,
                **{key: value / tokens for key, value in extra.items()},
            }  # fmt: skip
            sink.log({k: v for k, v in last.items() if k != "step"}, step=step)
            log.info(
                "step %d/%d loss %.4f reward %.3f ratio %.4f clip %.3f mismatch %s grad %.3f",
                step, cfg.steps, last["loss"], last["reward_mean"], last["mean_ratio"],
                last["clip_fraction"], _fmt(last["logprob_mismatch"]), grad_norm,
            )  # fmt: skip
    except _Interrupted as why:  # before the first step: nothing to save
        log.warning("%s; stopping before training", why)
    else:
        if unacked and step > latest_step(out):
            save_state(out, step, model, tokenizer, opt, lora_args, cfg.keep_checkpoints, unacked)
        if latest_step(out) == step:
            for batch_id in unacked:
                api.ack(batch_id)
    finally:
        restore_signals()
        if sink is not None:
            sink.close()
        api.close()
        sync.close()
    return last


def _mismatch(
    logp: Any,
    old: Any,
    has_old: Any,
    versions: list[int | None],
    step: int,
    diffs: dict[str, list[float]],
) -> None:
    """Per-sequence mean |trainer - inference| logprob over trained tokens with a server value.

    "on" keeps the sequences the server says it generated with exactly the weights being trained
    (`policy_version == step`): there the two numbers must agree up to arithmetic noise.
    """
    gap = (logp - old).abs() * has_old
    counts = has_old.sum(dim=1)
    for row, version in enumerate(versions):
        if int(counts[row]) == 0:
            continue
        value = float(gap[row].sum()) / int(counts[row])
        diffs["all"].append(value)
        if version == step:
            diffs["on"].append(value)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2e}"


class _Interrupted(Exception):
    """A signal came while the trainer waited (for the API, the server or a batch)."""


def _stop_on_sigterm() -> tuple[Any, Any, Any]:
    """`stop()`, true after SIGTERM/SIGINT (finish the step, checkpoint, exit), `restore()`,
    and `waiting(what)`: a context manager inside which a signal interrupts the wait at once
    (`_Interrupted`, from the handler) instead of after it (a wait for the API or a batch may
    last minutes, and a step in progress must not be cut)."""
    flag: dict[str, Any] = {"stop": False, "waiting": None}

    def handler(signum: int, frame: Any) -> None:
        flag["stop"] = True
        name = signal.Signals(signum).name
        if flag["waiting"] is not None:
            raise _Interrupted(f"received {name} while waiting for {flag['waiting']}")
        log.info("received %s: finishing this step, then stopping", name)

    @contextlib.contextmanager
    def waiting(what: str) -> Iterator[None]:
        if flag["stop"]:
            raise _Interrupted(f"stopping: asked to before waiting for {what}")
        flag["waiting"] = what
        try:
            yield
        finally:
            flag["waiting"] = None

    if threading.current_thread() is not threading.main_thread():
        return (lambda: flag["stop"]), (lambda: None), waiting
    old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, h in old.items():
            signal.signal(sig, h)

    return (lambda: flag["stop"]), restore, waiting


# ----- checkpoints: {out}/checkpoints/step_N, written whole then renamed --------------------------


def latest_checkpoint(out: Path) -> Path | None:
    found = [p for p in (out / "checkpoints").glob("step_*") if (p / "state.json").exists()]
    return max(found, key=lambda p: int(p.name[5:]), default=None)


def latest_step(out: Path) -> int:
    path = latest_checkpoint(out)
    return -1 if path is None else int(path.name[5:])


def save_state(
    out: Path,
    step: int,
    model: Any,
    tokenizer: Any,
    opt: Any,
    lora: dict[str, Any],
    keep: int,
    batch_ids: list[str] | None = None,
) -> Path:
    """Weights (or the LoRA adapter), optimizer state, the step and the batches it covers.

    The batch ids are acknowledged right after the checkpoint; a crash in between would leave
    them leased, so a resumed trainer acknowledges them first instead of training them again.
    """
    import torch

    from atropos.trainer.sync import prune, save_lora

    final = out / "checkpoints" / f"step_{step}"
    tmp = final.with_name(final.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if lora:
        save_lora(model, tmp / "adapter", **lora)
    else:  # the directory itself is renamed into place below
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    (tmp / "state.json").write_text(json.dumps({"step": step, "batch_ids": batch_ids or []}))
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    prune(final.parent, "step_", keep)
    return final


def load_state(path: Path, model: Any, opt: Any, lora: bool) -> tuple[int, list[str]]:
    """Restore what `save_state` wrote (full weights were already loaded from `path`).

    Returns the step and the ids of the batches the checkpoint covers.
    """
    import torch

    if lora:
        from atropos.local.lora import load_adapter
        from atropos.trainer.lora import LoraLinear

        adapter = load_adapter(path / "adapter")
        for name, module in model.named_modules():
            if isinstance(module, LoraLinear) and name in adapter.weights:
                a, b = adapter.weights[name]
                module.lora_A.data.copy_(a)
                module.lora_B.data.copy_(b)
    opt.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    state = json.loads((path / "state.json").read_text())
    return int(state["step"]), [str(b) for b in state.get("batch_ids", [])]

"""One training run on one rank: what `train()` sets up, and the parts of its loop.

`Session(cfg, ranks, waiting)` loads the tokenizer and the weights (from the newest checkpoint
when there is one), adds LoRA adapters and activation checkpointing when asked, shards the model
over the ranks under torchrun (`fsdp.shard`), builds AdamW and restores its state. Then, in
`train()`'s order:

- `start`: the inference servers get the resumed weights, rank 0 registers with the API and
  acknowledges what the checkpoint covers;
- `next_batch`: rank 0 leases a batch and every rank receives its samples (in rounds of a
  couple of seconds, each beginning with `Ranks.any` over the ranks' stop flags, so a signal to
  any rank stops them all and no rank waits on another without a deadline);
- `train_on`: one optimizer step (`step.train_step`), then the weights to the servers every
  `--sync-every` steps, a checkpoint every `--checkpoint-every`, the acknowledgement of the
  batches a checkpoint now covers, the step's metrics;
- `finish`: a last checkpoint for batches no checkpoint covers yet, and their acknowledgement.

Only rank 0 talks to the API and the inference servers, through the public trainer client
(`atropos.client`: `TrainerClient` for the API, its `Publisher`, here `sync.WeightSync`, for the
servers); the others take part in every gather and checkpoint. With one process (no torchrun)
every exchange is a no-op.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import torch

from atropos.client.samples import Sample
from atropos.client.transfer import named_tensors, whole
from atropos.metrics import MetricsSink
from atropos.trainer.checkpoint import (
    latest_checkpoint,
    load_lora_weights,
    load_optimizer,
    save_checkpoint,
)
from atropos.trainer.fsdp import checkpoint_activations, full_state_dict, shard
from atropos.trainer.ranks import Ranks
from atropos.trainer.step import StepSettings, Tally, pass_layout, train_step
from atropos.trainer.stop import Interrupted, Waiting

if TYPE_CHECKING:
    from atropos.client import TrainerClient
    from atropos.trainer.sync import WeightSync
    from atropos.trainer.train import TrainConfig

log = logging.getLogger("atropos.trainer")
ROUND_S = 2.0  # rank 0 polls the API this long per round before the ranks check for a signal


@dataclass
class Round:
    """What rank 0 tells the others after one round of waiting for a batch."""

    kind: Literal["batch", "wait", "stop", "error"]
    samples: list[Sample] = field(default_factory=list)
    api_step: int = 0
    batch_id: str | None = None
    detail: str = ""


@dataclass
class Leased:
    """A batch every rank holds: its samples, the API's step, the id to acknowledge, and when
    the wait for it began."""

    samples: list[Sample]
    api_step: int
    batch_id: str | None
    t0: float
    data_wait_s: float


def step_lr(cfg: TrainConfig, step: int) -> float:
    """Linear warmup to `lr` over `warmup_steps`, then constant."""
    return cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr


class Session:
    """The model, optimizer and step counter of one run on one rank, and its loop's parts."""

    def __init__(self, cfg: TrainConfig, ranks: Ranks, waiting: Waiting) -> None:
        from atropos.inference.tokenizer import load_tokenizer

        if ranks.distributed and cfg.sync == "transfer" and cfg.transfer_backend == "ipc":
            raise ValueError(  # every rank refuses alike, before any collective
                "--transfer-backend ipc hands the server whole GPU tensors, and a sharded model"
                " (torchrun) holds shards: use nccl or gloo, or one process"
            )
        torch.manual_seed(cfg.seed)
        self.cfg, self.ranks, self.waiting = cfg, ranks, waiting
        out = cfg.out_dir
        if ranks.main:
            (out / "checkpoints").mkdir(parents=True, exist_ok=True)
            (out / "config.json").write_text(
                cfg.model_dump_json(indent=2, exclude={"api_key", "server_api_key"})
            )
        self.resume = ranks.broadcast(latest_checkpoint(out), "agreeing on the checkpoint")
        self.tokenizer = load_tokenizer(cfg.model)
        self.lora_args: dict[str, Any] = {}
        if cfg.sync == "lora":
            self.lora_args = dict(
                r=cfg.lora_r, alpha=cfg.lora_alpha, targets=cfg.lora_targets, base=cfg.model
            )
        self.model, self.reference = self._load_model()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.step, self.covered, self.saved = 0, list[str](), -1
        if self.resume is not None:
            resumed = load_optimizer(self.resume, self.model, self.opt, ranks)
            self.step, self.covered, self.saved = resumed.step, resumed.batch_ids, resumed.step
            log.info(
                "resumed from %s at step %d (written by %d process(es), resumed by %d)",
                self.resume, self.step, resumed.world, ranks.world,
            )  # fmt: skip
        pad = self.tokenizer.pad_token_id
        self.settings = StepSettings(
            micro_batch_size=cfg.micro_batch_size, clip_eps=cfg.clip_eps, kl_coef=cfg.kl_coef,
            max_grad_norm=cfg.max_grad_norm, loss=cfg.loss, opd_mode=cfg.opd_mode,
            opd_reward_coef=cfg.opd_reward_coef, pad_id=pad if pad is not None else 0,
            layout=pass_layout(cfg.layout, self.model, cfg.loss),
        )  # fmt: skip
        self.sync: WeightSync | None = None
        self.api: TrainerClient | None = None
        if ranks.main:
            self.sync, self.api = self._rank0_clients()
        self.sink: MetricsSink | None = None
        self.unacked: list[str] = []
        self.last: dict[str, Any] = {}
        self.refused: Exception | None = None  # rank 0: why a batch cannot be trained

    def _load_model(self) -> tuple[Any, Any]:
        """The policy (and the frozen reference for `--kl-coef`), on the device or sharded."""
        from atropos.local.weights import load_fp32
        from atropos.trainer.lora import apply_lora

        cfg, resume = self.cfg, self.resume
        lora = bool(self.lora_args)
        attention = None if cfg.attention == "auto" else cfg.attention
        source = cfg.model if (resume is None or lora) else str(resume)
        model: Any = load_fp32(source, attention)
        reference = copy.deepcopy(model).eval().requires_grad_(False) if cfg.kl_coef else None
        if lora:
            apply_lora(model, cfg.lora_targets, cfg.lora_r, cfg.lora_alpha)
            if resume is not None:
                load_lora_weights(resume, model)
        if cfg.activation_checkpointing:
            checkpoint_activations(model)
        for module in (model, reference):
            if module is not None and self.ranks.distributed:
                shard(module, self.ranks)
            elif module is not None:
                module.to(self.ranks.device)
        return model, reference

    def _rank0_clients(self) -> tuple[WeightSync, TrainerClient]:
        """The servers' publisher and the API's client that holds it (closed with it)."""
        from atropos.client import TrainerClient
        from atropos.trainer.sync import WeightSync

        cfg = self.cfg
        sync = WeightSync(
            cfg.sync, cfg.out_dir, cfg.server_url, server_command=cfg.server_command,
            lora_name=cfg.lora_name, lora=self.lora_args, keep=cfg.keep_checkpoints,
            server_key=cfg.server_api_key.get_secret_value() if cfg.server_api_key else None,
            transfer=dict(
                server_type=cfg.server_type, backend=cfg.transfer_backend,
                pause=cfg.transfer_pause, master_address=cfg.transfer_master_address,
                master_port=cfg.transfer_master_port, timeout=cfg.transfer_timeout,
            ),
        )  # fmt: skip
        key = cfg.api_key.get_secret_value() if cfg.api_key else None
        return sync, TrainerClient(cfg.api_url, key, cfg.patience, publisher=sync)

    # ----- start ------------------------------------------------------------------------------

    def start(self, sink: MetricsSink | None, wandb_group: str, wandb_project: str) -> bool:
        """The servers get the resumed weights, rank 0 registers and acknowledges what the
        checkpoint covers; False on every rank when a signal came first."""
        cfg, step = self.cfg, self.step
        self.sink = sink
        why = ""
        try:
            if cfg.sync == "restart" and self.sync is not None:
                model_dir = str(self.resume.resolve()) if self.resume and not self.lora_args else ""
                with self.waiting("the inference server"):
                    self.sync.start_server(model_dir or cfg.model, step)
            elif step > 0 or self.lora_args or cfg.sync == "transfer":  # other weights served
                main = self.ranks.main
                with self.waiting("the inference server") if main else contextlib.nullcontext():
                    self.publish(step, interruptible=False)
            if self.api is not None:
                self._register(wandb_group, wandb_project)
                self._announce(step)  # what the servers serve now: resumed weights, or base
        except Interrupted as err:
            why = str(err)
        if self.ranks.any(bool(why), "starting"):
            log.warning("%s; stopping before training", why or "another rank was stopped")
            return False
        log.info(
            "training steps %d..%d on %s (%d process(es))",
            step + 1, cfg.steps, self.ranks.device, self.ranks.world,
        )  # fmt: skip
        return True

    def _register(self, wandb_group: str, wandb_project: str) -> None:
        cfg, api = self.cfg, self.api
        assert api is not None
        with self.waiting("the API"):
            api.wait_ready()
            api.register(
                wandb_group=wandb_group, wandb_project=wandb_project, batch_size=cfg.batch_size,
                max_token_len=cfg.seq_len, checkpoint_dir=str(cfg.out_dir / "checkpoints"),
                save_checkpoint_interval=cfg.checkpoint_every or cfg.steps,
                starting_step=self.step, num_steps=cfg.steps,
            )  # fmt: skip
        for batch_id in self.covered:  # in the checkpoint; a crash may have come before the ack
            api.ack(batch_id, missing_ok=True)
        log.info("registered with %s", cfg.api_url)

    # ----- the loop's parts --------------------------------------------------------------------

    def next_batch(self, stopping: Any) -> Leased | None:
        """The next batch on every rank; None when a rank got a signal."""
        t0 = time.perf_counter()
        while True:
            if self.ranks.any(stopping(), "agreeing whether to stop"):
                return None
            said = self._lease_round(stopping) if self.ranks.main else None
            told = self.ranks.broadcast(said, "waiting for the next batch from rank 0")
            assert told is not None
            if told.kind == "batch":
                waited = time.perf_counter() - t0
                return Leased(told.samples, told.api_step, told.batch_id, t0, waited)
            if told.kind == "stop":
                log.warning("%s; stopping after step %d", told.detail, self.step)
                return None
            if told.kind == "error":  # rank 0 raises the error itself, the others its words
                raise self.refused or ValueError(told.detail)

    def _lease_round(self, stopping: Any) -> Round:
        """Rank 0: poll the API for up to `ROUND_S` seconds; a batch, nothing yet, a stop, or
        a batch that cannot be trained (the error goes to every rank)."""
        from atropos.client import MissingTeacher

        assert self.api is not None
        cfg = self.cfg
        try:
            with self.waiting("a batch"):
                batch = self.api.next_batch(cfg.lease_seconds, stop=stopping, within=ROUND_S)
        except Interrupted as why:
            return Round("stop", detail=str(why))
        if batch is None:
            return Round("wait")
        try:
            samples = batch.samples(cfg.seq_len, teacher=cfg.loss == "opd")
        except MissingTeacher as err:
            self.refused = err
            return Round("error", detail=str(err))
        return Round("batch", samples, batch.step, batch.batch_id)

    def train_on(self, leased: Leased) -> None:
        """One step on `leased`, then publish, checkpoint, acknowledge and log."""
        cfg = self.cfg
        lr = step_lr(cfg, self.step)
        for group in self.opt.param_groups:
            group["lr"] = lr
        grad_norm, mine = train_step(
            self.model, self.opt, self.params, leased.samples, self.settings, self.ranks,
            step=self.step, reference=self.reference,
        )  # fmt: skip
        tally = Tally.merged(self.ranks.gather(mine, "collecting the step's metrics"))
        self.step += 1
        t_sync = 0.0
        if cfg.sync != "none" and (self.step % cfg.sync_every == 0 or self.step == cfg.steps):
            try:
                t_sync = self.publish(self.step)
                self._announce(self.step)
            except Interrupted as why:  # the step is done: checkpoint it, then stop
                log.warning("%s; stopping after step %d", why, self.step)
        if leased.batch_id:
            self.unacked.append(leased.batch_id)
        every = cfg.checkpoint_every
        if self.step == cfg.steps or (every and self.step % every == 0):
            self.checkpoint()
        if not every or self.saved == self.step:
            self.acknowledge()
        self.last = self._metrics(leased, tally, grad_norm, lr, t_sync)
        self._log()

    def _announce(self, version: int) -> None:
        """Rank 0 tells the API which version the servers serve now (`POST /policy_version`),
        once the sync has completed: the version a server confirmed, else `version`. With
        `--sync none` nothing is said (whoever loads the checkpoints may say it), and groups
        fall back to the API's step."""
        if self.api is None or self.cfg.sync == "none":
            return
        served = self.sync.served_version if self.sync is not None else None
        with self.waiting("the API"):
            self.api.published(version if served is None else served)

    def publish(self, version: int, interruptible: bool = True) -> float:
        """The weights to the inference servers as policy `version` (every rank calls this:
        a sharded model's weights are gathered); the seconds rank 0 took. `interruptible`: a
        signal ends the sync's pauses (for a server that is restarting) at once."""
        waiting = self.waiting if interruptible else None
        if self.ranks.distributed and self.cfg.sync == "transfer":
            return self._publish_streamed(version, waiting)
        state = full_state_dict(self.model) if self.ranks.distributed else None
        if self.sync is None:
            return 0.0
        return self.sync.publish(self.model, self.tokenizer, version, waiting, state=state)

    def _publish_streamed(self, version: int, waiting: Waiting | None) -> float:
        """`--sync transfer` from a sharded model: rank 0 sends each tensor as soon as it is
        gathered, so one whole tensor at a time is in memory; the others gather with it."""
        if self.sync is None:
            for _, tensor in named_tensors(self.model):
                whole(tensor)
            return 0.0
        try:
            return self.sync.publish(self.model, self.tokenizer, version, waiting)
        except Interrupted:  # while joining: nothing was gathered yet, the others wait for it
            if self.sync.transfer is not None and self.sync.transfer.group is None:
                for _, tensor in named_tensors(self.model):
                    whole(tensor)
            raise

    def checkpoint(self) -> None:
        """A checkpoint of this step covering the unacknowledged batches (every rank)."""
        cfg = self.cfg
        save_checkpoint(
            cfg.out_dir, self.step, self.model, self.tokenizer, self.opt, self.ranks,
            lora=self.lora_args, keep=cfg.keep_checkpoints, batch_ids=self.unacked,
        )  # fmt: skip
        self.saved = self.step

    def acknowledge(self) -> None:
        """Rank 0 acknowledges the batches trained so far (a checkpoint covers them)."""
        if self.api is not None:
            for batch_id in self.unacked:
                self.api.ack(batch_id)
        self.unacked.clear()

    def finish(self) -> None:
        """A last checkpoint for batches none covers yet, then their acknowledgement."""
        if self.unacked and self.step > self.saved:
            self.checkpoint()
        if self.saved == self.step:
            self.acknowledge()

    def close(self) -> None:
        if self.api is not None:
            self.api.close()  # and its publisher, `self.sync`
        elif self.sync is not None:
            self.sync.close()

    # ----- metrics -----------------------------------------------------------------------------

    def _metrics(
        self, leased: Leased, tally: Tally, grad_norm: float, lr: float, t_sync: float
    ) -> dict[str, Any]:
        samples = leased.samples
        tokens = max(tally.tokens, 1.0)
        on, every = tally.gaps_on, tally.gaps_all
        return {
            "step": self.step, "api_step": leased.api_step, "loss": tally.loss,
            "grad_norm": grad_norm, "lr": lr, "mean_ratio": tally.ratio / tokens,
            "clip_fraction": tally.clip / tokens, "kl": tally.kl / tokens,
            "reward_mean": sum(s.score for s in samples) / len(samples),
            "logprob_mismatch": _mean(on), "logprob_mismatch_all": _mean(every),
            "on_policy_fraction": len(on) / max(len(every), 1),
            "trained_tokens": int(tally.tokens), "sequences": len(samples),
            "served_policy_version": self.sync.served_version if self.sync else None,
            "data_wait_s": leased.data_wait_s, "sync_s": t_sync,
            "step_s": time.perf_counter() - leased.t0,
            **{key: value / tokens for key, value in tally.extra.items()},
        }  # fmt: skip

    def _log(self) -> None:
        last = self.last
        if self.sink is not None:
            self.sink.log({k: v for k, v in last.items() if k != "step"}, step=self.step)
        if self.ranks.main:
            log.info(
                "step %d/%d loss %.4f reward %.3f ratio %.4f clip %.3f mismatch %s grad %.3f"
                " batch wait %.2fs",
                self.step, self.cfg.steps, last["loss"], last["reward_mean"], last["mean_ratio"],
                last["clip_fraction"], _fmt(last["logprob_mismatch"]), last["grad_norm"],
                last["data_wait_s"],
            )  # fmt: skip


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2e}"

"""One optimizer step over a batch, on one process or on each of N (the same function).

The batch is split across the ranks by tokens (`shard.balanced_split`); each rank runs its share
in micro-batches of `micro_batch_size` sequences, accumulating gradients, then one clipped AdamW
step. Every rank runs the same number of forward/backward passes (FSDP gathers each block's
weights in every pass, on every rank): a rank with fewer sequences runs passes that contribute
nothing (the loss times 0).

The gradient equals the one-process gradient of the batch: the loss is the mean over all the
batch's sequences of each sequence's loss, so a micro-batch of ``b`` sequences out of ``B``
contributes ``loss_mb * b / B``; FSDP averages the ranks' gradients (divides their sum by N),
so each rank scales by ``N * b / B``. A test checks the parameters against the one-process
trainer's after a few steps (tests/trainer/test_fsdp.py).

Only torch and the trainer's pure modules are imported, so `benchmarks/trainer_gpu.py` times this
very step on a bare GPU machine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from atropos.client.samples import Sample
from atropos.client.tensors import MicroBatch, collate
from atropos.trainer.distill import OpdMode, opd_loss
from atropos.trainer.fsdp import grad_norm_value
from atropos.trainer.loss import LossStats, policy_loss, token_logprobs
from atropos.trainer.ranks import Ranks
from atropos.trainer.shard import balanced_split


@dataclass(frozen=True)
class StepSettings:
    """What a step needs from the trainer's configuration."""

    micro_batch_size: int = 16
    clip_eps: float = 0.2
    kl_coef: float = 0.0
    max_grad_norm: float = 1.0
    loss: str = "grpo"  # or "opd"
    opd_mode: OpdMode = "reverse"
    opd_reward_coef: float = 0.0
    pad_id: int = 0


@dataclass
class Tally:
    """A step's sums, per rank, then merged: the loss (already a batch mean), token-weighted
    ratio, clip fraction, KL and the loss's own metrics, and the logprob gaps per sequence."""

    loss: float = 0.0
    ratio: float = 0.0
    clip: float = 0.0
    kl: float = 0.0
    tokens: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)
    gaps_on: list[float] = field(default_factory=list)  # sequences of exactly this policy
    gaps_all: list[float] = field(default_factory=list)

    def add(self, loss: float, stats: LossStats) -> None:
        n = stats.tokens
        self.loss += loss
        self.ratio += stats.mean_ratio * n
        self.clip += stats.clip_fraction * n
        self.kl += stats.kl * n
        self.tokens += n
        for key, value in stats.extra.items():
            self.extra[key] = self.extra.get(key, 0.0) + value * n

    @staticmethod
    def merged(parts: Sequence[Tally]) -> Tally:
        total = Tally()
        for part in parts:
            total.loss += part.loss
            total.ratio += part.ratio
            total.clip += part.clip
            total.kl += part.kl
            total.tokens += part.tokens
            for key, value in part.extra.items():
                total.extra[key] = total.extra.get(key, 0.0) + value
            total.gaps_on += part.gaps_on
            total.gaps_all += part.gaps_all
        return total


def my_micro_batches(
    samples: Sequence[Sample], size: int, ranks: Ranks
) -> list[list[Sample] | None]:
    """This rank's share of the batch in chunks of `size`, padded with None to the number of
    chunks the busiest rank has (at least one)."""
    shares = balanced_split([len(s.tokens) for s in samples], ranks.world)
    rounds = max(1, max(math.ceil(len(share) / size) for share in shares))
    mine = [samples[i] for i in shares[ranks.rank]]
    chunks: list[list[Sample] | None] = [
        mine[start : start + size] for start in range(0, len(mine), size)
    ]
    return chunks + [None] * (rounds - len(chunks))


def train_step(
    model: Any,
    opt: torch.optim.Optimizer,
    params: list[torch.nn.Parameter],
    samples: Sequence[Sample],
    settings: StepSettings,
    ranks: Ranks,
    *,
    step: int = 0,
    reference: Any = None,
) -> tuple[float, Tally]:
    """One optimizer step over `samples` (the whole batch, the same on every rank); returns the
    global gradient norm (before clipping) and this rank's tally (`Tally.merged` over the ranks'
    gives the step's). `step` is the policy version being trained (for the logprob gaps)."""
    model.train()
    tally = Tally()
    for chunk in my_micro_batches(samples, settings.micro_batch_size, ranks):
        if chunk is None:
            _idle_pass(model, settings.pad_id, ranks.device)
            continue
        mb = collate(chunk, settings.pad_id)
        share = len(chunk) / len(samples)  # this micro-batch's part of the batch mean
        loss, stats, logp, old = _micro_loss(model, reference, mb, settings, ranks.device)
        scaled: torch.Tensor = loss * (share * ranks.world)  # FSDP divides the sum by N
        scaled.backward()  # type: ignore[no-untyped-call]
        tally.add(float(loss.detach()) * share, stats)
        _gaps(logp, old, mb.has_old.to(ranks.device), mb.policy_versions, step, tally)
    norm = torch.nn.utils.clip_grad_norm_(params, settings.max_grad_norm)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return grad_norm_value(norm), tally


def _micro_loss(
    model: Any, reference: Any, mb: MicroBatch, settings: StepSettings, device: torch.device
) -> tuple[torch.Tensor, LossStats, torch.Tensor, torch.Tensor]:
    """The micro-batch's loss (its mean over sequences), stats, and the trainer's and the
    server's logprobs (detached) for the mismatch metric."""
    ids, targets = mb.input_ids.to(device), mb.targets.to(device)
    logits = model(input_ids=ids, use_cache=False).logits
    logp = token_logprobs(logits, targets)
    mask = mb.mask.to(device)
    has_old = mb.has_old.to(device)
    old = torch.where(has_old, mb.old_logp.to(device), logp.detach())
    ref = None
    if reference is not None:
        with torch.no_grad():
            ref = token_logprobs(reference(input_ids=ids, use_cache=False).logits, targets)
    advantages = mb.advantages.to(device)
    if settings.loss == "opd" and mb.teacher is not None:
        loss, stats = opd_loss(
            settings.opd_mode, logits=logits, logp=logp, old_logp=old, env_advantages=advantages,
            targets=targets, mask=mask, teacher=mb.teacher.to(device),
            reward_coef=settings.opd_reward_coef, clip_eps=settings.clip_eps, ref_logp=ref,
            kl_coef=settings.kl_coef,
        )  # fmt: skip
    else:
        loss, stats = policy_loss(
            logp, old, advantages, mask, settings.clip_eps, ref, settings.kl_coef
        )
    del logits  # not kept alive through backward ([B, T, vocab] floats)
    return loss, stats, logp.detach(), old


def _idle_pass(model: Any, pad_id: int, device: torch.device) -> None:
    """A forward and backward that change no gradient: this rank has no sequences left, but the
    others' passes need its part of every gather and reduce."""
    ids = torch.full((1, 2), pad_id, dtype=torch.long, device=device)
    logits = model(input_ids=ids, use_cache=False).logits
    nothing: torch.Tensor = logits.float().sum() * 0.0
    nothing.backward()  # type: ignore[no-untyped-call]


def _gaps(
    logp: torch.Tensor,
    old: torch.Tensor,
    has_old: torch.Tensor,
    versions: list[int | None],
    step: int,
    tally: Tally,
) -> None:
    """Per-sequence mean |trainer - inference| logprob over trained tokens with a server value.

    `gaps_on` keeps the sequences the server says it generated with exactly the weights being
    trained (`policy_version == step`): there the two numbers must agree up to arithmetic noise.
    """
    gap = (logp - old).abs() * has_old
    counts = has_old.sum(dim=1)
    for row, version in enumerate(versions):
        if int(counts[row]) == 0:
            continue
        value = float(gap[row].sum()) / int(counts[row])
        tally.gaps_all.append(value)
        if version == step:
            tally.gaps_on.append(value)

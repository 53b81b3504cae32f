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
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from atropos.client.samples import Sample
from atropos.client.tensors import Layout, MicroBatch, Unpadded, collate, unpadded
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
    layout: Layout = "padded"  # "packed": each pass's sequences end to end in one row


PACKED_ATTENTION = ("flash_attention_2", "flash_attention_3", "flash_attention_4", "flex_attention")
"""Attention implementations (transformers' names) that run a packed row's sequences as
separate sequences without a dense mask: packing saves their padding's compute. Others (sdpa,
eager) take a packed row through a ``[T, T]`` mask, whose attention costs more than padding."""


def pass_layout(asked: str, model: Any, loss: str) -> Layout:
    """The layout of the step's passes: `asked` ("padded" or "packed"), or for "auto" packed
    where the model's attention takes packed rows (`PACKED_ATTENTION`) and the loss is GRPO
    (OPD reads the student's logits per sequence, which a packed pass lays out padded again:
    a copy of the logits), else padded."""
    if asked == "auto":
        attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
        asked = "packed" if attention in PACKED_ATTENTION and loss == "grpo" else "padded"
    return "packed" if asked == "packed" else "padded"


@dataclass
class Tally:
    """A step's sums, per rank, then merged: the loss (already a batch mean), token-weighted
    ratio, clip fraction, KL and the loss's own metrics, and the logprob gaps per sequence.

    During the step the sums are tensors on the device (`add`, `add_gaps`): nothing is read
    back between passes, so the host never waits for the GPU mid-step. `settle` reads them all
    in one transfer, after the optimizer step; from then on they are floats (what `merged`
    and the metrics take)."""

    loss: float = 0.0
    ratio: float = 0.0
    clip: float = 0.0
    kl: float = 0.0
    tokens: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)
    gaps_on: list[float] = field(default_factory=list)  # sequences of exactly this policy
    gaps_all: list[float] = field(default_factory=list)
    _sums: dict[str, torch.Tensor] = field(default_factory=dict, repr=False)
    _gaps: list[tuple[torch.Tensor, list[int | None]]] = field(default_factory=list, repr=False)

    def add(self, loss: torch.Tensor, stats: LossStats) -> None:
        """One pass's loss (its share of the batch mean) and stats, as device tensors."""
        n = stats.tokens
        parts = {"loss": loss, "ratio": stats.mean_ratio * n, "clip": stats.clip_fraction * n}
        parts |= {"kl": stats.kl * n, "tokens": n}
        parts |= {f"extra:{key}": value * n for key, value in stats.extra.items()}
        for key, value in parts.items():
            held = self._sums.get(key)
            self._sums[key] = value.detach().float() if held is None else held + value.detach()

    def add_gaps(self, sums_and_counts: torch.Tensor, versions: list[int | None]) -> None:
        """One pass's per-sequence gap sums and counts (``[2, B]``), with their versions."""
        self._gaps.append((sums_and_counts.detach().float(), versions))

    def settle(self, step: int) -> None:
        """Read the step's tensors into the floats, in one transfer (`step`: the policy
        version trained, for `gaps_on`)."""
        keys = list(self._sums)
        tensors = [self._sums[k].reshape(1) for k in keys] + [g.reshape(-1) for g, _ in self._gaps]
        values = torch.cat(tensors).tolist() if tensors else []
        for key, value in zip(keys, values, strict=False):
            if key.startswith("extra:"):
                self.extra[key[6:]] = self.extra.get(key[6:], 0.0) + value
            else:
                setattr(self, key, getattr(self, key) + value)
        at = len(keys)
        for gaps, versions in self._gaps:
            width = gaps.shape[1]
            sums, counts = values[at : at + width], values[at + width : at + 2 * width]
            at += 2 * width
            for total, count, version in zip(sums, counts, versions, strict=True):
                if count:
                    self.gaps_all.append(total / count)
                    if version == step:
                        self.gaps_on.append(total / count)
        self._sums, self._gaps = {}, []

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


@dataclass
class Pass:
    """One forward/backward's tensors, already on the device: the padded micro-batch, its
    packed row when the layout is packed, and its share of the batch mean."""

    mb: MicroBatch
    packed: Unpadded | None
    share: float


def prepare(samples: Sequence[Sample], settings: StepSettings, ranks: Ranks) -> list[Pass | None]:
    """This rank's passes (None: an idle pass), collated and on the device before the first
    forward, so no copy is made between passes (a plain copy to a GPU waits for its stream)."""
    passes: list[Pass | None] = []
    for chunk in my_micro_batches(samples, settings.micro_batch_size, ranks):
        if chunk is None:
            passes.append(None)
            continue
        mb = collate(chunk, settings.pad_id)
        row = unpadded(mb) if settings.layout == "packed" else None
        if row is not None:
            row = _moved(
                row, ranks.device, "input_ids", "targets", "position_ids", "back", "cu_seqlens"
            )
        teacher = mb.teacher
        if teacher is not None:
            teacher = _moved(teacher, ranks.device, "ids", "logprobs", "valid")
        names = ("input_ids", "targets", "old_logp", "has_old", "advantages")
        mb = replace(_moved(mb, ranks.device, *names), teacher=teacher)
        passes.append(Pass(mb, row, len(chunk) / len(samples)))
    return passes


def _moved(holder: Any, device: torch.device, *names: str) -> Any:
    """`holder` (a dataclass) with its tensors `names` on `device`: to a GPU from pinned
    memory, asynchronously (PyTorch's `non_blocking` copy; a plain one synchronises the
    stream), elsewhere a plain `to`."""
    if device.type == "cuda":
        moved = {n: getattr(holder, n).pin_memory().to(device, non_blocking=True) for n in names}
    else:
        moved = {n: getattr(holder, n).to(device) for n in names}
    return replace(holder, **moved)


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
    gives the step's). `step` is the policy version being trained (for the logprob gaps).

    Between the first forward and the optimizer step nothing reads a value back from the
    device (tests/trainer/test_step.py counts the reads): the batch is on the device before,
    and the step's numbers are read once, after."""
    model.train()
    tally = Tally()
    for one in prepare(samples, settings, ranks):
        if one is None:
            _idle_pass(model, settings.pad_id, ranks.device)
            continue
        loss, stats, logp, old = _micro_loss(model, reference, one, settings)
        scaled: torch.Tensor = loss * (one.share * ranks.world)  # FSDP divides the sum by N
        scaled.backward()  # type: ignore[no-untyped-call]
        tally.add(loss.detach() * one.share, stats)
        tally.add_gaps(_gaps(logp, old, one.mb.has_old), one.mb.policy_versions)
    norm = torch.nn.utils.clip_grad_norm_(params, settings.max_grad_norm)
    opt.step()
    opt.zero_grad(set_to_none=True)
    tally.settle(step)
    return grad_norm_value(norm), tally


def _logprobs(model: Any, one: Pass) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's logits and its logprobs of the targets, padded ``[B, L]`` (a packed pass
    runs the model on its row and lays the logprobs out padded: the loss is the same code)."""
    if one.packed is None:
        logits = model(input_ids=one.mb.input_ids, use_cache=False).logits
        return logits, token_logprobs(logits, one.mb.targets)
    row = one.packed
    logits = model(
        input_ids=row.input_ids,
        position_ids=row.position_ids,
        use_cache=False,
        **row.attention_kwargs(),
    ).logits
    return logits, row.padded(token_logprobs(logits, row.targets))


def _micro_loss(
    model: Any, reference: Any, one: Pass, settings: StepSettings
) -> tuple[torch.Tensor, LossStats, torch.Tensor, torch.Tensor]:
    """The micro-batch's loss (its mean over sequences), stats, and the trainer's and the
    server's logprobs (detached) for the mismatch metric."""
    mb = one.mb
    logits, logp = _logprobs(model, one)
    if one.packed is not None and settings.loss == "opd":
        logits = one.packed.padded(logits)  # [B, L, V]: the teacher's top-k are per sequence
    old = torch.where(mb.has_old, mb.old_logp, logp.detach())
    ref = None
    if reference is not None:
        with torch.no_grad():
            ref = _logprobs(reference, one)[1]
    mask = mb.mask
    if settings.loss == "opd" and mb.teacher is not None:
        loss, stats = opd_loss(
            settings.opd_mode, logits=logits, logp=logp, old_logp=old,
            env_advantages=mb.advantages, targets=mb.targets, mask=mask, teacher=mb.teacher,
            reward_coef=settings.opd_reward_coef, clip_eps=settings.clip_eps, ref_logp=ref,
            kl_coef=settings.kl_coef,
        )  # fmt: skip
    else:
        loss, stats = policy_loss(
            logp, old, mb.advantages, mask, settings.clip_eps, ref, settings.kl_coef
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


def _gaps(logp: torch.Tensor, old: torch.Tensor, has_old: torch.Tensor) -> torch.Tensor:
    """Per sequence, the sum of |trainer - inference| logprob over its trained tokens with a
    server value, and how many there are (``[2, B]``): `Tally.settle` divides them, and keeps
    in `gaps_on` the sequences the server says it generated with exactly the weights being
    trained (`policy_version == step`), where the two numbers must agree up to arithmetic
    noise."""
    gap = (logp - old).abs() * has_old
    return torch.stack([gap.sum(dim=1), has_old.sum(dim=1).to(gap.dtype)])

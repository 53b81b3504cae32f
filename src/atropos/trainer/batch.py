"""Samples to padded training tensors: one `Sample` per sequence, `collate` into a `MicroBatch`.

Alignment, for one sequence of ``n`` tokens with masks ``m`` (token id where trained, -100 where
not) and inference logprobs ``q`` (1.0 where not generated)::

    input_ids[j] = tokens[j]        j = 0 .. n-2
    targets[j]   = m[j + 1]         the token predicted at position j, or -100
    old_logp[j]  = q[j + 1]         the server's logprob of that same token

Teacher logprobs (`--loss opd`) are shifted like the targets, as `distill.TeacherTopK`::

    teacher.ids[j, k] = distill_token_ids[j + 1][k]      the teacher's top-k for targets[j]

This module needs torch alone (no wire or inference imports), so a benchmark on a bare GPU
machine builds the trainer's real micro-batches from it (benchmarks/trainer_gpu.py); `data.py`
makes samples from the API's groups.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from atropos.trainer.distill import TeacherTopK
from atropos.trainer.loss import IGNORE

MISSING = -9999.0
"""The inference layer's "server sent no logprob" marker (`atropos.inference.base.MISSING_LOGPROB`,
equal by test)."""


@dataclass
class Sample:
    """One trainable sequence and where it came from."""

    tokens: list[int]
    masks: list[int]
    old_logprobs: list[float] | None
    advantages: list[float]  # one per token (same length as `tokens`)
    score: float
    policy_version: int | None
    env_id: int | None
    teacher_ids: list[list[int]] | None = None  # per token: the teacher's top-k ids
    teacher_logprobs: list[list[float]] | None = None  # ... and their logprobs


@dataclass
class MicroBatch:
    """Right-padded tensors of a few samples (``[B, L]`` each) plus per-sample metadata."""

    input_ids: torch.Tensor
    targets: torch.Tensor
    old_logp: torch.Tensor
    has_old: torch.Tensor  # bool [B, L]: the server gave a logprob for this target
    advantages: torch.Tensor
    policy_versions: list[int | None]
    teacher: TeacherTopK | None = None  # with teacher logprobs asked for

    @property
    def mask(self) -> torch.Tensor:
        return self.targets != IGNORE


def collate(samples: Sequence[Sample], pad_id: int = 0) -> MicroBatch:
    """Pad samples on the right into one `MicroBatch` (see the module docstring for alignment)."""
    width = max(len(s.tokens) for s in samples) - 1
    b = len(samples)
    input_ids = torch.full((b, width), pad_id, dtype=torch.long)
    targets = torch.full((b, width), IGNORE, dtype=torch.long)
    old = torch.zeros((b, width), dtype=torch.float32)
    has_old = torch.zeros((b, width), dtype=torch.bool)
    adv = torch.zeros((b, width), dtype=torch.float32)
    for row, s in enumerate(samples):
        n = len(s.tokens) - 1
        if n <= 0:
            continue
        input_ids[row, :n] = torch.tensor(s.tokens[:-1])
        targets[row, :n] = torch.tensor(s.masks[1:])
        adv[row, :n] = torch.tensor(s.advantages[1:])
        if s.old_logprobs is not None:
            q = torch.tensor(s.old_logprobs[1:], dtype=torch.float32)
            ok = (q <= 0.0) & (q > MISSING)  # the marker and anything below it: no logprob
            old[row, :n] = torch.where(ok, q, torch.zeros_like(q))
            has_old[row, :n] = ok
    has_old &= targets != IGNORE
    return MicroBatch(
        input_ids=input_ids,
        targets=targets,
        old_logp=old,
        has_old=has_old,
        advantages=adv,
        policy_versions=[s.policy_version for s in samples],
        teacher=collate_teacher(samples, targets),
    )


def collate_teacher(samples: Sequence[Sample], targets: torch.Tensor) -> TeacherTopK | None:
    """The samples' teacher top-k as ``[B, T, K]`` tensors aligned with `targets` (None when
    the samples carry none). K is the most entries any trained position has; an entry is
    valid where it exists, its target is trained and its logprob is a real one (above the
    "no logprob" marker)."""
    if not samples or any(s.teacher_ids is None or s.teacher_logprobs is None for s in samples):
        return None
    b, width = targets.shape
    trained = targets != IGNORE
    positions = [trained[row].nonzero().flatten().tolist() for row in range(b)]
    rows = [
        ([s.teacher_ids[j + 1] for j in at], [s.teacher_logprobs[j + 1] for j in at])
        for s, at in zip(samples, positions, strict=True)
        if s.teacher_ids is not None and s.teacher_logprobs is not None
    ]
    k = max((len(top) for top_ids, _ in rows for top in top_ids), default=1) or 1
    ids = torch.zeros((b, width, k), dtype=torch.long)
    lps = torch.full((b, width, k), MISSING, dtype=torch.float32)
    for row, (at, (top_ids, top_lps)) in enumerate(zip(positions, rows, strict=True)):
        if at:  # one tensor per row: the trained positions' entries, padded to k
            ids[row, at] = torch.tensor([t + [0] * (k - len(t)) for t in top_ids])
            lps[row, at] = torch.tensor([p + [MISSING] * (k - len(p)) for p in top_lps])
    valid = (lps > MISSING) & trained.unsqueeze(-1)
    return TeacherTopK(ids=ids, logprobs=lps, valid=valid)


def micro_batches(samples: Sequence[Sample], size: int, pad_id: int = 0) -> Iterator[MicroBatch]:
    """Consecutive chunks of `size` samples, each collated."""
    for start in range(0, len(samples), size):
        yield collate(samples[start : start + size], pad_id)

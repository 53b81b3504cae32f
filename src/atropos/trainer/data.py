"""From a batch of scored groups (the API's `/batch`) to padded training tensors.

Alignment, for one sequence of ``n`` tokens with masks ``m`` (token id where trained, -100 where
not) and inference logprobs ``q`` (1.0 where not generated)::

    input_ids[j] = tokens[j]        j = 0 .. n-2
    targets[j]   = m[j + 1]         the token predicted at position j, or -100
    old_logp[j]  = q[j + 1]         the server's logprob of that same token

Advantages come from `rewards.group.group_advantages` over each group's scores, unless the group
carries per-token `advantages` (then those are used, shifted like the targets), and are forced
to 0 where `overrides[i].set_advantage_to_zero` is set. A sequence without inference logprobs (an
environment that only retokenised text) is trained on-policy: its old logprobs are the trainer's
own, detached (ratio 1), and the step's metrics count it.

With teacher logprobs asked for (`--loss opd`, `samples_from_groups(..., teacher=True)`), every
group must carry `distill_token_ids` / `distill_logprobs` (one entry per token, as
`atropos.envs.teacher` writes them; else `MissingTeacher`), and the micro-batch holds them
shifted like the targets, as `distill.TeacherTopK`::

    teacher.ids[j, k] = distill_token_ids[j + 1][k]      the teacher's top-k for targets[j]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from atropos.inference.base import MISSING_LOGPROB
from atropos.rewards.group import group_advantages
from atropos.trainer.distill import TeacherTopK
from atropos.trainer.loss import IGNORE
from atropos.wire import Group

MISSING = MISSING_LOGPROB  # the inference layer's "server sent no logprob" marker (-9999.0)


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


class MissingTeacher(ValueError):
    """`--loss opd` got a group without teacher logprobs, or with rows that do not line up."""


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


def samples_from_groups(
    groups: Iterable[Group], max_len: int, teacher: bool = False
) -> list[Sample]:
    """Flatten groups (as `atropos.wire` decodes them) into samples, computing each sequence's
    advantages; with `teacher`, keep each sequence's teacher logprobs (`MissingTeacher` when a
    group has none).

    Sequences longer than ``max_len + 1`` tokens are cut to that length (the API should have
    refused them; this keeps one bad row from breaking a step).
    """
    out: list[Sample] = []
    for group in groups:
        top_ids = top_lps = None
        if teacher:
            check_teacher_rows(group)
            top_ids, top_lps = group.distill_token_ids, group.distill_logprobs
        tokens, masks, scores = group.tokens, group.masks, group.scores
        per_token = group.advantages
        inference = group.inference_logprobs
        overrides = group.overrides or []
        seq_adv = group_advantages(scores)
        for i, (toks, msk) in enumerate(zip(tokens, masks, strict=True)):
            if per_token is not None:
                adv = [float(a) for a in per_token[i]]
            else:
                adv = [seq_adv[i]] * len(toks)
            if i < len(overrides) and (overrides[i] or {}).get("set_advantage_to_zero"):
                adv = [0.0] * len(toks)
            old = inference[i] if inference is not None else None
            keep = max_len + 1
            out.append(
                Sample(
                    tokens=list(toks[:keep]),
                    masks=list(msk[:keep]),
                    old_logprobs=None if old is None else [float(x) for x in old[:keep]],
                    advantages=adv[:keep],
                    score=float(scores[i]),
                    policy_version=group.policy_version,
                    env_id=group.env_id,
                    teacher_ids=None if top_ids is None else top_ids[i][:keep],
                    teacher_logprobs=None if top_lps is None else top_lps[i][:keep],
                )
            )
    return out


def check_teacher_rows(group: Group) -> None:
    """Raise `MissingTeacher` unless `group` has teacher logprobs lined up with its tokens: one
    row per sequence, one entry per token, as many ids as logprobs at every position."""
    ids, lps = group.distill_token_ids, group.distill_logprobs
    origin = f"a group from env {group.env_id}" if group.env_id is not None else "a group"
    if ids is None or lps is None:
        raise MissingTeacher(
            f"--loss opd: {origin} has no teacher logprobs (distill_token_ids,"
            " distill_logprobs); run its environment with a teacher (--teacher.base_url URL,"
            " docs/environments.md) or train with --loss grpo"
        )
    for i, seq in enumerate(group.tokens):
        row_ids, row_lps = ids[i], lps[i]
        if len(row_ids) != len(seq) or len(row_lps) != len(seq):
            raise MissingTeacher(
                f"--loss opd: {origin}: sequence {i} has {len(seq)} tokens but"
                f" {len(row_ids)} distill_token_ids and {len(row_lps)} distill_logprobs"
                " positions (one per token expected)"
            )
        if any(len(a) != len(b) for a, b in zip(row_ids, row_lps, strict=True)):
            raise MissingTeacher(
                f"--loss opd: {origin}: sequence {i} has positions whose distill_token_ids and"
                " distill_logprobs differ in length"
            )


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

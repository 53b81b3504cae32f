"""From a batch of scored groups (the API's `/batch`) to samples: one `Sample` per sequence.

Advantages come from `rewards.group.group_advantages` over each group's scores, unless the group
carries per-token `advantages` (then those are used, shifted like the targets), and are forced
to 0 where `overrides[i].set_advantage_to_zero` is set. A sequence without inference logprobs (an
environment that only retokenised text) is trained on-policy: its old logprobs are the trainer's
own, detached (ratio 1), and the step's metrics count it.

With teacher logprobs asked for (`--loss opd`, `samples_from_groups(..., teacher=True)`), every
group must carry `distill_token_ids` / `distill_logprobs` (one entry per token, as
`atropos.envs.teacher` writes them; else `MissingTeacher`).

The samples become tensors in `tensors.py` (`collate`, `pack`, `micro_batches`; the alignment of
tokens, targets and logprobs is written there). Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from atropos.rewards.group import group_advantages
from atropos.wire import Group

__all__ = ["MISSING", "MissingTeacher", "Sample", "check_teacher_rows", "samples_from_groups"]

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


class MissingTeacher(ValueError):
    """`--loss opd` got a group without teacher logprobs, or with rows that do not line up."""


def samples_from_groups(
    groups: Iterable[Group], max_len: int | None = None, teacher: bool = False
) -> list[Sample]:
    """Flatten groups (as `atropos.wire` decodes them) into samples, computing each sequence's
    advantages; with `teacher`, keep each sequence's teacher logprobs (`MissingTeacher` when a
    group has none).

    Sequences longer than ``max_len + 1`` tokens are cut to that length (the API should have
    refused them; this keeps one bad row from breaking a step); None: no cut.
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
            keep = None if max_len is None else max_len + 1
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

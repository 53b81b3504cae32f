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
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch

from atropos.inference.base import MISSING_LOGPROB
from atropos.rewards.group import group_advantages
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


@dataclass
class MicroBatch:
    """Right-padded tensors of a few samples (``[B, L]`` each) plus per-sample metadata."""

    input_ids: torch.Tensor
    targets: torch.Tensor
    old_logp: torch.Tensor
    has_old: torch.Tensor  # bool [B, L]: the server gave a logprob for this target
    advantages: torch.Tensor
    policy_versions: list[int | None]

    @property
    def mask(self) -> torch.Tensor:
        return self.targets != IGNORE


def samples_from_groups(groups: Iterable[Group], max_len: int) -> list[Sample]:
    """Flatten groups (as `atropos.wire` decodes them) into samples, computing each sequence's
    advantages.

    Sequences longer than ``max_len + 1`` tokens are cut to that length (the API should have
    refused them; this keeps one bad row from breaking a step).
    """
    out: list[Sample] = []
    for group in groups:
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
                )
            )
    return out


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
    )


def micro_batches(samples: Sequence[Sample], size: int, pad_id: int = 0) -> Iterator[MicroBatch]:
    """Consecutive chunks of `size` samples, each collated."""
    for start in range(0, len(samples), size):
        yield collate(samples[start : start + size], pad_id)

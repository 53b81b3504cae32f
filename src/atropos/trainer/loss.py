"""The GRPO loss as pure functions: token log-probabilities, clipped policy loss, the
per-sequence mean. (On-policy distillation's loss, built on these: `distill.py`.)

Nothing here talks to the network or the file system, so each function is tested against numbers
worked out by hand (tests/trainer/test_loss.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from atropos.client.tensors import IGNORE  # label of a token that is not trained


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log p(target_t | prefix)`` for every position; 0 where the target is `IGNORE`.

    `logits` is ``[B, T, V]`` (already divided by any sampling temperature), `targets` ``[B, T]``.
    Computed as ``-cross_entropy`` in float32, which is the same number as
    ``log_softmax(logits).gather(target)`` without materialising the full log-softmax.
    """
    flat = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=IGNORE,
        reduction="none",
    )
    return -flat.view(targets.shape)


@dataclass
class LossStats:
    """What one loss evaluation saw (plain floats, for the step's metrics)."""

    mean_ratio: float
    clip_fraction: float
    kl: float
    tokens: int
    extra: dict[str, float] = field(default_factory=dict)  # a loss's own, per trained token


def sequence_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``mean_i( sum_t(mask * x) / sum_t(mask) )``: each sequence's mean over its trained
    tokens, then the mean over sequences; a sequence with no trained token contributes 0.

    >>> sequence_mean(torch.tensor([[1.0, 3.0], [5.0, 7.0]]), torch.tensor([[1, 1], [0, 1]]))
    tensor(4.5000)
    """
    weights = mask.to(per_token.dtype)
    counts = weights.sum(dim=1)
    return ((per_token * weights).sum(dim=1) / counts.clamp(min=1.0)).mean()


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, LossStats]:
    """Token-level PPO-clip loss with GRPO advantages and an optional KL penalty.

    For every trained token ``t`` (``mask == 1``) of sequence ``i``::

        ratio_t = exp(logp_t - old_logp_t)              # old_logp: the inference server's
        L_t     = -min(ratio_t * A_t, clip(ratio_t, 1 - eps, 1 + eps) * A_t)
                  + kl_coef * (exp(ref_t - logp_t) - (ref_t - logp_t) - 1)   # k3 estimator, >= 0
        loss    = mean_i( sum_t(mask * L_t) / sum_t(mask) )                  # per-sequence mean

    The ``min`` is the textbook pessimistic bound for *both* signs of ``A``: a token with a
    negative advantage whose ratio already exceeds ``1 + eps`` keeps its (unclipped) gradient.
    (atroposlib's example trainer takes the ``max`` for negative advantages, which removes exactly
    that gradient; we do not copy it.)

    Shapes: `logp`, `old_logp`, `mask`, `ref_logp` are ``[B, T]``; `advantages` is ``[B, T]`` or
    ``[B, 1]`` (one advantage per sequence, broadcast over its tokens). A sequence with no
    trained token contributes 0.
    """
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    kl = torch.zeros_like(logp)
    if ref_logp is not None and kl_coef:
        delta = ref_logp - logp
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + kl_coef * kl
    loss = sequence_mean(per_token, mask)
    with torch.no_grad():
        n = float(mask.sum())
        outside = ((ratio < 1.0 - clip_eps) | (ratio > 1.0 + clip_eps)).to(mask.dtype)
        stats = LossStats(
            mean_ratio=float((ratio * mask).sum()) / max(n, 1.0),
            clip_fraction=float((outside * mask).sum()) / max(n, 1.0),
            kl=float((kl * mask).sum()) / max(n, 1.0),
            tokens=int(n),
        )
    return loss, stats

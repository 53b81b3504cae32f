"""The GRPO loss as pure functions: token log-probabilities, clipped policy loss, the
per-sequence mean. (On-policy distillation's loss, built on these: `distill.py`.)

Nothing here talks to the network or the file system, so each function is tested against numbers
worked out by hand (tests/trainer/test_loss.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from atropos.client.tensors import IGNORE  # label of a token that is not trained

CHUNK_ELEMENTS = 1 << 24
"""How many logits `token_logprobs` turns to float32 at once (64 MiB): the rows of a chunk."""


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, chunk_elements: int = CHUNK_ELEMENTS
) -> torch.Tensor:
    """``log p(target_t | prefix)`` for every position; 0 where the target is `IGNORE`.

    `logits` is ``[..., V]`` (already divided by any sampling temperature), `targets` its
    shape without ``V``. Computed in float32 over chunks of positions (`chunk_elements` logits
    at a time), forward and backward, so neither a float32 copy of the logits nor their
    log-softmax is ever whole in memory: ``z[target] - logsumexp(z)`` forward, and
    ``g * (onehot(target) - softmax(z))`` backward, written in the logits' own dtype. The
    numbers are ``F.cross_entropy``'s in float32 (tests/trainer/test_step.py); what it saves
    is two ``[positions, V]`` float32 tensors (with bf16 logits: a copy and the saved
    log-softmax, 1 GiB each at 8 x 1,024 positions of a 32k vocabulary) and their passes.
    Nothing reads a value back to the host (no mask indexing), so no pass waits for the GPU.

    >>> z = torch.tensor([[[0.0, 0.0], [2.0, 0.0]]])
    >>> token_logprobs(z, torch.tensor([[1, -100]]))
    tensor([[-0.6931,  0.0000]])
    """
    rows = max(1, chunk_elements // max(1, logits.shape[-1]))
    out: torch.Tensor = _TokenLogprobs.apply(logits, targets, rows)  # type: ignore[no-untyped-call]
    return out


class _TokenLogprobs(torch.autograd.Function):
    """`token_logprobs`' forward and backward, chunk by chunk (see there), through one float32
    buffer of a chunk's size: a fresh tensor of that size per chunk costs, on a CPU, its pages
    faulted in each time (as much as the arithmetic)."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, rows: int) -> torch.Tensor:
        flat = logits.reshape(-1, logits.shape[-1])
        ignored = targets.reshape(-1) == IGNORE
        picks = targets.reshape(-1).masked_fill(ignored, 0).unsqueeze(1)
        lse = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
        out = torch.empty_like(lse)
        buffer = _buffer(flat, rows)
        for start in range(0, flat.shape[0], rows):
            chunk = flat[start : start + rows]
            work = buffer[: chunk.shape[0]]
            top = chunk.amax(dim=-1, keepdim=True).float()  # logsumexp, stable, in `work`
            torch.sub(chunk, top, out=work).exp_()
            lse[start : start + rows] = work.sum(dim=-1).log_().add_(top.squeeze(1))
            out[start : start + rows] = chunk.gather(1, picks[start : start + rows]).squeeze(1)
        out.sub_(lse).masked_fill_(ignored, 0.0)
        ctx.save_for_backward(logits, picks, ignored, lse)
        ctx.rows = rows
        return out.view(targets.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        logits, picks, ignored, lse = ctx.saved_tensors
        flat = logits.reshape(-1, logits.shape[-1])
        g = grad.reshape(-1).float().masked_fill(ignored, 0.0).unsqueeze(1)
        dz = torch.empty_like(flat)
        direct = flat.dtype == torch.float32  # else a float32 buffer, copied into dz's dtype
        buffer = None if direct else _buffer(flat, ctx.rows)
        for start in range(0, flat.shape[0], ctx.rows):
            end = start + ctx.rows
            work = dz[start:end] if buffer is None else buffer[: dz[start:end].shape[0]]
            torch.sub(flat[start:end], lse[start:end].unsqueeze(1), out=work).exp_()  # softmax
            work.mul_(g[start:end].neg()).scatter_add_(1, picks[start:end], g[start:end])
            if buffer is not None:
                dz[start:end] = work
        return dz.view(logits.shape), None, None


def _buffer(flat: torch.Tensor, rows: int) -> torch.Tensor:
    """A float32 scratch tensor of one chunk of `flat`'s rows."""
    shape = (min(rows, flat.shape[0]), flat.shape[1])
    return torch.empty(shape, dtype=torch.float32, device=flat.device)


@dataclass
class LossStats:
    """What one loss evaluation saw, as 0-dim tensors on the loss's device: the step reads them
    (`Tally.settle`) once, after its last pass, so no pass waits for the device to answer."""

    mean_ratio: torch.Tensor
    clip_fraction: torch.Tensor
    kl: torch.Tensor
    tokens: torch.Tensor  # trained tokens, a float
    extra: dict[str, torch.Tensor] = field(default_factory=dict)  # a loss's own, per trained token


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
        n = mask.sum()
        per = n.clamp(min=1.0)
        outside = ((ratio < 1.0 - clip_eps) | (ratio > 1.0 + clip_eps)).to(mask.dtype)
        stats = LossStats(
            mean_ratio=(ratio * mask).sum() / per,
            clip_fraction=(outside * mask).sum() / per,
            kl=(kl * mask).sum() / per,
            tokens=n,
        )
    return loss, stats

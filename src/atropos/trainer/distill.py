"""On-policy distillation (`atropos train --loss opd`) as pure functions, formulas included.

The student samples (the environments' rollouts); a teacher scores the student's own tokens
(`atropos.envs.teacher`: the teacher's top-k logprobs at every position, in the group's
`distill_token_ids` / `distill_logprobs`); the trainer moves the student toward the teacher on
the tokens the student actually produced. Only completion positions count (targets that are
not `IGNORE`); the teacher's entries at position ``t + 1`` of a sequence are its distribution
over the token the trainer predicts at input position ``t`` (the same shift as the targets).

Two modes (`--opd-mode`):

- ``reverse`` (default): the per-token advantage is the one-sample estimate of the reverse KL
  to the teacher on the sampled token ``y_t``::

      A_t = log p_T(y_t) - log p_old(y_t)

  (``p_old``: the inference server's logprob, the behaviour policy), fed to the same clipped
  policy-gradient loss as GRPO (`loss.policy_loss`). Its expectation under the student is
  ``-KL(p_S || p_T)``, so maximising it minimises the reverse KL. When ``y_t`` is not among
  the teacher's top-k, ``log p_T(y_t)`` is unknown but at most the k-th logprob; it is taken
  *as* the k-th logprob (an upper bound: such a token is pushed down at least as hard as the
  teacher's least likely top-k token). A position with no teacher entries gets ``A_t = 0``.

- ``topk_forward``: the forward KL over the teacher's top-k at each completion position, both
  distributions renormalised over those k tokens, with the student's live (differentiable)
  logits ``z``::

      pT_k = exp(lT_k) / sum_j exp(lT_j)          lT: the teacher's top-k logprobs
      pS_k = exp(z_k)  / sum_j exp(z_j)            z restricted to the same k ids
      L_t  = sum_k pT_k * (log pT_k - log pS_k)

  then the mean over each sequence's completion tokens and over the sequences (as GRPO's).

`--opd-reward-coef c` (default 0: pure distillation) adds the environment's own signal:
``reverse`` uses ``A_t + c * A_env``; ``topk_forward`` adds ``policy_loss`` with advantages
``c * A_env``. Both keep `--kl-coef`'s penalty to the starting weights (inside `policy_loss`).
"""

from __future__ import annotations

from typing import Literal

import torch

from atropos.client.tensors import TeacherTopK
from atropos.trainer.loss import LossStats, policy_loss, sequence_mean

OpdMode = Literal["reverse", "topk_forward"]

_FAR = -1e9  # stands in for "no entry" before a softmax: exp(_FAR - max) is exactly 0


def teacher_logprob_of(
    targets: torch.Tensor, teacher: TeacherTopK
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``log p_T(y_t)`` of each target, with the k-th-logprob floor for a target outside the
    teacher's top-k (see the module docstring).

    Returns ``(logprob, found, known)``, each ``[B, T]``: the teacher's logprob of the target
    (0 where it has no entries), whether the target is among the top-k, and whether the
    position has any teacher entry at all.
    """
    hit = (teacher.ids == targets.unsqueeze(-1)) & teacher.valid
    found = hit.any(dim=-1)
    known = teacher.valid.any(dim=-1)
    exact = torch.where(hit, teacher.logprobs, torch.zeros_like(teacher.logprobs)).sum(dim=-1)
    lowest = torch.where(teacher.valid, teacher.logprobs, torch.full_like(teacher.logprobs, 1.0))
    floor = lowest.min(dim=-1).values
    logprob = torch.where(found, exact, torch.where(known, floor, torch.zeros_like(floor)))
    return logprob, found, known


def reverse_kl_advantages(
    teacher_logp: torch.Tensor, old_logp: torch.Tensor, known: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """``A_t = log p_T(y_t) - log p_old(y_t)`` where the target is trained and the teacher has
    entries, 0 elsewhere; detached (an advantage is a constant of the loss)."""
    keep = known & mask
    return torch.where(keep, teacher_logp - old_logp, torch.zeros_like(old_logp)).detach()


def topk_forward_kl(
    logits: torch.Tensor, teacher: TeacherTopK, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The renormalised top-k forward KL ``L_t`` of every position (the module docstring's
    formula; 0 where the target is not trained or the teacher has no entries), and its loss:
    the mean over each sequence's trained tokens, then over the sequences.

    `logits` is ``[B, T, V]`` (the student's, live), `teacher` ``[B, T, K]``, `mask` ``[B, T]``.
    """
    valid = teacher.valid & mask.unsqueeze(-1)
    far = torch.full_like(teacher.logprobs, _FAR)
    teacher_log = torch.log_softmax(torch.where(valid, teacher.logprobs.float(), far), dim=-1)
    chosen = logits.gather(-1, teacher.ids).float()  # the K entries, not a float copy of all
    student_log = torch.log_softmax(torch.where(valid, chosen, far.to(chosen.dtype)), dim=-1)
    terms = teacher_log.exp() * (teacher_log - student_log)
    per_token = torch.where(valid, terms, torch.zeros_like(terms)).sum(dim=-1)
    trained = valid.any(dim=-1)
    return per_token, sequence_mean(per_token, trained)


def opd_loss(
    mode: OpdMode,
    *,
    logits: torch.Tensor,
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    env_advantages: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    teacher: TeacherTopK,
    reward_coef: float = 0.0,
    clip_eps: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, LossStats]:
    """The `--loss opd` loss of one micro-batch, in `mode` (module docstring), and its stats.

    `logp` / `old_logp` / `targets` / `mask` are ``[B, T]`` as for `policy_loss`;
    `env_advantages` the environment's (GRPO) advantages, ``[B, T]`` or ``[B, 1]``. Beside
    `policy_loss`'s stats, ``stats.extra`` has ``reverse_kl`` (the mean of
    ``log p_old - log p_T`` over trained tokens the teacher scored: the sampled estimate of
    KL(student || teacher)), ``teacher_topk_share`` (the share of trained tokens in the
    teacher's top-k) and, in ``topk_forward``, ``forward_kl`` (the mean ``L_t``).
    """
    mask = mask.bool()
    teacher_logp, found, known = teacher_logprob_of(targets, teacher)
    reverse = reverse_kl_advantages(teacher_logp, old_logp, known, mask)
    if mode == "reverse":
        advantages = reverse + reward_coef * env_advantages
        loss, stats = policy_loss(logp, old_logp, advantages, mask, clip_eps, ref_logp, kl_coef)
        forward = None
    else:
        advantages = reward_coef * env_advantages
        pg, stats = policy_loss(logp, old_logp, advantages, mask, clip_eps, ref_logp, kl_coef)
        per_token, forward = topk_forward_kl(logits, teacher, mask)
        loss = forward + pg
    with torch.no_grad():  # tensors, read once the step is done (`LossStats`)
        scored = (known & mask).float()
        n = scored.sum().clamp(min=1.0)
        stats.extra["reverse_kl"] = (-reverse * scored).sum() / n
        trained = mask.float().sum().clamp(min=1.0)
        stats.extra["teacher_topk_share"] = (found & mask).float().sum() / trained
        if forward is not None:
            stats.extra["forward_kl"] = (per_token * scored).sum() / n
    return loss, stats

"""Turn-level credit for multi-turn episodes: MT-GRPO's per-turn advantages, mapped onto tokens.

A group is G episodes of one item. Episode i has turns k = 0, 1, ... (its replies, or the
stretches of one reply between inserted tool results), each with a turn-level reward
``R^T_{i,k}`` (None: the turn has none, e.g. the final answer), and one outcome reward ``R^O_i``.
MT-GRPO (Zeng et al., 2025, "Reinforcing Multi-Turn Reasoning in LLM Agents via Turn-Level
Credit Assignment", arXiv:2505.11821) normalises each kind of reward within the group, as GRPO
does, and gives the tokens of a turn the outcome advantage plus the turn advantages of that
turn and the later ones::

    Â^O_i    = (R^O_i − mean_j R^O_j) / std_j R^O_j                  over the G episodes
    Â^T_{i,k} = (R^T_{i,k} − mean_j R^T_{j,k}) / std_j R^T_{j,k}     over the episodes with a
                                                                      reward at turn k (0 with
                                                                      fewer than two of them)
    A_{i,k}   = Â^O_i + λ · Σ_{k' ≥ k} γ^(k'−k) · Â^T_{i,k'}

The paper states the rule for two-turn episodes (a tool call, rewarded at its turn, then the
answer) and trains with λ = 1: ``A_{i,1} = Â^O_i + Â^T_i`` and ``A_{i,2} = Â^O_i``, the formula
above with one call. For λ ≠ 1 the weight sits on the turn term, as in the authors' code
(`turn_advantage_coef`, `advantage_est="aae"` in github.com/SiliangZeng/Multi-Turn-RL-Agent),
so λ = 0 is the outcome-only rule. Longer episodes sum the later turns (γ = 1: undiscounted).

`rule="grpo"` is the baseline: every turn gets ``Â^O_i``, GRPO's own per-sequence advantage
(`atropos.rewards.group.group_advantages`, what the trainer computes from the scores).

`token_advantages_by_turn` puts each turn's advantage on the trained tokens of its span, 0.0 on
masked ones, which is the per-token `advantages` row a group carries to the trainer.

>>> rows = turn_advantages([[1.0, None], [0.0, None]], [1.0, 0.0])
>>> rows
[[2.0, 1.0], [-2.0, -1.0]]
>>> token_advantages_by_turn([-100, 5, 6, -100, 7], [(1, 3), (3, 5)], rows[0])
[0.0, 2.0, 2.0, 0.0, 1.0]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from atropos.inference.sequence import MASKED
from atropos.rewards.group import group_advantages

__all__ = [
    "RULES",
    "Rule",
    "normalized",
    "token_advantages_by_turn",
    "turn_advantages",
]

Rule = Literal["mt_grpo", "grpo"]
RULES: tuple[Rule, ...] = ("mt_grpo", "grpo")


def normalized(rewards: Sequence[float]) -> list[float]:
    """Group-normalised rewards, ``(r − mean) / std``; zeros for fewer than two rewards or all
    equal ones (a single reward has nothing to be compared with).

    >>> normalized([1.0, 0.0]), normalized([3.0]), normalized([2.0, 2.0])
    ([1.0, -1.0], [0.0], [0.0, 0.0])
    """
    if len(rewards) < 2:
        return [0.0] * len(rewards)
    return group_advantages(rewards)


def _turn_terms(turn_rewards: Sequence[Sequence[float | None]]) -> list[list[float]]:
    """``Â^T_{i,k}`` for every turn of every episode (0.0 where the turn has no reward)."""
    terms = [[0.0] * len(turns) for turns in turn_rewards]
    depth = max((len(turns) for turns in turn_rewards), default=0)
    for k in range(depth):
        owners = [i for i, turns in enumerate(turn_rewards) if k < len(turns)]
        rated = [i for i in owners if turn_rewards[i][k] is not None]
        values = normalized([float(turn_rewards[i][k] or 0.0) for i in rated])
        for i, value in zip(rated, values, strict=True):
            terms[i][k] = value
    return terms


def turn_advantages(
    turn_rewards: Sequence[Sequence[float | None]],
    outcomes: Sequence[float],
    rule: Rule = "mt_grpo",
    turn_coef: float = 1.0,
    discount: float = 1.0,
) -> list[list[float]]:
    """Each episode's per-turn advantages (see the module docstring for the formula).

    Args:
        turn_rewards: per episode, one entry per turn: its turn-level reward, or None.
        outcomes: per episode, the outcome reward.
        rule: "mt_grpo" (outcome plus turn advantages) or "grpo" (the outcome's only).
        turn_coef: λ, the weight of the turn advantages.
        discount: γ, the weight of a later turn's advantage per turn of distance.

    Raises:
        ValueError: the two lists differ in length, or `rule` is unknown.
    """
    if len(turn_rewards) != len(outcomes):
        raise ValueError(
            f"{len(turn_rewards)} episodes of turn rewards but {len(outcomes)} outcomes"
        )
    if rule not in RULES:
        raise ValueError(f"unknown credit rule {rule!r}; choose from {RULES}")
    outcome = group_advantages([float(o) for o in outcomes]) if outcomes else []
    if rule == "grpo":
        return [[a] * len(turns) for a, turns in zip(outcome, turn_rewards, strict=True)]
    rows = []
    for a, terms in zip(outcome, _turn_terms(turn_rewards), strict=True):
        row, later = [0.0] * len(terms), 0.0
        for k in reversed(range(len(terms))):
            later = terms[k] + discount * later
            row[k] = a + turn_coef * later
        rows.append(row)
    return rows


def token_advantages_by_turn(
    masks: Sequence[int], spans: Sequence[tuple[int, int] | None], advantages: Sequence[float]
) -> list[float]:
    """One sequence's per-token advantages: turn k's advantage on the trained positions of
    `spans[k]` (``[start, end)`` in token positions; None: the turn has no tokens left in the
    sequence), 0.0 on masked positions.

    Raises:
        ValueError: the spans and advantages differ in number, a span leaves the sequence or
            overlaps an earlier one, or a trained position lies in no span (its turn unknown).
    """
    if len(spans) != len(advantages):
        raise ValueError(f"{len(spans)} turn spans but {len(advantages)} turn advantages")
    out = [0.0] * len(masks)
    covered = [False] * len(masks)
    end_of_last = 0
    for k, (span, value) in enumerate(zip(spans, advantages, strict=True)):
        if span is None:
            continue
        start, end = span
        if not end_of_last <= start <= end <= len(masks):
            raise ValueError(
                f"turn {k}'s span {span} must lie in the sequence of {len(masks)} tokens, after"
                f" the previous span (which ended at {end_of_last})"
            )
        for j in range(start, end):
            covered[j] = True
            if masks[j] != MASKED:
                out[j] = float(value)
        end_of_last = end
    stray = next((j for j, m in enumerate(masks) if m != MASKED and not covered[j]), None)
    if stray is not None:
        raise ValueError(f"trained position {stray} lies in no turn's span")
    return out

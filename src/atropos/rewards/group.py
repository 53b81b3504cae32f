"""Group-level scoring idioms shared by upstream's verifier environments.

Upstream's gsm8k, tool-calling, MCQA and instruction-following environments all adjust a whole
group after scoring each completion: a length penalty applied only when every completion is
right, a drop of groups holding a near-empty completion, and a drop of groups whose scores are
all equal (nothing to learn from). Here they are plain functions, for `Env.score_group`.

>>> length_penalty([1.0, 1.0], [100, 900], max_tokens=1000)
[1.0, 0.2]
>>> length_penalty([1.0, -1.0], [100, 900], max_tokens=1000)
[1.0, -1.0]
>>> all_equal([0.5, 0.5]), all_equal([0.5, 1.0])
(True, False)
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MIN_TRAINED_TOKENS", "all_equal", "group_advantages", "length_penalty", "too_short"]

MIN_TRAINED_TOKENS = 10  # upstream drops groups with a completion shorter than this


def length_penalty(
    scores: Sequence[float],
    lengths: Sequence[int],
    max_tokens: int,
    threshold: float = 0.5,
    correct: float = 1.0,
) -> list[float]:
    """Upstream's length penalty: only when every score is `correct`, a completion longer than
    `threshold * max_tokens` tokens scores linearly less, down to 0.0 at `max_tokens`.

    Args:
        scores: one per completion.
        lengths: each completion's length in tokens (its trained tokens).
        max_tokens: the length at which the score reaches 0.0 (`max_token_length`).
        threshold: the share of `max_tokens` below which nothing changes (0.5; 0.75 for IF).
        correct: the score meaning "right" (the penalty applies only if all are).
    """
    if len(scores) != len(lengths):
        raise ValueError(f"{len(scores)} scores but {len(lengths)} lengths")
    if not scores or any(s != correct for s in scores):
        return list(scores)
    start = threshold * max_tokens
    span = max_tokens - start
    out = []
    for score, length in zip(scores, lengths, strict=True):
        if length <= start or span <= 0:
            out.append(score)
        else:
            out.append(round(max(0.0, score * (1.0 - (length - start) / span)), 12))
    return out


def too_short(lengths: Sequence[int], minimum: int = MIN_TRAINED_TOKENS) -> bool:
    """Whether any completion has fewer than `minimum` trained tokens (upstream drops the group)."""
    return any(n < minimum for n in lengths)


def all_equal(scores: Sequence[float]) -> bool:
    """Whether every score is the same (the group teaches nothing)."""
    return len(set(scores)) <= 1


def group_advantages(scores: Sequence[float], eps: float = 1e-8) -> list[float]:
    """GRPO's group-normalised advantage: ``A_i = (r_i - mean(r)) / max(std(r), eps)``.

    ``std`` is the population standard deviation. A group whose scores are all equal gives zeros
    (nothing to learn from it). A group of one is left as it is (``A = r``), as atroposlib's
    trainer does, so an environment can send its own baseline-subtracted score that way.

    >>> group_advantages([1.0, 0.0, 0.0, 1.0])
    [1.0, -1.0, -1.0, 1.0]
    >>> group_advantages([0.5, 0.5])
    [0.0, 0.0]
    """
    if len(scores) == 1:
        return [float(scores[0])]
    n = len(scores)
    mean = sum(scores) / n
    std = (sum((s - mean) ** 2 for s in scores) / n) ** 0.5
    return [(s - mean) / max(std, eps) for s in scores]

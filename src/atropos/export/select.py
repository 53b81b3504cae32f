"""Which sequences of a group become SFT examples, and which pairs become DPO examples.

Pure functions over one group's scores, with the rules of atroposlib 0.4.0's `atropos-sft-gen`
and `atropos-dpo-gen`. Each returns what it kept and a `Counter` of why the rest was left out,
so the export can say so. Ties keep the group's order (the sorts are stable), and the DPO draw
takes a seeded `random.Random`, so the same input and seed give the same file.

>>> sft_select([0.2, 1.0, -1.0, 1.0], top_n=2)
([1, 3], Counter({'not_top_n': 1, 'score_not_positive': 1}))
>>> import random
>>> dpo_pairs([1.0, 0.0, 1.0, 0.0], n_pairs=3, min_diff=0.5, rng=random.Random(0))
([(0, 3), (2, 1)], Counter({'score_not_positive': 2}))
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence


def _usable(scores: Sequence[float], usable: Sequence[bool] | None) -> list[int]:
    if usable is None:
        return list(range(len(scores)))
    if len(usable) != len(scores):
        raise ValueError(f"usable: expected {len(scores)} flags, got {len(usable)}")
    return [i for i, ok in enumerate(usable) if ok]


def sft_select(
    scores: Sequence[float],
    *,
    top_n: int,
    min_diff: float = 0.0,
    allow_negative: bool = False,
    usable: Sequence[bool] | None = None,
) -> tuple[list[int], Counter[str]]:
    """The indices of the sequences to save, best first, and why each other one was not.

    Upstream's rejection sampling: best score first; scores <= 0 dropped unless
    `allow_negative` (`score_not_positive`); with `min_diff` > 0, only scores above the
    group's lowest score plus `min_diff` (`below_min_diff`; the lowest is over the whole
    group); then at most `top_n` (`not_top_n`). Sequences with `usable` False (too long,
    unrenderable) are neither saved nor counted here: the caller counted them.

    Args:
        scores: the group's scores, one per sequence.
        top_n: the most sequences to keep.
        min_diff: how far above the group's lowest score a kept score must be.
        allow_negative: keep scores <= 0 too.
        usable: per sequence, whether it may be chosen at all (default: all).

    Ties keep the group's order; all-equal scores pass `min_diff` only when it is 0:

    >>> sft_select([1.0, 1.0, 1.0], top_n=2)
    ([0, 1], Counter({'not_top_n': 1}))
    >>> sft_select([1.0, 1.0, 1.0], top_n=2, min_diff=0.1)
    ([], Counter({'below_min_diff': 3}))
    >>> sft_select([-0.5, -1.0, 0.0], top_n=3, allow_negative=True, min_diff=0.4)
    ([2, 0], Counter({'below_min_diff': 1}))
    >>> sft_select([3.0, 2.0, 1.0], top_n=1, usable=[False, True, True])
    ([1], Counter({'not_top_n': 1}))
    """
    floor = min(scores, default=0.0) + min_diff
    kept: list[int] = []
    drops: Counter[str] = Counter()
    for i in sorted(_usable(scores, usable), key=lambda i: -scores[i]):
        if not allow_negative and scores[i] <= 0:
            drops["score_not_positive"] += 1
        elif min_diff > 0 and not scores[i] > floor:
            drops["below_min_diff"] += 1
        elif len(kept) >= top_n:
            drops["not_top_n"] += 1
        else:
            kept.append(i)
    return kept, drops


def dpo_pairs(
    scores: Sequence[float],
    *,
    n_pairs: int,
    min_diff: float = 0.5,
    allow_negative: bool = False,
    rng: random.Random,
    usable: Sequence[bool] | None = None,
) -> tuple[list[tuple[int, int]], Counter[str]]:
    """`(chosen, rejected)` index pairs, best chosen first, and why other candidates got none.

    Upstream's pairing: the chosen candidates are the sequences best first, without scores
    <= 0 unless `allow_negative` (`score_not_positive`); the rejected pool is the `n_pairs`
    lowest-scoring sequences. Each of the first `n_pairs` candidates (`not_top_n` for the
    rest) draws at random a pool member scoring below its own score minus `min_diff`, which
    then leaves the pool; a candidate left with no such member gets no pair (`no_partner`).
    A sequence is never paired with itself, and a tie is never a pair. A sequence may be
    chosen in one pair and rejected in another, as upstream allowed (A > B and B > C are both
    true preferences). The counts are per chosen candidate.

    Args:
        scores: the group's scores, one per sequence.
        n_pairs: the most pairs to make.
        min_diff: how much higher the chosen score must be (strictly more than this).
        allow_negative: let sequences scoring <= 0 be chosen too.
        rng: the random draw (seed it for a reproducible file).
        usable: per sequence, whether it may be in a pair at all (default: all).

    >>> rng = random.Random(0)
    >>> dpo_pairs([1.0, 1.0, 1.0], n_pairs=3, min_diff=0.0, rng=rng)
    ([], Counter({'no_partner': 3}))
    >>> dpo_pairs([2.0, 1.0, 0.2], n_pairs=1, min_diff=0.5, rng=rng)
    ([(0, 2)], Counter({'not_top_n': 2}))
    >>> dpo_pairs([-1.0, -3.0], n_pairs=1, min_diff=0.5, rng=rng, allow_negative=True)
    ([(0, 1)], Counter({'not_top_n': 1}))
    """
    order = sorted(_usable(scores, usable), key=lambda i: -scores[i])
    candidates = [i for i in order if allow_negative or scores[i] > 0]
    drops: Counter[str] = Counter()
    if len(candidates) < len(order):
        drops["score_not_positive"] += len(order) - len(candidates)
    if len(candidates) > n_pairs:
        drops["not_top_n"] += len(candidates) - n_pairs
    pool = sorted(order, key=lambda i: scores[i])[:n_pairs]  # the lowest scores
    pairs: list[tuple[int, int]] = []
    for chosen in candidates[:n_pairs]:
        below = [r for r in pool if r != chosen and scores[r] < scores[chosen] - min_diff]
        if not below:
            drops["no_partner"] += 1
            continue
        rejected = below[rng.randrange(len(below))]
        pool.remove(rejected)
        pairs.append((chosen, rejected))
    return pairs, drops

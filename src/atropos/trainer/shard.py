"""Splitting a batch across data-parallel ranks, balanced by tokens.

Ranks step together, so a step takes as long as its busiest rank: a batch is split so that every
rank gets about the same number of tokens, not the same number of sequences. `balanced_split`
is the longest-processing-time rule: sequences in order of decreasing length, each to the rank
with the fewest tokens so far (ties to the rank with fewer sequences, then the lowest rank, so
empty sequences spread too). Its guarantees, checked by property
tests (tests/trainer/test_shard.py): every sequence goes to exactly one rank; the busiest rank
holds at most the least busy one's tokens plus the longest sequence; with at least as many
sequences as ranks, no rank is empty; and within a rank sequences keep the batch's order.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

__all__ = ["balanced_split"]


def balanced_split(lengths: Sequence[int], ranks: int) -> list[list[int]]:
    """The batch indices each of `ranks` ranks trains on, balanced by `lengths` (tokens).

    >>> balanced_split([5, 1, 1, 1, 4, 2], 2)
    [[0, 1, 2], [3, 4, 5]]
    """
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    if any(n < 0 for n in lengths):
        raise ValueError("sequence lengths cannot be negative")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    loads = [(0, 0, rank) for rank in range(ranks)]  # (tokens, sequences, rank): a min-heap
    shares: list[list[int]] = [[] for _ in range(ranks)]
    for i in order:
        tokens, count, rank = heapq.heappop(loads)
        shares[rank].append(i)
        heapq.heappush(loads, (tokens + lengths[i], count + 1, rank))
    return [sorted(share) for share in shares]

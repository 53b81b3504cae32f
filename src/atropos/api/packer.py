"""Batch packing as pure functions: which queued groups make the next batch.

The contract (property-tested in tests/api/test_packer.py):

* a batch holds exactly `batch_size` sequences and never splits a group;
* it is the *oldest-first* choice: among all sets of queued groups whose sizes sum to
  `batch_size`, the one that is earliest in queue order (the oldest group is in it whenever any
  exact batch can hold it, then the next oldest, and so on);
* any mix of group sizes packs whenever some subset of the queue sums to `batch_size`
  (atroposlib 0.4.0 only packed power-of-two sizes that divide the largest group);
* per-env minimum shares are met with whole groups, and only among the envs the caller passes
  (the API passes live envs only, so a dead env never stalls batching, as one did upstream).

Cost: a greedy first-fit pass in queue order finds the answer whenever it exists along that
path (always, for uniform sizes that divide the batch); otherwise one pass of subset-sum over
Python-int bitsets, O(n) big-int operations of `batch_size` bits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple


class Item(NamedTuple):
    """A queued group as the packer sees it (queue order = age order)."""

    size: int
    env_id: int | None


def pick_exact(sizes: Sequence[int], target: int) -> list[int] | None:
    """Return the earliest-in-order indices whose sizes sum to `target`, or None.

    "Earliest" is lexicographic on inclusion: index 0 is taken whenever some exact subset holds
    it, then index 1 under that choice, and so on.

    >>> pick_exact([3, 3, 5, 3], 8)
    [0, 2]
    >>> pick_exact([4, 4, 4], 6) is None
    True
    """
    if target <= 0:
        return [] if target == 0 else None
    if target > sum(size for size in sizes if size > 0):  # also keeps a huge target's bitset out
        return None
    chosen: list[int] = []
    total = 0
    for i, size in enumerate(sizes):
        if 0 < size <= target - total:
            chosen.append(i)
            total += size
            if total == target:
                return chosen  # greedy first-fit is the earliest subset when it lands exactly
    return _pick_exact_dp(sizes, target)


def _pick_exact_dp(sizes: Sequence[int], target: int) -> list[int] | None:
    mask = (1 << (target + 1)) - 1
    n = len(sizes)
    # suffix[i]: bit s is set when some subset of sizes[i:] sums to s.
    suffix = [0] * (n + 1)
    reach = 1
    suffix[n] = reach
    for i in range(n - 1, -1, -1):
        size = sizes[i]
        if 0 < size <= target:
            reach = (reach | (reach << size)) & mask
        suffix[i] = reach
    if not (reach >> target) & 1:
        return None
    chosen: list[int] = []
    remaining = target
    for i in range(n):
        if remaining == 0:
            break
        size = sizes[i]
        if 0 < size <= remaining and (suffix[i + 1] >> (remaining - size)) & 1:
            chosen.append(i)
            remaining -= size
    return chosen


def reachable_sums(sizes: Sequence[int], limit: int) -> int:
    """Bitset of the subset sums of `sizes` up to `limit` (bit s set = s reachable).

    >>> bin(reachable_sums([2, 3], 10))
    '0b101101'
    """
    limit = min(limit, sum(size for size in sizes if size > 0))  # no sum is larger
    mask = (1 << (limit + 1)) - 1
    reach = 1
    for size in sizes:
        if 0 < size <= limit:
            reach = (reach | (reach << size)) & mask
    return reach


def allocate_minimums(batch_size: int, allocations: Mapping[int, float]) -> dict[int, int]:
    """Turn per-env minimum fractions into minimum sequence counts.

    Each env gets `int(batch_size * fraction)`; when the fractions add up to more than 1 they
    are scaled down proportionally (as upstream), so the minimums never exceed the batch.

    >>> allocate_minimums(64, {0: 0.25, 1: 0.5})
    {0: 16, 1: 32}
    >>> allocate_minimums(10, {0: 0.8, 1: 0.8})
    {0: 5, 1: 5}
    """
    total = sum(a for a in allocations.values() if a > 0)
    scale = 1.0 / total if total > 1.0 else 1.0
    return {env: int(batch_size * a * scale) for env, a in sorted(allocations.items()) if a > 0}


_SEARCH_BUDGET = 256  # candidate totals tried across min-share envs before giving up


def pick_batch(
    items: Sequence[Item], batch_size: int, minimums: Mapping[int, int] | None = None
) -> list[int] | None:
    """Choose the next batch: indices into `items` (oldest first), or None if none can form.

    `minimums` maps env_id -> minimum sequences from that env in every batch. Each such env
    contributes its oldest groups adding up to the smallest total that meets its minimum (a
    larger total is tried only if the rest of the batch cannot be completed otherwise); the
    remainder is filled oldest-first from every group left.

    >>> pick_batch([Item(4, 0), Item(4, 0), Item(4, 1)], 8, {1: 4})
    [0, 2]
    >>> pick_batch([Item(4, 0), Item(4, 0)], 8, {1: 4}) is None
    True
    """
    if not minimums:
        return pick_exact([it.size for it in items], batch_size)
    envs = [e for e, m in sorted(minimums.items()) if m > 0]
    by_env: dict[int, list[int]] = {e: [] for e in envs}
    for i, it in enumerate(items):
        if it.env_id in by_env:
            by_env[it.env_id].append(i)
    budget = [_SEARCH_BUDGET]

    def search(k: int, taken: list[int], room: int) -> list[int] | None:
        if k == len(envs):
            taken_set = set(taken)
            rest = [i for i in range(len(items)) if i not in taken_set]
            fill = pick_exact([items[i].size for i in rest], room)
            return None if fill is None else sorted(taken + [rest[j] for j in fill])
        own = by_env[envs[k]]
        own_sizes = [items[i].size for i in own]
        reach = reachable_sums(own_sizes, room)
        for total in range(minimums[envs[k]], min(room, sum(own_sizes)) + 1):
            if not (reach >> total) & 1:
                continue
            budget[0] -= 1
            if budget[0] < 0:
                return None
            picked = pick_exact(own_sizes, total)
            if picked is None:  # cannot happen: reach says total is a subset sum
                continue
            found = search(k + 1, taken + [own[j] for j in picked], room - total)
            if found is not None:
                return found
        return None

    return search(0, [], batch_size)

"""Summaries the runners log: `{name}_mean/_std/_max/_min` and completion-length statistics.

`completion_stats` keeps upstream's names (`train/completion_lengths`, `_std`, `_max`, `_min`,
`_p95`) with one meaning fixed: upstream's `_p95` was the *fraction* of completions longer than
95% of the token limit; here `_p95` is the 95th percentile of the lengths, and that fraction is
`train/completion_lengths_near_max_fraction`.

>>> stats = completion_stats(list(range(1, 101)), max_token_len=100)
>>> stats["train/completion_lengths"], stats["train/completion_lengths_p95"]
(50.5, 95.0)
>>> stats["train/completion_lengths_near_max_fraction"]  # 96..100 are longer than 95
0.05
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """The mean and population standard deviation of non-empty `values`, in floats (two
    `math.fsum` passes: `statistics.pstdev` computes in exact fractions, ~10x the CPU, and the
    runner summarises every step's sequences).

    >>> mean_std([1, 3]), mean_std([2.5])
    ((2.0, 1.0), (2.5, 0.0))
    """
    n = len(values)
    mean = math.fsum(values) / n
    return mean, math.sqrt(math.fsum([(x - mean) * (x - mean) for x in values]) / n)


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-th percentile (0 < q <= 100) of non-empty `values`.

    >>> percentile([5, 1, 3, 2, 4], 50), percentile([5, 1, 3, 2, 4], 100)
    (3.0, 5.0)
    """
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


def summary(values: Sequence[float], name: str) -> dict[str, float]:
    """`{name}_mean`, `_std` (population), `_max`, `_min`; empty when there are no values.

    >>> summary([1.0, 3.0], "train_perf/task_duration")["train_perf/task_duration_std"]
    1.0
    >>> summary([], "x")
    {}
    """
    if not values:
        return {}
    mean, std = mean_std(values)
    return {
        f"{name}_mean": mean,
        f"{name}_std": std,
        f"{name}_max": float(max(values)),
        f"{name}_min": float(min(values)),
    }


def completion_stats(
    lengths: Sequence[int], max_token_len: int, name: str = "train/completion_lengths"
) -> dict[str, float]:
    """Completion lengths (trained tokens per sequence): mean, std, max, min, p95, and the
    share longer than 95% of `max_token_len` (left out when the limit is unknown, <= 0)."""
    if not lengths:
        return {}
    mean, std = mean_std(lengths)
    out = {
        name: mean,
        f"{name}_std": std,
        f"{name}_max": float(max(lengths)),
        f"{name}_min": float(min(lengths)),
        f"{name}_p95": percentile(lengths, 95),
    }
    if max_token_len > 0:
        limit = 0.95 * max_token_len
        out[f"{name}_near_max_fraction"] = sum(n > limit for n in lengths) / len(lengths)
    return out


def trained_tokens(masks: Sequence[Sequence[int]]) -> list[int]:
    """Per sequence, the tokens trained on (mask entries other than -100).

    >>> trained_tokens([[-100, -100, 7, 8], [-100, 5]])
    [2, 1]
    """
    # counted with the row's own -100 when it starts with one: a row's masks are mostly one
    # int object (`[MASKED] * n`), and `list.count` takes an identical object without comparing
    return [
        len(row) - row.count(row[0] if row and row[0] == -100 else -100)
        if isinstance(row, list)
        else sum(m != -100 for m in row)
        for row in masks
    ]

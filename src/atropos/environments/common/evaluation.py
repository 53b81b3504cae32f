"""The evaluation loop of environments whose item is a whole episode, not one completion.

`Env.evaluate` asks for one completion per item; an env that plays a conversation of many
turns per item (`deep_research`, `mt_grpo`, `mcp_tools`, `tool_use_multiturn`, `textworld`,
the games) cannot use it, and runs `evaluate_each` instead: each item played once, at most
`max_eval_workers` at a time, the played ones summed up by the env, the metrics and sample rows
written by `evaluate_log`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from atropos.envs.base import BaseEnv

__all__ = ["Report", "evaluate_each"]

T = TypeVar("T")
R = TypeVar("R")
Report = tuple[dict[str, float], list[dict[str, Any]]]  # (metrics, one sample row per item)


async def evaluate_each(
    env: BaseEnv[Any],
    items: Sequence[T],
    play: Callable[[T], Awaitable[R | None]],
    report: Callable[[list[tuple[T, R]]], Report],
    params: dict[str, Any],
) -> dict[str, float]:
    """Play each of `items` once (`play`; None: nothing to evaluate, e.g. its prompt does not
    fit), at most `max_eval_workers` at once; `report` turns the played `(item, result)` pairs,
    in the items' order, into the metrics and the sample rows, which `evaluate_log` writes with
    the sampling `params`.

    Returns:
        The metrics; {} (and nothing logged) when no item was played.
    """
    start = time.time()
    gate = asyncio.Semaphore(env.config.max_eval_workers)

    async def one(item: T) -> R | None:
        async with gate:
            return await play(item)

    results = await asyncio.gather(*map(one, items))
    played = [(item, r) for item, r in zip(items, results, strict=True) if r is not None]
    if not played:
        return {}
    metrics, samples = report(played)
    env.evaluate_log(metrics, None, None, start, time.time(), params, samples)
    return metrics

"""The evaluation loop: each item played once, at most `max_eval_workers` at a time.

`Env.evaluate` (one completion per item) and `AgentEnv.evaluate` (one agent run per task) run
it, and so does an environment whose item is a whole episode of many turns (`deep_research`,
`mt_grpo`, `mcp_tools`, `tool_use_multiturn`, `textworld`, the games): the played items are
summed up by the env, the metrics and sample rows written by `evaluate_log`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from atropos.envs.base import BaseEnv

__all__ = ["EpisodeLike", "Report", "episode_report", "evaluate_each", "report_rows"]

T = TypeVar("T")
R = TypeVar("R")
Report = tuple[dict[str, float], list[dict[str, Any]]]  # (metrics, one sample row per item)


async def evaluate_each(
    env: BaseEnv[Any],
    items: Sequence[T],
    play: Callable[[T], Awaitable[R | None]],
    report: Callable[[list[tuple[T, R]]], Report],
    params: dict[str, Any] | None,
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


def report_rows(
    metrics_of: Callable[[list[dict[str, Any]]], dict[str, float]],
) -> Callable[[list[tuple[Any, dict[str, Any]]]], Report]:
    """The `report` of a `play` that returns each item's sample row already: the rows, and
    `metrics_of(rows)`.

    >>> report_rows(lambda rows: {"n": len(rows)})([("item", {"score": 1.0})])
    ({'n': 1}, [{'score': 1.0}])
    """

    def report(played: list[tuple[Any, dict[str, Any]]]) -> Report:
        rows = [row for _, row in played]
        return metrics_of(rows), rows

    return report


class EpisodeLike(Protocol):
    """An episode of a remote environment (ORS, OpenEnv): its return and how it ended."""

    messages: list[dict[str, Any]]

    @property
    def score(self) -> float: ...

    @property
    def ended(self) -> str | None: ...


def episode_report(key: str, finished: str) -> Callable[[list[tuple[Any, Any]]], Report]:
    """The `report` of remote-environment episodes (`EpisodeLike`): `eval/avg_score`, the mean
    return, and `eval/finished`, the share the environment ended itself (`ended == finished`)
    rather than a limit; one row per episode, its item under `key`, anything a remote server
    sent that JSON cannot hold written as its `str`. Every remote consumer reports these two
    names, so an ORS and an OpenEnv evaluation read alike.

    >>> from types import SimpleNamespace as E
    >>> played = [(0, E(messages=[], score=1.0, ended="done")), (1, E(messages=[], score=0.0,
    ...     ended="max_turns"))]
    >>> episode_report("seed", "done")(played)[0]
    {'eval/avg_score': 0.5, 'eval/finished': 0.5}
    """

    def report(played: list[tuple[Any, EpisodeLike]]) -> Report:
        rows: list[dict[str, Any]] = [
            {key: item, "messages": ep.messages, "score": ep.score, "ended": ep.ended}
            for item, ep in played
        ]
        n = len(played)
        metrics = {
            "eval/avg_score": sum(ep.score for _, ep in played) / n,
            "eval/finished": sum(ep.ended == finished for _, ep in played) / n,
        }
        return metrics, json.loads(json.dumps(rows, default=str))

    return report

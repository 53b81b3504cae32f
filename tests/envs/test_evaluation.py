"""`envs.evaluation.evaluate_each`: each item played once, a bounded number at a time, the
played ones reported in order, nothing logged when none was played."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from atropos.envs.evaluation import Report, evaluate_each


class Logged(SimpleNamespace):
    """Stands in for an env: its config's `max_eval_workers`, and what `evaluate_log` got."""

    def __init__(self, workers: int) -> None:
        super().__init__(config=SimpleNamespace(max_eval_workers=workers), logs=[])

    def evaluate_log(self, metrics: Any, task: Any, model: Any, *rest: Any) -> None:
        start, end, params, samples = rest
        assert start <= end
        self.logs.append((metrics, params, samples))


def report(played: list[tuple[int, int]]) -> Report:
    samples = [{"item": item, "score": float(result)} for item, result in played]
    return {"eval/mean": sum(s["score"] for s in samples) / len(samples)}, samples


def test_items_are_played_at_most_workers_at_once_and_reported_in_order():
    env = Logged(workers=2)
    running, most = 0, 0

    async def play(item: int) -> int | None:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01 * (5 - item))  # later items finish first
        running -= 1
        return None if item == 3 else item * 10  # item 3: nothing to evaluate

    metrics = asyncio.run(evaluate_each(env, [1, 2, 3, 4], play, report, {"temperature": 0}))
    assert most == 2
    assert metrics == {"eval/mean": 70 / 3}
    [(logged, params, samples)] = env.logs
    assert logged == metrics and params == {"temperature": 0}
    assert [s["item"] for s in samples] == [1, 2, 4]


def test_nothing_played_gives_no_metrics_and_logs_nothing():
    env = Logged(workers=4)

    async def play(item: int) -> int | None:
        return None

    assert asyncio.run(evaluate_each(env, [1, 2], play, report, {})) == {}
    assert asyncio.run(evaluate_each(env, [], play, report, {})) == {}
    assert env.logs == []

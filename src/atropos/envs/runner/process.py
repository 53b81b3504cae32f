"""`process`: make N groups without a trainer, into JSONL + HTML + metrics.

Items run concurrently (up to `max_num_workers` at once; atroposlib 0.4.0 ran one at a time)
with a progress bar; items an env hands back from `collect_trajectories` (judge passes, retries)
run before new ones, as in serve mode. An exception in one item is counted and logged and the
run goes on; a run whose last `max(100, 2 x max_num_workers)` items all gave no group (every one
dropped or failed) stops with status 1 and the drop counts, rather than sampling forever. Each
group is written and flushed as soon as it is scored, so a killed run keeps what it made. At the
end: `<name>.html` beside the JSONL, `<name>.metrics.json` with counts, timings and score
statistics, and `<name>.config.yaml` (the resolved configuration, secrets removed). The same
metrics plus the env's own (`wandb_log`) go as one record to `<name>.metrics.jsonl`, and to W&B
when `use_wandb` is on and `$WANDB_PROJECT` names a project (`atropos.metrics.envs`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from atropos.envs.base import BaseEnv
from atropos.envs.config import ResolvedConfig
from atropos.envs.runner import FrozenHeap
from atropos.envs.runner.groups import EnvDrops, JsonlSink, as_groups, prepare
from atropos.envs.runner.html import write_html
from atropos.inference.base import PolicyVersions
from atropos.metrics import MetricsError, open_env_sink
from atropos.metrics.stats import completion_stats, summary, trained_tokens

log = logging.getLogger("atropos.env")


class ProcessRunner:
    """Runs one env in process mode."""

    barren_limit = 100  # items in a row without a group before the run gives up (at least)

    def __init__(self, env: BaseEnv, resolved: ResolvedConfig) -> None:
        self.env = env
        self.resolved = resolved
        cfg = env.config
        name = cfg.wandb_name or env.name or type(env).__name__
        self.sink = JsonlSink(Path(cfg.data_path_to_save_groups or f"data/{name}.jsonl"))
        self.target = cfg.total_steps
        self.drops: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.scores: list[float] = []
        self.durations: list[float] = []
        self.lengths: list[int] = []  # trained tokens per sequence written
        self.heap = FrozenHeap()
        self.backlog: deque[Any] = deque()  # items an env asked to run next (judge, retries)

    async def run(self, show_progress: bool = True) -> int:
        env, cfg = self.env, self.env.config
        started = time.time()
        try:
            sink = open_env_sink(
                env,
                self.sink.path.with_suffix(".metrics.jsonl"),
                config=self.resolved.redacted(),
                wandb_dir=self.sink.path.parent,
            )
        except MetricsError as err:
            log.error("%s", err)
            self.sink.close()
            return 1
        env.metrics_sink = sink
        try:
            await env.setup()
            with self.heap:
                return await self._run(env, cfg, started, show_progress)
        finally:
            env.metrics_sink = None
            sink.close()

    async def _run(self, env: BaseEnv, cfg: Any, started: float, show_progress: bool) -> int:
        # One long-lived task per worker, each taking its next item as soon as its last one is
        # written: a task per item, refilled by a loop woken from done-callbacks, left ~4% of
        # the slots empty at 256 workers (a few loop turns per refill).
        target, limit = self.target, max(self.barren_limit, 2 * cfg.max_num_workers)
        workers = max(1, cfg.max_num_workers)
        # barren: items in a row that gave no group; alive: worker tasks not yet returned
        state = {"made": 0, "in_flight": 0, "barren": 0, "alive": workers}
        stop = asyncio.Event()
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())

        async def worker() -> None:
            try:
                await work()
            except Exception:  # get_next_item failed: end the run with what was written
                log.exception("%s.get_next_item failed; stopping", type(env).__name__)
                self.failures["get_next_item"] += 1
            finally:
                state["alive"] -= 1
                if state["alive"] == 0:  # the last worker out ends the wait, whatever happened
                    stop.set()

        async def work() -> None:
            while not stop.is_set() and state["made"] + state["in_flight"] < target:
                state["in_flight"] += 1  # a slot is taken before the item is asked for
                try:
                    if self.backlog:  # follow-up items first, as in serve mode
                        item = self.backlog.popleft()
                    else:
                        item = await env.get_next_item()
                    if item is None:  # the env has no more items
                        stop.set()
                        return
                    written = await self._one(item)
                finally:
                    state["in_flight"] -= 1
                state["made"] += written
                state["barren"] = 0 if written else state["barren"] + 1
                bar.update(progress, completed=min(state["made"], target))
                if state["made"] >= target:
                    stop.set()
                elif state["barren"] >= limit and not stop.is_set():
                    log.error(
                        "the last %d items gave no group to write (dropped: %s, failed: %s);"
                        " stopping instead of sampling forever",
                        state["barren"],
                        dict(self.drops),
                        dict(self.failures),
                    )
                    stop.set()

        with Progress(*columns, TimeElapsedColumn(), disable=not show_progress) as bar:
            progress = bar.add_task(f"{env.name or type(env).__name__}: groups", total=target)
            tasks = [asyncio.create_task(worker()) for _ in range(workers)]
            try:
                await stop.wait()
            finally:
                for t in tasks:
                    t.cancel()  # workers still sampling past the target or a stop
                await asyncio.gather(*tasks, return_exceptions=True)
        made = state["made"]
        self.sink.close()
        page = write_html(self.sink.path)
        totals = self._totals(made)
        try:  # one record: these totals and the env's own counters (judge votes, ...)
            await env.wandb_log(dict(totals))
        except Exception:
            log.exception("%s.wandb_log failed", type(env).__name__)
        own = {k: v for k, v in (getattr(env, "metrics", {}) or {}).items() if k not in totals}
        self._write_metrics(started, made, own)
        self.resolved.save(self.sink.path.with_suffix(".config.yaml"))
        await env.aclose()
        log.warning("wrote %d groups to %s (%s)", made, self.sink.path, page.name)
        return 0 if made > 0 or self.target == 0 else 1

    async def _one(self, item: Any) -> int:
        env, cfg = self.env, self.env.config
        t0 = time.monotonic()
        try:
            # what the servers report for this rollout's calls, and why the env dropped it
            with PolicyVersions() as seen, EnvDrops() as dropped:
                result, more = await env.collect_trajectories(item)
                self.backlog.extend(more or [])
                result = await env.postprocess_histories(result)
        except Exception as err:  # one bad item never ends the run
            self.failures[type(err).__name__] += 1
            log.exception("item failed: %s", err)
            return 0
        self.durations.append(time.monotonic() - t0)
        self.heap.settle()
        written = 0
        groups = as_groups(result)
        dropped.count(self.drops, groups)
        for group in groups:
            ready = prepare(
                group,
                group_size=cfg.group_size,
                max_token_len=-1,
                ensure_scores_differ=cfg.ensure_scores_are_not_same,
                policy_version=seen.lowest,  # none without a trainer, unless a server says
                env_id=None,
                drops=self.drops,
                decode=(lambda seq: env.tokenizer.decode(seq)) if cfg.include_messages else None,
            )
            if ready is not None:
                self.sink.write(ready)
                self.scores.extend(float(s) for s in ready["scores"])
                self.lengths.extend(trained_tokens(ready["masks"]))
                written += 1
        return written

    def _totals(self, made: int) -> dict[str, float]:
        """The run's metrics for the record at its end (names as in serve mode; every count
        covers the whole run)."""
        totals: dict[str, float] = {"train/groups_written": float(made)}
        totals["train/items_rejected"] = float(sum(self.drops.values()))
        for reason, n in self.drops.items():
            totals[f"train/dropped/{reason}"] = float(n)
        for kind, n in self.failures.items():
            totals[f"train/failed/{kind}"] = float(n)
        if self.scores:
            totals["train/score_mean"] = statistics.fmean(self.scores)
        totals.update(completion_stats(self.lengths, self.env.config.max_token_length))
        totals.update(summary(self.durations, "train_perf/succeeded_task_duration"))
        return totals

    def _write_metrics(self, started: float, made: int, env_metrics: dict[str, Any]) -> None:
        scores, durations = self.scores, self.durations
        doc = {
            "groups": made,
            "target": self.target,
            "dropped": dict(self.drops),
            "failed": dict(self.failures),
            "seconds": time.time() - started,
            "score_mean": statistics.fmean(scores) if scores else None,
            "score_std": statistics.pstdev(scores) if len(scores) > 1 else None,
            "item_seconds_mean": statistics.fmean(durations) if durations else None,
            "env": env_metrics,  # what the env logged through wandb_log
        }
        path = self.sink.path.with_suffix(".metrics.json")
        path.write_text(json.dumps(doc, indent=2))

"""`process`: make N groups without a trainer, into JSONL + HTML + metrics.

Items run concurrently (up to `max_num_workers` at once; atroposlib 0.4.0 ran one at a time)
with a progress bar; items an env hands back from `collect_trajectories` (judge passes, retries)
run before new ones, as in serve mode. An exception in one item is counted and logged (once per
distinct message, `watch.FailureLog`) and the run goes on; a run whose last
`max(100, 2 x max_num_workers)` items all gave no group (every one dropped or failed) stops with
status 1 and the drop counts, rather than sampling forever. An error that will repeat for every
item (a missing package, a tokenizer that cannot load, a model the server does not serve, an
inference server never reached within `--server_wait` seconds, or every server of the policy,
the teacher or the judge unreachable that long in a row: `errors.fatal_reason`) stops the run at
the first one, with one message naming the fix and status 1. While most groups are
dropped, a line says so every 30 s (`watch.DropReport`); when nearly all go for equal scores,
that line, the stop line and the summary end with what to do (`watch.drop_hint`).

With `--teacher.*`, each group gets the teacher's logprobs before it is written
(`atropos.envs.teacher`). Each group is written and flushed as soon as it is scored (and
annotated), so a killed run keeps what it made;
the JSONL file is created with the first group (a run that makes none leaves none). SIGINT or
SIGTERM, in any state (setup, waiting for a server, mid-rollout), stops the run: in-flight items
get `grace` seconds to finish and are then cancelled, what was made is kept, the summary is
printed and the status is 130 (SIGINT) or 143 (SIGTERM); a second signal cancels at once
(`stop.Stopper`). At the end: `<name>.html` beside the JSONL, `<name>.metrics.json` with counts,
timings and score statistics, and `<name>.config.yaml` (the resolved configuration, secrets
removed). The same metrics plus the env's own (`wandb_log`) go as one record to
`<name>.metrics.jsonl`, and to W&B when `use_wandb` is on and `$WANDB_PROJECT` names a project
(`atropos.metrics.envs`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from collections import Counter, deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from atropos.envs.config import ResolvedConfig
from atropos.envs.outcome import outcome_metrics
from atropos.envs.runner.config_file import save_config
from atropos.envs.runner.groups import EnvDrops, JsonlSink, plural, ready_groups
from atropos.envs.runner.heap import FrozenHeap
from atropos.envs.runner.html import write_html
from atropos.envs.runner.stop import Stopped, Stopper
from atropos.envs.runner.watch import DropReport, FailureLog, drop_hint
from atropos.envs.teacher import Teacher
from atropos.inference.base import PolicyVersions
from atropos.inference.errors import fatal_reason
from atropos.metrics import MetricsError, open_env_sink
from atropos.metrics.stats import completion_stats, summary, trained_tokens

if TYPE_CHECKING:  # annotations only: the runner drives an env, never imports its base
    from atropos.envs.base import BaseEnv

log = logging.getLogger("atropos.env")


class ProcessRunner:
    """Runs one env in process mode."""

    barren_limit = 100  # items in a row without a group before the run gives up (at least)
    grace = 1.0  # seconds in-flight items get to finish after a stop signal
    report_every = 1.0  # seconds between checks of the drop share (DropReport)

    def __init__(self, env: BaseEnv, resolved: ResolvedConfig) -> None:
        self.env = env
        self.resolved = resolved
        cfg = env.config
        name = cfg.wandb_name or env.name or type(env).__name__
        self.sink = JsonlSink(Path(cfg.data_path_to_save_groups or f"data/{name}.jsonl"))
        self.target = cfg.total_steps
        self.drops: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()  # rollouts by how they ended (envs.outcome)
        self.errors = FailureLog(self.failures, outcomes=self.outcomes, rollouts=cfg.group_size)
        self.drop_report = DropReport()
        self.stopper = Stopper()
        self.scores: list[float] = []
        self.durations: list[float] = []
        self.lengths: list[int] = []  # trained tokens per sequence written
        self.heap = FrozenHeap()
        self.backlog: deque[Any] = deque()  # items an env asked to run next (judge, retries)
        self.teacher: Teacher | None = None  # --teacher.*: started after the env's setup
        self.hinted = False  # the stop line said what to do about the drops already

    async def run(self, show_progress: bool = True) -> int:
        with self.stopper.install("stopping: in-flight items get a moment, then the summary"):
            return await self._run_all(show_progress)

    async def _run_all(self, show_progress: bool) -> int:
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
        save_config(self.resolved, self.sink.path.with_suffix(".config.yaml"))
        try:
            try:
                await self.stopper.race(env.setup())
                self.teacher = await self.stopper.race(Teacher.start(env))
            except Stopped:
                await env.aclose()
                log.warning("stopped by %s during setup; wrote no groups", self.stopper.name)
                return self.stopper.exit_code
            except Exception as err:  # one clear line for a fatal error; a traceback otherwise
                reason = fatal_reason(err)
                if reason is None:  # a ConfigError: `runner.run` says it in one line, exit 2
                    await env.aclose()
                    raise
                await env.aclose()
                log.error("setup failed: %s; stopping (wrote no groups)", reason)
                return 1
            with self.heap:
                return await self._run(env, cfg, started, show_progress)
        finally:
            env.metrics_sink = None
            sink.close()

    async def _run(self, env: BaseEnv, cfg: Any, started: float, show_progress: bool) -> int:
        """Make groups with `cfg.max_num_workers` workers until the target or a stop.

        Long because the workers, the progress bar and the stop rule share one state and the
        closures that update it.
        """
        # One long-lived task per worker, each taking its next item as soon as its last one is
        # written: a task per item, refilled by a loop woken from done-callbacks, left ~4% of
        # the slots empty at 256 workers (a few loop turns per refill).
        target, limit = self.target, max(self.barren_limit, 2 * cfg.max_num_workers)
        workers = max(1, cfg.max_num_workers)
        # barren: items in a row that gave no group; alive: worker tasks not yet returned
        state = {"made": 0, "in_flight": 0, "barren": 0, "alive": workers}
        stop = self.stopper.event  # a signal sets it too
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())

        async def worker() -> None:
            try:
                await work()
            except Exception as err:  # get_next_item failed: end the run with what was written
                if not self.errors.record(err, "get_next_item"):
                    log.error("%s.get_next_item failed; stopping", type(env).__name__)
                stop.set()
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
                if self.errors.fatal is not None:
                    stop.set()
                bar.update(progress, completed=min(state["made"], target))
                if state["made"] >= target:
                    stop.set()
                elif state["barren"] >= limit and not stop.is_set():
                    hint = drop_hint(self.drops, state["made"])
                    log.error(
                        "the last %d items gave no group to write (dropped: %s, failed: %s);"
                        " stopping instead of sampling forever%s",
                        state["barren"],
                        dict(self.drops),
                        dict(self.failures),
                        f": {hint}" if hint else "",
                    )
                    self.hinted = hint is not None
                    stop.set()

        async def watch_drops() -> None:
            while True:
                await asyncio.sleep(self.report_every)
                self.drop_report.check(self.drops, self.failures, state["made"])

        with Progress(*columns, TimeElapsedColumn(), disable=not show_progress) as bar:
            progress = bar.add_task(f"{env.name or type(env).__name__}: groups", total=target)
            tasks = [asyncio.create_task(worker()) for _ in range(workers)]
            watcher = asyncio.create_task(watch_drops())
            try:
                await stop.wait()
                if self.stopper.signum is not None and self.errors.fatal is None:
                    await self._grace(tasks)
            finally:
                for t in [*tasks, watcher]:
                    t.cancel()  # workers still sampling past the target or a stop
                await asyncio.gather(*tasks, watcher, return_exceptions=True)
        made = state["made"]
        self.sink.close()
        page = self._page() if made else None
        totals = self._totals(made)
        try:  # one record: these totals and the env's own counters (judge votes, ...)
            await env.wandb_log(dict(totals))
        except Exception:
            log.exception("%s.wandb_log failed", type(env).__name__)
        own = {k: v for k, v in (getattr(env, "metrics", {}) or {}).items() if k not in totals}
        self._write_metrics(started, made, own)
        self.resolved.save(self.sink.path.with_suffix(".config.yaml"))
        await env.aclose()
        return self._summary(made, page)

    def _page(self) -> Path:
        """The HTML page beside the JSONL, its trained tokens highlighted with the run's
        tokenizer when the run loaded one (none is loaded, or downloaded, for the page alone:
        without it the page names the run's tokenizer, from `<name>.config.yaml`)."""
        tokenizer = getattr(self.env, "_tokenizer", None)
        return write_html(self.sink.path, tokenizer, self.env.config.tokenizer_name)

    async def _grace(self, tasks: list[asyncio.Task[None]]) -> None:
        """Give in-flight items `grace` seconds to finish (less after a second signal)."""
        pending = {t for t in tasks if not t.done()}
        urgent = asyncio.ensure_future(self.stopper.urgent.wait())
        try:
            await asyncio.wait(pending | {urgent}, timeout=self.grace)
        finally:
            urgent.cancel()

    def _summary(self, made: int, page: Path | None) -> int:
        """Log the run's last line; return its exit status."""
        where = f" to {self.sink.path} ({page.name})" if page is not None else ""
        wrote = f"wrote {plural(made, 'group')}{where}"
        counts = f"dropped {dict(self.drops)}, failed {dict(self.failures)}"
        if self.errors.fatal is not None:
            log.error("%s; stopping: %s (%s)", self.errors.fatal, wrote, counts)
            return 1
        if self.stopper.signum is not None:
            log.warning("stopped by %s: %s (%s)", self.stopper.name, wrote, counts)
            return self.stopper.exit_code
        hint = None if self.hinted else drop_hint(self.drops, made)
        log.warning("%s (%s)%s", wrote, counts, f": {hint}" if hint else "")
        return 0 if made > 0 or self.target == 0 else 1

    async def _one(self, item: Any) -> int:
        env = self.env
        t0 = time.monotonic()
        try:
            # what the servers report for this rollout's calls, and why the env dropped it
            with PolicyVersions() as seen, EnvDrops() as dropped:
                result, more = await env.collect_trajectories(item)
                self.backlog.extend(more or [])
                result = await env.postprocess_histories(result)
            # policy_version: none without a trainer, unless a server says (the teacher's
            # answers, outside the block, say nothing about the policy's)
            ready = await ready_groups(
                env,
                result,
                dropped,
                self.drops,
                max_token_len=-1,
                policy_version=seen.lowest,
                env_id=None,
                teacher=self.teacher,
                outcomes=self.outcomes,
            )
        except Exception as err:  # one bad item never ends the run, unless all will fail alike
            if self.errors.record(err):
                self.stopper.event.set()
            return 0
        self.durations.append(time.monotonic() - t0)
        self.heap.settle()
        for group in ready:
            self.sink.write(group)
            self.scores.extend(float(s) for s in group["scores"])
            self.lengths.extend(trained_tokens(group["masks"]))
        return len(ready)

    def _totals(self, made: int) -> dict[str, float]:
        """The run's metrics for the record at its end (names as in serve mode; every count
        covers the whole run)."""
        totals: dict[str, float] = {"train/groups_written": float(made)}
        totals["train/items_rejected"] = float(sum(self.drops.values()))
        for reason, n in self.drops.items():
            totals[f"train/dropped/{reason}"] = float(n)
        for kind, n in self.failures.items():
            totals[f"train/failed/{kind}"] = float(n)
        totals.update(outcome_metrics(self.outcomes))
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
            "outcomes": dict(self.outcomes),
            "seconds": time.time() - started,
            "score_mean": statistics.fmean(scores) if scores else None,
            "score_std": statistics.pstdev(scores) if len(scores) > 1 else None,
            "item_seconds_mean": statistics.fmean(durations) if durations else None,
            "env": env_metrics,  # what the env logged through wandb_log
        }
        path = self.sink.path.with_suffix(".metrics.json")
        path.write_text(json.dumps(doc, indent=2))

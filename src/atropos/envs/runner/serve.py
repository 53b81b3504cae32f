"""`serve`: roll out groups and send them to the trajectory API until the run ends.

The loop, in order: `setup()`; register (waiting for the trainer with a visible log line and a
deadline); read `/info`; load the newest checkpoint; then admit work. Admission keeps at most
`cap` rollouts in flight, where `cap` follows the rules of atroposlib 0.4.0 (upstream):
`max_num_workers`, less while an evaluation runs (`eval_handling`), and no more than the
off-policy budget `max_batches_offpolicy * batch_size / group_size - queued groups` (raised to
an env's `min_batch_allocation` floor), and, when the API runs with `--max-staleness N`, only
as many as keep every rollout in flight within N versions of the step that will train it
(`pacing`: long rollouts are waited for, not discarded). When the cap drops, admission pauses;
rollouts already running finish and are sent (upstream cancelled them and threw the work away).

Every group is stamped with a `group_id` and its policy version: the lowest weight version the
inference servers reported (`policy_version` in their answers) for the calls its rollout made,
or, when they report none, the version the trainer last said it published (`policy_version` in
`/status-env`, from `POST /policy_version`) when its rollout started: the weights the servers
served then. A trainer that says nothing (atroposlib's, or `--sync none`) leaves the step of the
last batch handed out, as upstream stamped (which runs one sync ahead of the weights). With
`--teacher.*`, it gets the teacher's logprobs first (`atropos.envs.teacher`, started after
`setup()`, before registering). It goes through `Sender` (batching, idempotent retries, disk
spool). Status is polled every `status_interval` seconds with one session, and a failed poll
is logged and retried rather than fatal (upstream opened a session per poll, and three failed
polls killed the env). Step changes trigger evaluations and checkpoints by crossing multiples
of their period, so a jump of several periods still triggers once (upstream's modulo test
missed any jump of a whole period). Each step change also logs one
metrics record through the env's `wandb_log` to `{run_dir}/metrics.jsonl`, and to W&B when on
(docs/metrics.md). Each poll also sends the env's cumulative drop and failure counts, and while
most groups are dropped a line says so every 30 s (`watch.DropReport`); when nearly all go for
equal scores, that line and the summary end with what to do (`watch.drop_hint`).

Serve ends on its own, with status 0 and a line saying why, when the trainer is done: the step
reaches the `num_steps` the trainer registered (or `total_steps`, when lower), the queue holds
the data the remaining steps need, or the API no longer knows the env (the run was reset). It
gives up with status 1 when the API stays unreachable for `api_patience` seconds (the spool
keeps the groups), and at the first error that will repeat for every item (a missing package, a
model the server does not serve, an inference server never reached: `errors.fatal_reason`),
with one message naming the fix. SIGTERM or SIGINT, in any state (setup, waiting to register,
rolling out), stops admission, lets in-flight rollouts finish (up to `drain_timeout`; at once
when none is in flight or after a second signal), flushes the sender, disconnects, prints the
summary and exits 143 (SIGTERM) or 130 (SIGINT) (`stop.Stopper`; upstream handled no signals
and never disconnected).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import socket
import sys
import time
from collections import Counter, deque
from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from atropos.envs.config import ResolvedConfig
from atropos.envs.outcome import outcome_metrics
from atropos.envs.runner.control import ApiError, ControlClient
from atropos.envs.runner.deadline import Deadlines
from atropos.envs.runner.evaluate import VersionEvals
from atropos.envs.runner.groups import EnvDrops, JsonlSink, checked_groups, plural, ready_groups
from atropos.envs.runner.heap import FrozenHeap
from atropos.envs.runner.pacing import PaceInputs, Pacer, stalled
from atropos.envs.runner.sender import Sender
from atropos.envs.runner.stop import Stopped, Stopper
from atropos.envs.runner.watch import DropReport, FailureLog, drop_hint
from atropos.envs.teacher import Teacher
from atropos.envs.types import EvalHandlingEnum
from atropos.inference.base import PolicyVersions
from atropos.inference.errors import fatal_reason
from atropos.inference.latency import Latencies
from atropos.inference.server_metrics import scrape_servers
from atropos.metrics import MetricsError, MetricsSink, open_env_sink
from atropos.metrics.stats import completion_stats, summary, trained_tokens

if TYPE_CHECKING:  # annotations only: the runner drives an env, never imports its base
    from atropos.envs.base import BaseEnv

log = logging.getLogger("atropos.env")
T = TypeVar("T")
FINAL_REPORT_SECONDS = 5.0
"""How long an ending env waits for its final status report to be taken."""

if sys.version_info >= (3, 11):

    async def _within(seconds: float | None, aw: Awaitable[T]) -> T:
        """Await `aw` in this task (no extra task, unlike `wait_for`); TimeoutError after
        `seconds` (None: never)."""
        async with asyncio.timeout(seconds):
            return await aw

else:  # pragma: no cover - Python 3.10

    async def _within(seconds: float | None, aw: Awaitable[T]) -> T:
        """Await `aw`; TimeoutError after `seconds` (None: never)."""
        return await asyncio.wait_for(aw, seconds)


def _overrides(env: BaseEnv, hook: str) -> bool:
    """Whether `env` has its own `hook` (the base's does nothing; the runner does not import
    the base, so it is recognised by name)."""
    own = getattr(type(env), hook, None)
    name = (getattr(own, "__module__", None), getattr(own, "__qualname__", None))
    return name != ("atropos.envs.base", f"BaseEnv.{hook}")


def _overrides_cleanup(env: BaseEnv) -> bool:
    """Whether `env` has a `cleanup` of its own (else no coroutine per group for the no-op)."""
    return _overrides(env, "cleanup")


class ServeRunner:
    """Runs one env in serve mode."""

    status_interval = 0.5  # seconds between /status-env polls
    stale_after = 60.0  # seconds without a status before admission pauses
    drain_timeout = 60.0  # seconds in-flight rollouts get to finish at shutdown
    fatal_drain = 2.0  # ... after a fatal error (they will fail alike)
    api_patience = 600.0  # seconds without an answer from the API before serve gives up
    note_every = 10.0  # seconds between "still failing" lines of a wait
    server_wait = 300.0  # --server_wait when unset: vLLM may still be loading its model
    sender_backlog = 512  # groups waiting for the sender before admission pauses
    window_limit = 100_000  # sequences whose length and score a metrics window keeps

    def __init__(self, env: BaseEnv, resolved: ResolvedConfig, run_dir: Path) -> None:
        self.env = env
        self.config = env.config
        self.resolved = resolved
        self.run_dir = run_dir
        key = self.config.rollout_server_api_key
        self.api_key = key.get_secret_value() if key is not None else None
        self.workers: set[asyncio.Task[None]] = set()
        self.backlog: deque[Any] = deque()  # items to retry first, oldest first
        self.drops: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()  # rollouts by how they ended (envs.outcome)
        self.errors = FailureLog(self.failures, "rollout", self.outcomes, self.config.group_size)
        self.drop_report = DropReport()
        self.stopping = asyncio.Event()
        self.stopper = Stopper(self.stopping)
        self.ended = ""  # why the run ended on its own (trainer done, ...)
        self.failed = ""  # why the run gave up (exit status 1)
        self.trainer_steps = -1  # the num_steps the trainer registered
        self.published: int | None = None  # the version the trainer says the servers serve
        self.wake = asyncio.Event()
        self.eval_task: asyncio.Task[Any] | None = None
        self.eval_pending = False
        self.version_evals: VersionEvals | None = None  # --env.eval_every: made at the 1st poll
        self.last_status = 0.0
        self.submitted = 0  # groups handed to the sender
        self.submitted_at_poll = 0
        self.pending_at_poll = 0
        self.done = False
        self.sink: JsonlSink | None = None
        self.metrics_sink: MetricsSink | None = None
        # this trainer step's window (since the last metrics record), see _step_metrics
        self.logged_drops: Counter[str] = Counter()
        self.logged_failures: Counter[str] = Counter()
        self.lengths: list[int] = []  # trained tokens per sequence sent
        self.scores: list[float] = []
        self.durations: dict[str, list[float]] = {"succeeded": [], "failed": []}
        self.heap = FrozenHeap()
        self.deadlines = Deadlines(None)  # worker_timeout: set in `_run`, from the final config
        self.cleans_up = _overrides_cleanup(env)  # else no coroutine per group for the no-op
        self.postprocesses = _overrides(env, "postprocess_histories")  # likewise
        self.pacer = Pacer()  # rollouts in flight by version, and time paced (`pacing`)
        self.latency = Latencies()  # p50/p95/p99 by stage, sent with each status poll
        self.pace_inputs: PaceInputs | None = None  # the API's figures, when it has a limit
        self.logged_paced = (0.0, 0)  # paced seconds and stretches at the last metrics record
        self.stalled_since: float | None = None  # since when pacing lets nothing start
        self.stall_noted = 0.0  # when that was last logged (time.monotonic())
        self.teacher: Teacher | None = None  # --teacher.*: started after the env's setup
        spool = Path(self.config.spool_dir or run_dir / "spool")
        self.sender = Sender(
            self.config.rollout_server_url,
            spool / f"{self._identity()}.jsonl",
            api_key=self.api_key,
        )
        self.sender.on_done = self._delivered
        managing = getattr(env, "manager_config", None)
        if managing is not None and getattr(managing, "server_wait", 0) is None:
            managing.server_wait = self.server_wait

    def _identity(self) -> str:
        name = self.config.env_key or self.config.wandb_name or type(self.env).__name__
        return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)

    # ----- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until the trainer is done, a signal, or a failure; return the exit status."""
        with self.stopper.install("finishing in-flight rollouts, then exiting"):
            return await self._run()

    async def _run(self) -> int:
        stopper = self.stopper
        async with ControlClient(self.config.rollout_server_url, self.api_key) as api:
            self.api = api
            try:
                await stopper.race(self.env.setup())
                self.teacher = await stopper.race(Teacher.start(self.env))
                await self._register()
            except Stopped:
                await self.env.aclose()
                log.warning("stopped by %s before registering: sent no groups", stopper.name)
                return stopper.exit_code
            except ApiError as err:
                await self.env.aclose()
                log.error("%s", err)
                return 1
            except Exception as err:  # one clear line for a fatal error; a traceback otherwise
                reason = fatal_reason(err)
                if reason is None:  # a ConfigError: `runner.run` says it in one line, exit 2
                    await self.env.aclose()
                    raise
                await self.env.aclose()
                log.error("setup failed: %s; stopping", reason)
                return 1
            try:
                self._open_metrics(await self._wandb_info())
            except MetricsError as err:
                log.error("%s", err)
                if self.env.env_id is not None:
                    with contextlib.suppress(ApiError):
                        await self.api.disconnect(self.env.env_id)
                await self.env.aclose()
                return 1
            if self.config.data_path_to_save_groups:
                self.sink = JsonlSink(Path(self.config.data_path_to_save_groups))
            await self.sender.start()
            poller = asyncio.create_task(self._poll_status())
            timeout = self.config.worker_timeout
            self.deadlines = Deadlines(timeout if timeout > 0 else None)
            watch = asyncio.create_task(self.deadlines.watch())  # also while draining
            try:
                with self.heap, self.latency.bind():  # rollouts' tasks note their stages
                    await self._admit()
            finally:
                poller.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await poller
                try:
                    await self._shutdown()
                finally:
                    watch.cancel()
        if self.errors.fatal is not None or self.failed:
            return 1
        return stopper.exit_code

    async def _register(self) -> None:
        cfg = self.config
        request = {
            "max_token_length": cfg.max_token_length,
            "desired_name": cfg.wandb_name or self.env.name or type(self.env).__name__,
            "weight": cfg.inference_weight,
            "group_size": cfg.group_size,
            "min_batch_allocation": cfg.min_batch_allocation,
            "env_key": cfg.env_key or f"{socket.gethostname()}:{self._identity()}",
        }
        reply = await self.api.register(request, cfg.register_timeout, self.stopper)
        env = self.env
        self.trainer_steps = int(reply.get("num_steps", -1) or -1)
        env.env_id = reply["env_id"]
        env.wandb_prepend = reply.get("wandb_name")
        env.curr_step = int(reply.get("starting_step", 0))
        self._note_published(reply)
        env.checkpoint_dir = reply.get("checkpoint_dir") or str(self.run_dir / "checkpoints")
        env.checkpoint_interval = int(reply.get("checkpoint_interval", -1))
        if cfg.total_steps == -1:
            cfg.total_steps = int(reply.get("num_steps", -1))
            if cfg.total_steps == -1:
                raise ApiError("total_steps is -1 and the trainer registered num_steps -1")
        info = await self.stopper.race(self.api.info())
        if info.get("batch_size", -1) != -1:
            cfg.batch_size = int(info["batch_size"])
        env.max_token_len = int(info.get("max_token_len", -1))
        if cfg.batch_size != -1 and cfg.group_size > cfg.batch_size:
            raise ApiError(
                f"group_size {cfg.group_size} is larger than the trainer's batch_size"
                f" {cfg.batch_size}: no batch could ever hold a group"
            )
        if env.curr_step > 0:
            env.load_checkpoint()
        log.warning(
            "registered as %s (env_id %s) at step %d", env.wandb_prepend, env.env_id, env.curr_step
        )

    async def _wandb_info(self) -> dict[str, Any]:
        """The trainer's W&B project and group (`GET /wandb_info`); {} when W&B is off."""
        if not self.config.use_wandb:
            return {}
        try:
            info: dict[str, Any] = await self.api.call("GET", "/wandb_info")
        except ApiError as err:
            log.warning("could not read the trainer's W&B project: %s", err)
            return {}
        return info

    def _open_metrics(self, wandb_info: dict[str, Any]) -> None:
        """Metrics to `{run_dir}/metrics.jsonl`, and to W&B when on (`atropos.metrics.envs`)."""
        self.metrics_sink = open_env_sink(
            self.env,
            self.run_dir / "metrics.jsonl",
            wandb_info=wandb_info,
            config=self.resolved.redacted(),
            wandb_dir=self.run_dir,
        )
        self.env.metrics_sink = self.metrics_sink

    # ----- admission ----------------------------------------------------------------------------

    def capacity(self) -> int:
        """How many rollouts may be in flight now: the rules below, then staleness pacing."""
        cap = self._capacity()
        pace = self._pace_limit()
        if pace is None:
            self.pacer.note(False)
            return cap
        self.pacer.note(pace < cap and len(self.workers) >= pace)
        return min(cap, pace)

    def _note_stall(self) -> None:
        """Say, every `note_every` s, when pacing has let nothing start for that long (a
        moment of it is normal: with a limit of 0, between a batch and its weights)."""
        inputs = self.pace_inputs
        reason = None
        if inputs is not None and self.config.pace_staleness:
            reason = stalled(inputs, self.version_now())
        now = time.monotonic()
        if reason is None:
            self.stalled_since = None
            return
        if self.stalled_since is None:
            self.stalled_since = now
        elif min(now - self.stalled_since, now - self.stall_noted) >= self.note_every:
            self.stall_noted = now
            log.warning("staleness pacing: %s", reason)

    def _delivered(self, versions: list[Any]) -> None:
        """The sender is done with groups of these policy versions: pacing no longer counts
        them in flight."""
        for version in versions:
            if isinstance(version, int):
                self.pacer.release(version)

    def _pace_limit(self) -> int | None:
        """The most rollouts in flight that keep each within the API's `max_staleness`
        (`pacing`); None when the API announces no limit or `pace_staleness` is off."""
        inputs = self.pace_inputs
        if inputs is None or not self.config.pace_staleness:
            return None
        g = self.config.group_size
        unseen = self.submitted - self.submitted_at_poll + self.pending_at_poll
        queued = inputs.waiting_sequences + unseen * g
        return self.pacer.limit(inputs, self.version_now(), queued, g)

    def _capacity(self) -> int:
        cfg, status = self.config, self.env.status_dict
        cap = cfg.max_num_workers
        if self.eval_task is not None and not self.eval_task.done():
            if cfg.eval_handling == EvalHandlingEnum.STOP_TRAIN:
                return 0
            if cfg.eval_handling == EvalHandlingEnum.LIMIT_TRAIN:
                cap = int(cap * cfg.eval_limit_ratio)
        if time.monotonic() - self.last_status > self.stale_after:
            return 0  # no word from the API for a while: do not pile up work
        if self.sender.pending >= self.sender_backlog:
            return 0  # made faster than sent: wait for the sender rather than pile up groups
        k, b, g = cfg.max_batches_offpolicy, cfg.batch_size, cfg.group_size
        if k > 0 and b > 0 and status:
            # groups made since the status was asked for are not in it yet: count them too
            unseen = self.submitted - self.submitted_at_poll + self.pending_at_poll
            queued = int(status.get("queue_size", 0)) + unseen
            budget = k * b // g - queued
            a = cfg.min_batch_allocation
            if a:
                m = max(1, int(status.get("max_group_size", g)))
                own = int(status.get("self_queue_size", 0)) * g
                floor = math.ceil(((math.ceil(a * b * k / m) + m // g) * m - own) / g)
                budget = max(budget, floor)
            cap = min(cap, max(0, budget))
        return cap

    async def _admit(self) -> None:
        while not self.stopping.is_set() and not self.done:
            while len(self.workers) < self.capacity() and not self.stopping.is_set():
                item = self.backlog.popleft() if self.backlog else await self.env.get_next_item()
                if item is None:
                    break
                task = asyncio.create_task(self._work(item))
                self.workers.add(task)
                task.add_done_callback(self._finished)
            self.wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await _within(0.25, self.wake.wait())  # no task per wait, unlike wait_for

    def _finished(self, task: asyncio.Task[None]) -> None:
        self.workers.discard(task)
        self.wake.set()

    async def _work(self, item: Any) -> None:
        """Roll out `item`, then, while admission allows, the next items in the same task: a
        finished rollout's slot is refilled at once instead of a few loop turns later through
        `_admit` (at 256 workers those turns left ~4% of the slots empty).

        `collect_trajectories` is awaited in this frame (`worker_timeout` by `Deadlines.start`,
        `expired`, `stop`), the checks are plain calls (`checked_groups`; a teacher and an own
        `postprocess_histories` are awaited): every resume of a rollout passes through each
        coroutine frame above the env's, two fewer than with a `_handle` and `within`."""
        task: asyncio.Task[Any] | None = asyncio.current_task()  # once per task, not per item
        assert task is not None
        env, deadlines = self.env, self.deadlines
        while True:
            seen = PolicyVersions()  # its servers' versions: pacing counts the oldest one
            flight = self.pacer.start(self.version_now(), seen)
            started = time.monotonic()
            try:
                with seen, EnvDrops() as dropped:  # ... and why the env dropped it
                    deadlines.start(task, started)
                    try:
                        result, more = await env.collect_trajectories(item)
                    except asyncio.CancelledError:
                        if not deadlines.expired(task):
                            raise
                        raise asyncio.TimeoutError from None
                    finally:
                        deadlines.stop(task)
                    if more:
                        self.backlog.extend(more)
                    if self.postprocesses:
                        result = await env.postprocess_histories(result)
                version = flight.version if seen.lowest is None else seen.lowest
                if self.teacher is None:
                    ready = self._checked(result, dropped, version)
                else:  # outside the block: its answers say nothing about the policy's version
                    ready = await ready_groups(
                        env, result, dropped, self.drops,
                        max_token_len=env.max_token_len, policy_version=version,
                        env_id=env.env_id, teacher=self.teacher, outcomes=self.outcomes,
                    )  # fmt: skip
            except Exception as err:  # a failed rollout is counted; fatal only when all will fail
                self._failed(err, started)
            else:
                self._send(ready, started)
                del result, ready  # freed now, while in the caches, not at the next assignment
                if self.cleans_up:
                    with contextlib.suppress(Exception):
                        await env.cleanup()
            finally:
                self.pacer.finish(flight)
            # this task holds one of the slots counted by capacity()
            if self.stopping.is_set() or self.done or len(self.workers) > self.capacity():
                return
            if self.backlog:
                item = self.backlog.popleft()
            else:
                item = await env.get_next_item()
                if item is None:
                    return

    def _checked(self, result: Any, dropped: EnvDrops, version: int) -> list[dict[str, Any]]:
        """The groups of `result` to send without a teacher (`groups.checked_groups`)."""
        env = self.env
        return checked_groups(
            env, result, dropped, self.drops,
            max_token_len=env.max_token_len, policy_version=version, env_id=env.env_id,
            outcomes=self.outcomes,
        )  # fmt: skip

    def _failed(self, err: Exception, started: float) -> None:
        """Count a rollout that failed (or ran past `worker_timeout`); stop when it is fatal."""
        cfg = self.config
        self.durations["failed"].append(time.monotonic() - started)
        if isinstance(err, asyncio.TimeoutError):
            self.failures["timeout"] += 1
            self.outcomes["failed/timeout"] += cfg.group_size
            log.warning("rollout timed out after %.0f s; dropped", cfg.worker_timeout)
        elif self.errors.record(err):
            self._stop()

    def _send(self, ready: list[dict[str, Any]], started: float) -> None:
        """Hand a finished rollout's groups to the sender, noting them for the step metrics."""
        took = time.monotonic() - started
        self.durations["succeeded"].append(took)
        self.latency.record("rollout", took)
        env, sender, pacer = self.env, self.sender, self.pacer
        for group in ready:
            if self.sink is not None:
                self.sink.write(group)
            if len(self.lengths) < self.window_limit:
                self.lengths.extend(trained_tokens(group["masks"]))
                self.scores.extend(group["scores"])
            version = group.get("policy_version")
            if isinstance(version, int):
                pacer.hold(version)  # in flight for pacing until the API has it
            sender.submit(group)
            self.submitted += 1
            env.items_sent_this_step += 1
        self.heap.settle()

    # ----- status, evaluations, checkpoints -----------------------------------------------------

    def _stop(self, ended: str = "", failed: str = "") -> None:
        """End admission: the run is over (`ended`), or gave up (`failed`, status 1)."""
        if ended and not self.ended:
            self.ended = ended
            log.warning("%s: stopping", ended)
        if failed and not self.failed:
            self.failed = failed
            log.error("%s", failed)
        self.done = True
        self.stopping.set()
        self.wake.set()

    def _server_report(self) -> list[dict[str, Any]] | None:
        """The env's inference servers now, for the API's dashboard (None: no manager yet)."""
        report = getattr(getattr(self.env, "_server", None), "server_report", None)
        try:
            return report() if callable(report) else None
        except Exception:
            log.exception("reading the inference servers' report failed")
            return None

    async def _poll_status(self) -> None:
        env_id = self.env.env_id
        assert env_id is not None
        answered = False
        failing_since: float | None = None
        noted = 0.0
        while True:
            asked_at, pending = self.submitted, self.sender.pending + self.sender.in_flight
            self.drop_report.check(self.drops, self.failures, self.submitted)
            scrape_servers(self.env, self.latency)  # ttft, server_queue: read in the background
            try:
                status = await self._report_status(env_id)
            except ApiError as err:
                now = time.monotonic()
                if answered and "HTTP 404" in str(err):
                    self._stop(
                        ended=f"the API no longer knows env {env_id} ({err}): the run was"
                        " reset, or the API restarted without its store"
                    )
                    return
                if failing_since is None:
                    failing_since, noted = now, now
                    log.warning("status poll failed (will retry): %s", err)
                elif now - failing_since > self.api_patience:
                    self._stop(
                        failed=f"the API at {self.config.rollout_server_url} has not"
                        f" answered for {now - failing_since:.0f} s ({err}); check that it"
                        " runs; the groups not sent are in the spool"
                    )
                    return
                elif now - noted >= self.note_every:
                    noted = now
                    log.warning(
                        "waiting for the API: no status for %.0f s of %.0f s (%s)",
                        now - failing_since,
                        self.api_patience,
                        err,
                    )
            else:
                if failing_since is not None:
                    log.warning("the API answers again")
                answered, failing_since = True, None
                self.last_status = time.monotonic()
                self.submitted_at_poll, self.pending_at_poll = asked_at, pending
                self.env.status_dict = status
                try:
                    await self._on_status(status)
                except Exception:  # a failing hook (checkpoint, logging) must not stop the env
                    log.exception("handling a status update failed")
                self.wake.set()
            await asyncio.sleep(self.status_interval)

    async def _report_status(self, env_id: int) -> dict[str, Any]:
        """`/status-env` with the env's counts, servers, latency stages and paced time now."""
        return await self.api.status(
            env_id, self.drops, self.failures, self._server_report(),
            self.latency.summaries(), self.pacer.paced_total(), self.outcomes
        )  # fmt: skip

    async def _final_report(self) -> None:
        """One last status report once every group is sent, so the API ends with the env's
        final counts (drops, failures, outcomes, latency) rather than those of its last poll;
        bounded by `FINAL_REPORT_SECONDS`, and only logged when it cannot be delivered."""
        env_id = self.env.env_id
        if env_id is None:
            return
        try:
            await asyncio.wait_for(self._report_status(env_id), FINAL_REPORT_SECONDS)
        except (ApiError, asyncio.TimeoutError) as err:
            log.info("the final status report was not delivered: %s", err or "deadline")

    def version_now(self) -> int:
        """The version of the weights a rollout starting now is generated by (as far as the
        API knows): the last one the trainer published, else the API's step."""
        return self.env.curr_step if self.published is None else self.published

    def _note_published(self, answer: dict[str, Any]) -> None:
        version = answer.get("policy_version")
        self.published = int(version) if isinstance(version, int) else None

    async def _on_status(self, status: dict[str, Any]) -> None:
        env, cfg = self.env, self.config
        self._note_published(status)
        self.pace_inputs = PaceInputs.of(status)
        self.pacer.refresh()
        self._note_stall()
        old, new = env.curr_step, int(status.get("current_step", env.curr_step))
        weight = status.get("env_weight")
        if weight is not None and env._server is not None:  # the share of inference capacity
            env._server.update_weight(float(weight))
        last = self.trainer_steps
        if last > 0 and new >= last:
            self._stop(ended=f"the trainer reached its last step ({new} of {last})")
            return
        if new != old:
            env.curr_step = new
            period = cfg.steps_per_eval if cfg.eval_every <= 0 else 0  # eval_every replaces it
            if period > 0 and new // period > old // period:
                self._start_eval()
            period = env.checkpoint_interval
            if period > 0 and new // period > old // period:
                env.save_checkpoint((new // period) * period)
            floor = cfg.min_items_sent_before_logging  # upstream: skip thin steps
            if floor <= 0 or env.items_sent_this_step >= floor:
                await env.wandb_log(self._step_metrics())
                env.items_sent_this_step = 0
        if self.eval_pending and (self.eval_task is None or self.eval_task.done()):
            self._start_eval()
        if cfg.eval_every > 0:  # each N-th policy version, beside the rollouts (VersionEvals)
            if self.version_evals is None:
                self.version_evals = VersionEvals(env, self.api, cfg.eval_every)
            self.version_evals.seen(self.version_now())
        b, total = cfg.batch_size, cfg.total_steps
        if last > 0:
            total = min(total, last)
        if b > 0 and new + int(status.get("queue_size", 0)) * cfg.group_size // b > total:
            self._stop(ended=f"step {new}: the trainer has all the data its {total} steps need")

    def _start_eval(self) -> None:
        if self.eval_task is not None and not self.eval_task.done():
            self.eval_pending = True  # run it when the current one ends: never skipped
            return
        self.eval_pending = False
        self.eval_task = asyncio.create_task(self.env.evaluate())

    def _step_metrics(self) -> dict[str, float]:
        """What the runner knows about the window since the last record, then a fresh window.

        Counts (`items_sent_to_api`, `items_rejected`, `dropped/*`, `failed/*`) and the
        statistics cover the window; `workers`, `backlog` and `sender/pending` are gauges now;
        `sender/*_total` count since the env started. Names and meanings: docs/metrics.md.
        """
        env, stats = self.env, self.sender.stats
        dropped, failed = self.drops - self.logged_drops, self.failures - self.logged_failures
        metrics: dict[str, float] = {
            "train/items_sent_to_api": float(env.items_sent_this_step),
            "train/items_rejected": float(sum(dropped.values())),
            "train/workers": float(len(self.workers)),
            "train/backlog": float(len(self.backlog)),
            "sender/pending": float(self.sender.pending),
            "sender/sent_total": float(stats.sent),
            "sender/spooled_total": float(stats.spooled),
            "sender/replayed_total": float(stats.replayed),
            "sender/rejected_total": float(stats.rejected),
        }
        for reason in self.drops:  # every reason seen so far, 0 when none this window
            metrics[f"train/dropped/{reason}"] = float(dropped[reason])
        for kind in self.failures:
            metrics[f"train/failed/{kind}"] = float(failed[kind])
        metrics.update(outcome_metrics(self.outcomes))  # totals since the env started
        metrics.update(self._pacing_metrics())
        metrics.update(self.latency.metrics())  # latency/<stage>_p50, ... (recent window)
        if self.scores:
            metrics["train/score_mean"] = sum(self.scores) / len(self.scores)
        metrics.update(completion_stats(self.lengths, env.max_token_len))
        done = self.durations["succeeded"] + self.durations["failed"]
        metrics.update(summary(done, "train_perf/task_duration"))
        metrics.update(summary(self.durations["succeeded"], "train_perf/succeeded_task_duration"))
        metrics.update(summary(self.durations["failed"], "train_perf/failed_task_duration"))
        server_metrics = getattr(
            getattr(env, "_server", None), "metrics", None
        )  # none made yet: none to report
        if callable(server_metrics):
            try:
                metrics.update(server_metrics())
            except Exception:
                log.exception("reading the inference servers' metrics failed")
        self.logged_drops, self.logged_failures = Counter(self.drops), Counter(self.failures)
        self.lengths, self.scores = [], []
        self.durations = {"succeeded": [], "failed": []}
        return metrics

    def _pacing_metrics(self) -> dict[str, float]:
        """Time paced in this window (seconds, stretches started) and the API's drops of this
        env's groups by reason (totals since the API started), when it runs with a limit."""
        seconds, count = self.pacer.paced_total(), self.pacer.paced_count
        last_seconds, last_count = self.logged_paced
        self.logged_paced = (seconds, count)
        if self.pace_inputs is None:
            return {}
        metrics = {
            "train/paced_seconds": seconds - last_seconds,
            "train/paced_count": float(count - last_count),
        }
        dropped = self.env.status_dict.get("api_dropped")
        if isinstance(dropped, dict):
            for reason, n in dropped.items():
                if isinstance(n, int):
                    metrics[f"train/api_dropped/{reason}_total"] = float(n)
        return metrics

    async def _drain(self) -> None:
        """Let in-flight rollouts finish: up to `drain_timeout` s, `fatal_drain` s after a
        fatal error, and no longer once a second signal comes."""
        if not self.workers:
            return
        limit = self.drain_timeout if self.errors.fatal is None else self.fatal_drain
        log.warning("waiting up to %.0f s for %d in-flight rollouts", limit, len(self.workers))
        urgent = asyncio.ensure_future(self.stopper.urgent.wait())
        try:
            end = time.monotonic() + limit
            while self.workers and not urgent.done() and time.monotonic() < end:
                await asyncio.wait(
                    {*self.workers, urgent},
                    timeout=end - time.monotonic(),
                    return_when=asyncio.FIRST_COMPLETED,
                )
        finally:
            urgent.cancel()

    async def _shutdown(self) -> None:
        await self._drain()
        cancelled = list(self.workers)
        for task in cancelled:
            task.cancel()
        await asyncio.gather(*cancelled, return_exceptions=True)
        if self.eval_task is not None and not self.eval_task.done():
            self.eval_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.eval_task
        if self.version_evals is not None:
            await self.version_evals.close()
        await self.sender.close()
        if not self.failed:  # an API that stopped answering is not waited for again
            await self._final_report()
        if self.sink is not None:
            self.sink.close()
        if self.metrics_sink is not None:
            self.env.metrics_sink = None
            self.metrics_sink.close()
        if self.env.env_id is not None:
            with contextlib.suppress(ApiError):
                await self.api.disconnect(self.env.env_id)
        await self.env.aclose()
        stats = self.sender.stats
        counts = (
            f"{plural(stats.sent, 'group')} sent, {stats.spooled:,} spooled, drops"
            f" {dict(self.drops)}, failures {dict(self.failures)}"
        )
        if self.pacer.paced_count:
            counts += (
                f", paced {self.pacer.paced_total():.1f} s"
                f" ({plural(self.pacer.paced_count, 'time')})"
            )
        hint = drop_hint(self.drops, stats.sent)
        if hint is not None:
            counts += f": {hint}"
        if self.errors.fatal is not None:
            log.error("%s; stopped: %s", self.errors.fatal, counts)
        elif self.failed:
            log.error("gave up: %s", counts)
        elif self.stopper.signum is not None:
            log.warning("stopped by %s: %s", self.stopper.name, counts)
        else:
            log.warning("stopped (%s): %s", self.ended or "asked to", counts)

"""`evaluate`: run the env's evaluation once, into `{folder}/metrics.jsonl` (and W&B when on);
and `VersionEvals`, serve's evaluation of each N-th policy version during training.

The folder is `data_dir_to_save_evals`, or `runs/<name>`. An error that will repeat for every
item (a missing package, a model the server does not serve, an inference server never reached
within `--server_wait` seconds, or every server of the policy or the judge unreachable that long
in a row: `errors.fatal_reason`) ends the run with one message naming the fix and status 1;
another error is logged with its traceback, status 1. SIGINT or SIGTERM, in any state (setup,
waiting for a server, mid-evaluation), cancels the evaluation after `grace` seconds (at once
after a second signal), closes the metrics, prints the summary and exits 130 (SIGINT) or 143
(SIGTERM) (`stop.Stopper`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from pathlib import Path
from typing import Any

from atropos.envs.config import ConfigError, ResolvedConfig
from atropos.envs.runner.config_file import save_config
from atropos.envs.runner.stop import Stopper
from atropos.inference.errors import fatal_reason
from atropos.metrics.envs import open_env_sink
from atropos.wire import REPORT_MAX_NAME_LENGTH, REPORT_MAX_NAMES

log = logging.getLogger("atropos.env")


class EvaluateRunner:
    """Runs one env's evaluation once."""

    grace = 1.0  # seconds the evaluation gets to finish after a stop signal

    def __init__(self, env: Any, resolved: ResolvedConfig, name: str) -> None:
        self.env = env
        self.resolved = resolved
        out = resolved.env.data_dir_to_save_evals
        self.out = Path(out) if out else None
        self.folder = self.out or Path("runs") / name
        self.stopper = Stopper()

    async def run(self) -> int:
        with self.stopper.install("stopping the evaluation"):
            return await self._run()

    async def _run(self) -> int:
        env, stopper = self.env, self.stopper
        save_config(self.resolved, self.folder / "evaluate_config.yaml")
        env.metrics_sink = open_env_sink(
            env,
            self.folder / "metrics.jsonl",
            config=self.resolved.redacted(),
            wandb_dir=self.folder,
        )
        task = asyncio.ensure_future(self._setup_and_evaluate())
        stop = asyncio.ensure_future(stopper.event.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not task.done():  # a signal: a moment to finish, then cancel
                urgent = asyncio.ensure_future(stopper.urgent.wait())
                await asyncio.wait({task, urgent}, timeout=self.grace)
                urgent.cancel()
        finally:
            stop.cancel()
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await env.aclose()
            env.metrics_sink.close()
            env.metrics_sink = None
        return self._summary(task)

    async def _setup_and_evaluate(self) -> Any:
        await self.env.setup()
        return await self.env.evaluate()

    def _summary(self, task: asyncio.Future[Any]) -> int:
        """Log the run's last line; return its exit status."""
        if task.cancelled():
            log.warning(
                "stopped by %s: the evaluation did not finish (%s)",
                self.stopper.name,
                self.folder / "metrics.jsonl",
            )
            return self.stopper.exit_code
        err = task.exception()
        if isinstance(err, ConfigError):  # a usage error: `runner.run` says it in one line
            raise err
        if err is not None:
            reason = fatal_reason(err)
            if reason is not None:
                log.error("evaluation failed: %s", reason)
            else:
                log.error("evaluation failed: %s", err, exc_info=err)
            return 1
        where = self.folder / "metrics.jsonl"
        if getattr(self.env, "evaluations_shown", 0):  # the env's own line showed the metrics
            log.warning("evaluated: metrics above, in %s", where)
        else:
            log.warning("evaluated: %s (%s)", task.result(), where)
        if self.stopper.signum is not None:
            return self.stopper.exit_code
        return 0


class VersionEvals:
    """`atropos env serve --env.eval_every N`: evaluate the policy version the trainer has just
    published, while rollouts go on, and send the results to the API stamped with it.

    The runner calls `seen(version)` at every status poll with the version rollouts start at
    now (the trainer's last `POST /policy_version`, else the step). When the first poll sees
    version 0 (the untrained policy: the baseline of every curve), or a later one crosses a
    multiple of N (a jump over several multiples evaluates once, the version now served), one
    evaluation (`env.evaluate()`) starts in its own task. Its calls go to the servers' eval
    budget (`split="eval"`: `ServerManager`'s own per-server concurrency for evaluation,
    `APIServerConfig.num_requests_for_eval`), so training rollouts keep their slots, and
    `eval_handling` does not apply: rollouts are never paused for it. One evaluation at a
    time: a version that comes due while one runs is skipped and counted (`skipped`).

    The result is `POST /eval_results` with the policy version: the lowest version the servers
    reported for the evaluation's calls, else the version it started at (with `keep`-mode
    weight transfer the weights can change during an evaluation; the oldest is the honest
    stamp). The metrics are what `evaluate()` returned, else what it gave `evaluate_log`.
    A failed evaluation is logged and sends nothing; the next multiple tries again.
    """

    def __init__(self, env: Any, api: Any, every: int) -> None:
        self.env = env
        self.api = api
        self.every = every
        self.last: int | None = None  # the version seen at the last poll
        self.task: asyncio.Task[None] | None = None
        self.skipped = 0
        self.done: list[int] = []  # versions evaluated and sent

    def seen(self, version: int) -> None:
        """A status poll says rollouts now start at `version`."""
        last, self.last = self.last, version
        if last is None:  # the first poll: only the untrained policy, every curve's baseline
            if version != 0:  # an env (re)started mid-run: the next multiple, as usual
                return
        elif version // self.every <= last // self.every:
            return
        if self.task is not None and not self.task.done():
            self.skipped += 1
            log.warning(
                "policy version %d: evaluation of the previous one still running; skipped"
                " (%d so far)",
                version,
                self.skipped,
            )
            return
        self.task = asyncio.create_task(self._evaluate(version))

    async def _evaluate(self, version: int) -> None:
        from atropos.inference.base import PolicyVersions

        env = self.env
        env.last_eval_metrics = None
        start = time.monotonic()
        try:
            with PolicyVersions() as reported:
                result = await env.evaluate()
        except Exception as err:
            log.error("evaluation of policy version %d failed: %s", version, err, exc_info=err)
            return
        metrics = _numbers(result if isinstance(result, dict) else env.last_eval_metrics or {})
        stamp = version if reported.lowest is None else reported.lowest
        try:
            await self.api.post_eval(
                env.env_id, stamp, metrics, time.monotonic() - start, self.skipped
            )
        except Exception as err:  # the API's trouble must not stop the env
            log.warning("could not send the evaluation of version %d: %s", stamp, err)
            return
        self.done.append(stamp)

    async def close(self) -> None:
        """Cancel an evaluation still running (serve is ending)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numeric entries of `metrics`, names cut to the API's limit, 64 at most.

    >>> _numbers({"acc": 0.5, "n": 3, "note": "x", "bad": float("nan"), "flag": True})
    {'acc': 0.5, 'n': 3.0}
    """
    out: dict[str, float] = {}
    for name, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value) and len(out) < REPORT_MAX_NAMES:
            out[str(name)[:REPORT_MAX_NAME_LENGTH] or "unnamed"] = float(value)
    return out

"""`evaluate`: run the env's evaluation once, into `{folder}/metrics.jsonl` (and W&B when on).

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
import logging
from pathlib import Path
from typing import Any

from atropos.envs.config import ConfigError, ResolvedConfig
from atropos.envs.runner.config_file import save_config
from atropos.envs.runner.stop import Stopper
from atropos.inference.errors import fatal_reason
from atropos.metrics.envs import open_env_sink

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

"""Runners: `serve` (to the trajectory API), `process` (to files), `evaluate` (metrics).

`run(env_cls, resolved)` is where `MyEnv.cli()` and `atropos env serve|process|evaluate NAME`
end: it builds the env from the resolved configuration and runs the mode's loop.

Exit status, the same for the three runners: 0 when the run ended on its own, 1 on a failure
(said in one message), 130 after SIGINT (Ctrl-C) and 143 after SIGTERM, once what the run made
is flushed and its summary printed (`stop.Stopper`). A signal before the runner's loop starts
(while the env is built) gives the same status, without a summary.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from atropos.envs.config import ResolvedConfig

log = logging.getLogger("atropos.env")


class FrozenHeap:
    """Keep the garbage collector's work proportional to what rollouts allocate.

    After imports, `setup()` and the first rollouts an env holds a few hundred thousand
    long-lived objects (modules, tokenizer, dataset), and every full collection walks all of
    them: with hundreds of rollouts in flight, full collections came several times a second
    and took over a quarter of the env's CPU. `gc.freeze()` moves everything alive to a
    generation the collector never scans (instantly: no collection first, which would stall the
    loop as long as a full one). It runs on entry and once more at `settle()`, which the
    runners call when the first rollout is done: by then the lazily loaded tokenizer, backends
    and connections exist too. (Rollouts in flight at that moment are frozen as well; their
    objects are still freed by reference counting when they finish.)

    A rollout allocates thousands of small containers (token rows, messages, HTTP objects), so
    the default threshold of 700 allocations triggered a young collection every few rollouts,
    each promoting in-flight objects toward the older generations; the first threshold is
    raised to `young` for the run (about 20 times fewer young collections; measured: GC time
    at 256 workers down from about 2 s to 0.1 s per 20 s).

    `__exit__` restores the threshold and unfreezes, so a runner embedded in a longer process
    (a notebook, a test) leaves no trace.
    """

    def __init__(self, young: int = 20_000) -> None:
        self.young = young
        self.settled = False
        self._threshold: tuple[int, int, int] | None = None

    def __enter__(self) -> FrozenHeap:
        self._threshold = gc.get_threshold()
        first, *rest = self._threshold
        if first:  # 0: collection is disabled; leave it so
            gc.set_threshold(max(first, self.young), *rest)
        gc.freeze()
        return self

    def settle(self) -> None:
        """Freeze again, once: what the first rollout loaded is long-lived too."""
        if not self.settled:
            self.settled = True
            gc.freeze()

    def __exit__(self, *exc: object) -> None:
        if self._threshold is not None:
            gc.set_threshold(*self._threshold)
        gc.unfreeze()


RUN_DIR_VARIABLE = "ATROPOS_ENV_RUN_DIR"


def build_env(env_cls: type[Any], resolved: ResolvedConfig) -> Any:
    """Instantiate `env_cls` from a resolved configuration."""
    return env_cls(resolved.env, resolved.servers, manager=resolved.manager)


async def run_async(env: Any, resolved: ResolvedConfig) -> int:
    """Run an already-built env in `resolved.mode`; return an exit code."""
    name = resolved.env.wandb_name or env.name or type(env).__name__
    if resolved.mode == "serve":
        from atropos.envs.runner.serve import ServeRunner

        # `atropos launch` gives each env process a directory of its own (replicas of one env
        # must not share a spool); by hand, runs/NAME under the working directory
        run_dir = Path(os.environ.get(RUN_DIR_VARIABLE) or Path("runs") / name)
        run_dir.mkdir(parents=True, exist_ok=True)
        resolved.save(run_dir / "config.yaml")
        return await ServeRunner(env, resolved, run_dir).run()
    if resolved.mode == "process":
        from atropos.envs.runner.process import ProcessRunner

        return await ProcessRunner(env, resolved).run()
    if resolved.mode == "evaluate":
        from atropos.envs.runner.evaluate import EvaluateRunner

        return await EvaluateRunner(env, resolved, name).run()
    raise ValueError(f"unknown mode {resolved.mode!r}: use serve, process or evaluate")


def run_loop(main: Coroutine[Any, Any, int]) -> int:
    """`asyncio.run(main)`, on uvloop when it is installed (`uvicorn[standard]`, one of our
    dependencies, brings it): the env's loop and its HTTP clients then spend less CPU on every
    request. Plain asyncio otherwise, and with `ATROPOS_ASYNCIO=1`."""
    if os.environ.get("ATROPOS_ASYNCIO") != "1":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            run_on_uvloop = getattr(uvloop, "run", None)  # uvloop >= 0.18
            if run_on_uvloop is not None:
                return int(run_on_uvloop(main))
    return asyncio.run(main)


def run(env_cls: type[Any], resolved: ResolvedConfig) -> int:
    """Run `env_cls` in `resolved.mode` with the resolved configuration; return an exit code.

    With `--testing` the env talks to an in-process `FakeInferenceServer` (vLLM shape, the
    shipped tiny tokenizer) instead of real servers: the whole loop runs with no model.
    """
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        return _run(env_cls, resolved)
    except KeyboardInterrupt as err:  # a signal before a runner took the signals over
        log.warning("interrupted before the run started")
        return 143 if isinstance(err, _Terminated) else 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


class _Terminated(KeyboardInterrupt):
    """SIGTERM before a runner installed its own handlers."""


def _terminated(signum: int, frame: Any) -> None:
    raise _Terminated


def _run(env_cls: type[Any], resolved: ResolvedConfig) -> int:
    if not resolved.manager.testing:
        return run_loop(run_async(build_env(env_cls, resolved), resolved))
    from atropos.inference.config import APIServerConfig
    from atropos.testing import FakeInferenceServer

    with FakeInferenceServer() as fake:
        log.warning("--testing: using a fake inference server at %s", fake.base_url)
        resolved.servers = [
            APIServerConfig(
                base_url=fake.base_url,
                server_type="vllm",
                model_name=fake.model,
                tokenizer_name="tiny",
                health_check=False,
            )
        ]
        resolved.env.tokenizer_name = "tiny"  # the fake server's ids are the tiny tokenizer's
        return run_loop(run_async(build_env(env_cls, resolved), resolved))

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
import logging
import os
import signal
import sys
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from atropos.envs.config import ConfigError, ResolvedConfig
from atropos.envs.layering import env_name
from atropos.envs.runner.config_file import save_config

log = logging.getLogger("atropos.env")


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
        save_config(resolved, run_dir / "config.yaml")
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
    except ConfigError as err:  # found by the env's setup (a taskset it cannot load, ...)
        print(f"{env_name(env_cls)} {resolved.mode}: error: {err}", file=sys.stderr)
        return 2
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
    from atropos.testing.fake_server import FakeInferenceServer

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

"""Runners: `serve` (to the trajectory API), `process` (to files), `evaluate` (metrics).

`run(env_cls, resolved)` is where `MyEnv.cli()` and `atropos env serve|process|evaluate NAME`
end: it builds the env from the resolved configuration and runs the mode's loop.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from atropos.envs.config import ResolvedConfig

log = logging.getLogger("atropos.env")


def build_env(env_cls: type[Any], resolved: ResolvedConfig) -> Any:
    """Instantiate `env_cls` from a resolved configuration."""
    return env_cls(resolved.env, resolved.servers, manager=resolved.manager)


async def run_async(env: Any, resolved: ResolvedConfig) -> int:
    """Run an already-built env in `resolved.mode`; return an exit code."""
    name = resolved.env.wandb_name or env.name or type(env).__name__
    if resolved.mode == "serve":
        from atropos.envs.runner.serve import ServeRunner

        run_dir = Path("runs") / name
        run_dir.mkdir(parents=True, exist_ok=True)
        resolved.save(run_dir / "config.yaml")
        return await ServeRunner(env, resolved, run_dir).run()
    if resolved.mode == "process":
        from atropos.envs.runner.process import ProcessRunner

        return await ProcessRunner(env, resolved).run()
    if resolved.mode == "evaluate":
        await env.setup()
        try:
            await env.evaluate()
        finally:
            if env._server is not None:
                await env._server.aclose()
        out = resolved.env.data_dir_to_save_evals
        if out:
            resolved.save(Path(out) / "evaluate_config.yaml")
        return 0
    raise ValueError(f"unknown mode {resolved.mode!r}: use serve, process or evaluate")


def run(env_cls: type[Any], resolved: ResolvedConfig) -> int:
    """Run `env_cls` in `resolved.mode` with the resolved configuration; return an exit code.

    With `--testing` the env talks to an in-process `FakeInferenceServer` (vLLM shape, the
    shipped tiny tokenizer) instead of real servers: the whole loop runs with no model.
    """
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    if not resolved.manager.testing:
        return asyncio.run(run_async(build_env(env_cls, resolved), resolved))
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
        return asyncio.run(run_async(build_env(env_cls, resolved), resolved))

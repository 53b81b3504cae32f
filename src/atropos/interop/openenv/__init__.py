"""OpenEnv both ways: run an OpenEnv environment as an Atropos one, and serve ours as OpenEnv.

- In (`env_class`): `openenv:URL` (a running server) or `openenv:package.module:Class` (an
  installed environment class we serve in a subprocess, `launch`) is the environment `env.OpenEnv`:
  reset observations as prompts, replies as actions (`actions`), per-step rewards kept on the
  messages, the episode's return as its score, remote failures `failed/openenv_*` (`wire`).
- Out (`publish`): a registered Atropos environment served with OpenEnv's routes and WebSocket
  protocol (`serve`), so openenv-core's clients (TRL's, SkyRL's) can play it.

The protocol as openenv-core 0.3.0 speaks it, and what does not map, are in docs/ecosystem.md.
"""

from __future__ import annotations

from typing import Any

__all__ = ["env_class", "publish"]


def env_class(spec: str) -> Any:
    """The Atropos environment class playing `spec` (`openenv:URL` or
    `openenv:package.module:Class`, or the target alone)."""
    from atropos.interop.openenv.env import OpenEnv

    target = spec.partition(":")[2] if spec.startswith("openenv:") else spec
    return OpenEnv.named(target)


def publish(env_name: str, env_argv: list[str], host: str, port: int) -> None:
    """Serve the registered environment `env_name`, configured by `env_argv` (the flags of
    `atropos env serve NAME`), as an OpenEnv server on `host:port` until SIGINT or SIGTERM."""
    from atropos.interop.openenv.serve import publish as serve

    serve(env_name, env_argv, host, port)

"""What publishing in any protocol starts from: a registered environment, configured by the
flags `atropos env serve NAME` takes (`--env.*`; the inference server flags are accepted and
unused: the remote trainer is the policy)."""

from __future__ import annotations

from typing import Any

from atropos.envs import registry
from atropos.envs.base import BaseEnv
from atropos.envs.cli import parse
from atropos.envs.config import ConfigError

__all__ = ["configured_env"]


def configured_env(name: str, argv: list[str]) -> BaseEnv[Any]:
    """The environment `name` (a registered name, `module:Class` or a file), configured by
    `argv`, not set up.

    Raises:
        LookupError: an unknown environment.
        ValueError: bad flags, or an extra the environment needs and cannot import.
    """
    env_cls = registry.get(name)
    try:
        resolved = parse(env_cls, "serve", argv, prog=f"atropos env publish {name}")
    except ConfigError as e:
        raise ValueError(str(e)) from None
    missing = registry.missing_extras(env_cls, name)
    if missing is not None:
        raise ValueError(missing)
    env: BaseEnv[Any] = env_cls(resolved.env, resolved.servers, manager=resolved.manager)
    return env

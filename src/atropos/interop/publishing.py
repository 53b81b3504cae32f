"""What publishing in any protocol starts from: a registered environment, configured by the
flags `atropos env serve NAME` takes (`--env.*`; the inference server flags are accepted and
unused: the remote trainer is the policy)."""

from __future__ import annotations

from typing import Any

from atropos.envs import registry
from atropos.envs.base import BaseEnv
from atropos.envs.cli import parse
from atropos.envs.config import ConfigError

__all__ = ["KEY_VARIABLE", "configured_env", "take_api_key"]

KEY_VARIABLE = "ATROPOS_API_KEY"


def take_api_key(argv: list[str]) -> tuple[list[str], str | None]:
    """(`argv` less `--api-key KEY`, the key: that one, else `$ATROPOS_API_KEY`, else None).

    >>> take_api_key(["--env.x", "1", "--api-key=k"])
    (['--env.x', '1'], 'k')
    """
    import os

    rest, key = [], os.environ.get(KEY_VARIABLE) or None
    args = iter(argv)
    for arg in args:
        if arg == "--api-key":
            key = next(args, None) or key
        elif arg.startswith("--api-key="):
            key = arg.partition("=")[2] or key
        else:
            rest.append(arg)
    return rest, key


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

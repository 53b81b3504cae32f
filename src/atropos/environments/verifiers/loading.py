"""Loading a verifiers environment and its tasks, with verifiers' own loaders.

The verifiers `EnvConfig` is assembled from our settings: the taskset (`--env.taskset`,
`--env.taskset_args`), the agent's harness (`--env.harness`, default: the taskset's own when it
ships one, else `null`) and runtime (`--env.runtime`, default `subprocess`), another verifiers
`Env` (`--env.verifiers_env`, whose roles are then set in `--env.env_args`), and any other field
of verifiers' config (`--env.env_args`). `verifiers.v1.resolve_env_config` validates it
against the concrete classes and `load_environment` builds it, as verifiers' own CLI does.
"""

from __future__ import annotations

from typing import Any

from atropos.envs.config import ConfigError
from atropos.names import did_you_mean

__all__ = ["env_config", "load_env", "read_tasks"]


def env_config(settings: Any, taskset_args: dict[str, Any]) -> dict[str, Any]:
    """The raw verifiers EnvConfig for our settings (`VerifiersConfig`)."""
    import verifiers.v1 as vf

    if not settings.taskset:
        raise ConfigError("verifiers: no taskset named: run verifiers:NAME or set --env.taskset")
    raw: dict[str, Any] = dict(settings.env_args)
    raw["taskset"] = {**raw.get("taskset", {}), **taskset_args, "id": settings.taskset}
    if settings.verifiers_env:
        raw["id"] = settings.verifiers_env
        return raw
    harness = settings.harness or vf.default_harness_id(settings.taskset)
    if harness == "bash" and not settings.harness:  # verifiers' fallback; ours is `null`
        harness = "null"
    agent = dict(raw.get("agent", {}))
    agent["harness"] = {**agent.get("harness", {}), **settings.harness_args, "id": harness}
    agent.setdefault("runtime", {"type": settings.runtime})
    raw["agent"] = agent
    return raw


def load_env(settings: Any, taskset_args: dict[str, Any]) -> Any:
    """The verifiers `Env` for our settings; an unknown taskset or a bad setting is one
    ConfigError naming it (the run stops with it, exit 2)."""
    import verifiers.v1 as vf

    raw = env_config(settings, taskset_args)
    try:
        return vf.load_environment(vf.resolve_env_config(raw))
    except ModuleNotFoundError as err:
        raise ConfigError(_not_found(settings.taskset, err)) from None
    except (ValueError, TypeError) as err:  # pydantic's ValidationError is a ValueError
        raise ConfigError(f"verifiers taskset {settings.taskset!r}: {err}") from None


def _not_found(taskset: str, err: ModuleNotFoundError) -> str:
    import importlib.metadata

    installed = sorted(d.metadata["Name"] or "" for d in importlib.metadata.distributions())
    return f"verifiers taskset {taskset!r}: {err}" + did_you_mean(
        taskset, installed, repr, lead=" (an installed package: did you mean ", tail="?)"
    )


def read_tasks(taskset: Any, limit: int) -> list[Any]:
    """Up to `limit` tasks of a verifiers taskset, in its order (an endless one is cut)."""
    tasks = list(taskset.take(limit))
    if not tasks and limit:
        raise ValueError(f"verifiers taskset {type(taskset).__name__} yielded no tasks")
    return tasks

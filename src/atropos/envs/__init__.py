"""Environments: the BaseEnv hooks, the small Env class, configuration, runners, registry.

    from atropos.envs import BaseEnv, BaseEnvConfig, Env, ScoredDataGroup, check_env

Names load on first use, so `import atropos.envs` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BaseEnv": "atropos.envs.base",
    "BaseEnvConfig": "atropos.envs.config",
    "ResolvedConfig": "atropos.envs.config",
    "Env": "atropos.envs.simple",
    "check_env": "atropos.envs.check",
    "EnvCheckError": "atropos.envs.check",
    "EvalHandlingEnum": "atropos.envs.types",
    "Item": "atropos.envs.types",
    "Message": "atropos.envs.types",
    "ScoredDataGroup": "atropos.envs.types",
    "ScoredDataItem": "atropos.envs.types",
    "APIServerConfig": "atropos.inference.config",
    "ServerBaseline": "atropos.inference.config",
    "register": "atropos.envs.registry",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'atropos.envs' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)

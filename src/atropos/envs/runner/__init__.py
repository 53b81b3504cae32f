"""Runners: `serve` (to the trajectory API), `process` (to files), `evaluate` (metrics)."""

from __future__ import annotations

from typing import Any


def run(env_cls: type[Any], resolved: Any) -> int:
    """Run `env_cls` in `resolved.mode` with the resolved configuration; return an exit code."""
    raise NotImplementedError("the runners are being built (docs/design/env-runtime.md)")

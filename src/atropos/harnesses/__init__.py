"""Agent harnesses (real agent programs) run in sandboxes against the rollout proxy:
the interface (atropos.harnesses.base), one file per harness, and `HARNESSES`, the registry
by name. docs/harnesses.md."""

from __future__ import annotations

from atropos.harnesses.base import Harness, HarnessCall, HarnessExit, Installed

HARNESSES: dict[str, type[Harness]] = {}

__all__ = ["HARNESSES", "Harness", "HarnessCall", "HarnessExit", "Installed"]

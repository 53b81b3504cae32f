"""Agent harnesses (real agent programs) run in sandboxes against the rollout proxy: the
interface (`atropos.harnesses.base`), one file per harness, `HARNESSES` (the registry by name)
and `harness_named`. The environment is `atropos.harnesses.env.HarnessEnv`; docs/harnesses.md."""

from __future__ import annotations

import shutil

from atropos.harnesses.base import Harness, HarnessCall, HarnessExit, Installed
from atropos.harnesses.claude_code import ClaudeCode
from atropos.harnesses.codex import Codex
from atropos.harnesses.command import CommandHarness
from atropos.harnesses.mini_swe_agent import MiniSweAgent
from atropos.names import did_you_mean

HARNESSES: dict[str, type[Harness]] = {
    ClaudeCode.name: ClaudeCode,
    Codex.name: Codex,
    MiniSweAgent.name: MiniSweAgent,
}


def harness_named(name: str) -> Harness:
    """The registered harness `name`, or `name` as a command (`CommandHarness`). A single
    word that is neither registered nor a program on PATH is a `ValueError` (a misspelt
    harness, not a command that fails every rollout)."""
    if name in HARNESSES:
        return HARNESSES[name]()
    word = name.strip()
    if word and " " not in word and "/" not in word and shutil.which(word) is None:
        known = ", ".join(sorted(HARNESSES))
        raise ValueError(
            f"--env.harness {name!r}: no such harness{did_you_mean(word, HARNESSES, repr)}"
            f" (registered: {known}; anything else is run as a command)"
        )
    return CommandHarness(name)


__all__ = ["HARNESSES", "Harness", "HarnessCall", "HarnessExit", "Installed", "harness_named"]

"""`harness`: tasks done by a real agent program (Claude Code, Codex CLI, mini-SWE-agent, or
any command) in a sandbox whose only network is the rollout proxy, each scored by the task's
own test. `--env.harness NAME|COMMAND`, `--env.tasks swe_patch|TASKS.jsonl`. The environment
is `atropos.harnesses.env.HarnessEnv`; docs/harnesses.md."""

from __future__ import annotations

from atropos.harnesses.env import HarnessEnv, HarnessEnvConfig

__all__ = ["Harness", "HarnessEnvConfig"]


class Harness(HarnessEnv):
    """The registered `harness` environment."""

    name = "harness"

"""The rollout-limit settings every multi-turn environment shares: one set of `--env.*` names.

`LimitsConfig` is mixed into an env's config beside `BaseEnvConfig`; it adds `max_seconds` and
`truncated` (`score` or `mask`, `atropos.envs.outcome`); `ToolLimitsConfig` adds
`max_tool_calls` for envs whose policy calls tools (a game has none). Each env keeps its own
`max_turns` (defaults differ: a game's 10, textworld's 30) and its own token field
(`max_token_length`, `max_episode_tokens`), and builds its `RolloutLimits` with
`config.rollout_limits(max_turns=..., max_tokens=...)`, so all of them read alike in
`--help` and in docs/environments.md ("Rollout outcomes").

>>> class Cfg(ToolLimitsConfig):
...     max_turns: int = 4
>>> Cfg(max_tool_calls=3).rollout_limits(max_turns=4)
RolloutLimits(max_turns=4, max_tokens=None, max_tool_calls=3, max_seconds=None)
>>> Cfg(truncated="mask").truncated
'mask'
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from atropos.envs.outcome import RolloutLimits


class TruncatedConfig(BaseModel):
    """`truncated`: what becomes of an episode a limit cut (every multi-turn env, agents too)."""

    truncated: Literal["score", "mask"] = Field(
        default="score",
        description="an episode cut by a limit (turns, tokens, tool calls, seconds): scored as"
        " it stands, or masked (kept with its advantage set to zero)",
    )


class LimitsConfig(TruncatedConfig):
    """`max_seconds` and `truncated`, shared by the multi-turn envs."""

    max_seconds: float | None = Field(
        default=None, gt=0, description="wall seconds per episode at most (unset: no limit)"
    )

    def rollout_limits(
        self, *, max_turns: int | None = None, max_tokens: int | None = None
    ) -> RolloutLimits:
        """The env's `RolloutLimits`: its own turn and token bounds with the shared ones."""
        return RolloutLimits(
            max_turns=max_turns,
            max_tokens=max_tokens,
            max_tool_calls=getattr(self, "max_tool_calls", None),
            max_seconds=self.max_seconds,
        )


class ToolLimitsConfig(LimitsConfig):
    """`LimitsConfig` and `max_tool_calls`, for envs whose policy calls tools."""

    max_tool_calls: int | None = Field(
        default=None, ge=1, description="tool calls per episode at most (unset: no limit)"
    )

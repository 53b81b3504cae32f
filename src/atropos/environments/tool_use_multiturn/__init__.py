"""`tool_use_multiturn`: sequential and multi-turn function calling over replayed tool results;
upstream's multi-turn tool-use environment. Details: docs/tool_use_multiturn.md.

Modules: `episodes` (rows to episodes, fixture and hub data), `scoring` (the reward rules as
plain functions), `env` (the environment, its config and the token-exact rollout loop), `demo`
(an offline stand-in policy).
"""

from __future__ import annotations

from atropos.environments.tool_use_multiturn.demo import demo_responder
from atropos.environments.tool_use_multiturn.env import (
    ToolUseMultiTurn,
    ToolUseMultiTurnConfig,
    Trajectory,
)
from atropos.environments.tool_use_multiturn.episodes import (
    ExpectedTurn,
    ToolEpisode,
    load_episodes,
    to_episode,
)

__all__ = [
    "ExpectedTurn",
    "ToolEpisode",
    "ToolUseMultiTurn",
    "ToolUseMultiTurnConfig",
    "Trajectory",
    "demo_responder",
    "load_episodes",
    "to_episode",
]

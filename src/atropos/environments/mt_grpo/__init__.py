"""`mt_grpo`: multi-turn tool use with turn-level credit assignment (MT-GRPO), token-exact.

The policy answers questions about a made-up atlas by calling `lookup` and `calculator`, which
run here on its own calls. Every turn is scored against the calls the task still needs (the
call parses, names the right tool, asks the right thing), the final answer gives the
outcome, and `environments.common.turn_credit` turns both into per-turn advantages on each
turn's own tokens. With `--env.tools_in_think true` the calls are made inside the thinking of
one reply, their results inserted (masked) into that same reply. Details: docs/mt_grpo.md.

Modules: `world` (the atlas, its tools, the tasks), `scoring` (a turn's reward, the answer, the
outcome), `continuation` (continuing one assistant turn by ids around inserted tool results),
`episode` (the two turn loops), `env` (the environment and its groups), `demo` (an offline
stand-in policy).
"""

from __future__ import annotations

from atropos.environments.mt_grpo.demo import demo_responder, reply_for
from atropos.environments.mt_grpo.env import MTGRPO, MTGRPOConfig, Scored, score_episode
from atropos.environments.mt_grpo.episode import Budgets, Episode, Turn, play_chat, play_in_think
from atropos.environments.mt_grpo.world import Task, World, load_tasks, load_world

__all__ = [
    "MTGRPO",
    "Budgets",
    "Episode",
    "MTGRPOConfig",
    "Scored",
    "Task",
    "Turn",
    "World",
    "demo_responder",
    "load_tasks",
    "load_world",
    "play_chat",
    "play_in_think",
    "reply_for",
    "score_episode",
]

"""Shared pieces of the npc_arena tests: building the env, and a scripted policy-and-judge."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable
from typing import Any

from atropos.environments.npc_arena import NPCArena
from atropos.envs.judge import JudgeConfig

from ..helpers import make_env


def make(
    url: str,
    mode: str = "process",
    judge: JudgeConfig | None = None,
    group_size: int | None = None,
    **env: Any,
) -> NPCArena:
    """The env with its defaults, the policy at `url`, and `env` settings on top (validated)."""
    if judge is not None:
        env["judge"] = judge
    return make_env(NPCArena, url, mode, group_size=group_size, validate=True, **env)


def between(text: str, start: str, end: str) -> str:
    return text.rsplit(start, 1)[-1].split(end, 1)[0].strip()


def pair_of(prompt: str) -> tuple[str, str]:
    """Responses A and B of a pairwise judge prompt."""
    return between(prompt, "[Response A]", "[Response B]"), between(
        prompt, "[Response B]", "Which response"
    )


def prefers(word: str, lines: str = "") -> Callable[[str], str]:
    """A pairwise judge choosing the response that mentions `word` (the first one on a tie)."""

    def judge(prompt: str) -> str:
        first, second = pair_of(prompt)
        pick = "B" if word in second and word not in first else "A"
        return lines.format(pick=pick, other="B" if pick == "A" else "A") + f"\\boxed{{{pick}}}"

    return judge


class Script:
    """A FakeInferenceServer responder: NPC answers from `policy` in turn, judge prompts (they
    hold a "[Character sheet]") to `judge`. Records every prompt it sees."""

    def __init__(
        self, policy: Iterable[str] = ("Hmph.",), judge: Callable[[str], str] | None = None
    ) -> None:
        self.policy = itertools.cycle(list(policy))
        self.judge = judge or (lambda prompt: "\\boxed{A}")
        self.policy_prompts: list[str] = []
        self.judge_prompts: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, prompt: str) -> str:
        with self._lock:
            if "[Character sheet]" in prompt:
                self.judge_prompts.append(prompt)
                return self.judge(prompt)
            self.policy_prompts.append(prompt)
            return next(self.policy)


async def one_group(env: NPCArena, item: dict[str, str] | None = None) -> Any:
    """Set up, roll out `item` (default: the next one), close the servers; the group."""
    await env.setup()
    try:
        group, backlog = await env.collect_trajectories(item or await env.get_next_item())
        assert backlog == []
        return group
    finally:
        await env.aclose()
        await env.server.aclose()

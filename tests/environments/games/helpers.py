"""Shared pieces of the game tests: building an env against a fake server, scripted replies,
and reading the trained spans of a sequence."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Iterable
from typing import Any

from atropos.envs.base import BaseEnv

from ..helpers import make_env

MASKED = -100


def make(cls: type[BaseEnv], url: str, mode: str = "process", **env: Any) -> Any:
    """`cls` with its defaults, the policy at `url`, groups of 4 and `env` settings on top
    (validated)."""
    return make_env(cls, url, mode, validate=True, **env)


def collect(env: BaseEnv, items: int = 1) -> list[Any]:
    """`collect_trajectories` of the env's next `items` items (set up first, closed after)."""

    async def main() -> list[Any]:
        await env.setup()
        out = [(await env.collect_trajectories(await env.get_next_item()))[0] for _ in range(items)]
        await env.aclose()
        return out

    return asyncio.run(main())


class Script:
    """A responder giving `replies` in turn, cycling (thread-safe: the server calls it)."""

    def __init__(self, replies: Iterable[str]) -> None:
        self.replies = itertools.cycle(list(replies))
        self.prompts: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, prompt: str) -> str:
        with self.lock:
            self.prompts.append(prompt)
            return next(self.replies)


def take(action: str, think: str | None = None) -> str:
    """A `take_action` reply, optionally with a thinking block first."""
    call = "<tool_call>" + json.dumps({"name": "take_action", "arguments": {"action": action}})
    call += "</tool_call>"
    return call if think is None else f"<think>{think}</think>\n{call}"


def trained_spans(tokens: list[int], masks: list[int]) -> list[list[int]]:
    """The maximal runs of trained (unmasked) positions, as token ids."""
    spans: list[list[int]] = []
    for _, run in itertools.groupby(zip(tokens, masks, strict=True), key=lambda p: p[1] != MASKED):
        pairs = list(run)
        if pairs[0][1] != MASKED:
            spans.append([t for t, _ in pairs])
    return spans


def assistant_turns(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"] for m in messages if m["role"] == "assistant"]

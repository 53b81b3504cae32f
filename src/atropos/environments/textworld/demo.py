"""A scripted player for offline runs against `atropos.testing.fake_server`.

`demo_responder` finds the game of a prompt among the generated games in the default cache
(`generate.default_cache_dir()`: a game's `.json` holds its objective, which opens the first
observation, and its walkthrough) and plays every other episode by the walkthrough; the others
open with `xyzzy` and then only `dance`, so groups are mixed (full score against none). It reads
the conversation from the prompt text of a ChatML template (the fake server's tiny tokenizer).

>>> next_command(["<think>go</think>\\ntake key", "dance"], ["take key", "open chest"])
'open chest'
>>> next_command(["take key", "open chest"], ["take key", "open chest"])
'look'
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from pathlib import Path

from atropos.environments.textworld.game import parse_command
from atropos.environments.textworld.generate import default_cache_dir

__all__ = ["demo_responder", "next_command"]

_REPLIES = re.compile(r"<\|im_start\|>assistant\n(.*?)<\|im_end\|>", re.DOTALL)
_OPENING = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.DOTALL)
_solutions: dict[str, list[str]] = {}  # objective -> walkthrough, of the games read so far
_read: set[Path] = set()
_lock = threading.Lock()
_episodes = itertools.count()


def next_command(replies: list[str], solution: list[str]) -> str:
    """The first walkthrough command the replies so far have not played, in order ('look' once
    all are played)."""
    done = 0
    for reply in replies:
        if done < len(solution) and parse_command(reply) == solution[done]:
            done += 1
    return solution[done] if done < len(solution) else "look"


def _solution(opening: str) -> list[str] | None:
    """The walkthrough of the cached game whose objective opens `opening` (new `.json` files
    are read when none matches yet)."""
    with _lock:
        for _ in range(2):
            for objective, solution in _solutions.items():
                if opening.startswith(objective):
                    return solution
            for info in set(default_cache_dir().glob("textworld-*/*/*.json")) - _read:
                _read.add(info)
                data = json.loads(info.read_text())
                walkthrough = data.get("metadata", {}).get("walkthrough")
                if data.get("objective") and walkthrough:
                    _solutions[data["objective"].strip()] = list(walkthrough)
    return None


def demo_responder(prompt_text: str) -> str | None:
    """A `FakeInferenceServer` responder for offline demos (see the module docstring); None
    (random text) for a prompt that is not one of the cached games."""
    opening = _OPENING.search(prompt_text)
    solution = _solution(opening.group(1).strip()) if opening else None
    if solution is None:
        return None
    replies = _REPLIES.findall(prompt_text)
    if not replies:
        return "xyzzy" if next(_episodes) % 2 else solution[0]
    if replies[0] == "xyzzy":
        return "dance"
    return f"<think>next on the way: step {len(replies) + 1}</think>\n" + next_command(
        replies, solution
    )

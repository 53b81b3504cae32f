"""The rules of `tool_use_multiturn` as plain functions: one reply, one episode, one group.

A reply to a tool-call turn passes when it is `<think>...</think>` followed by `<tool_call>`
blocks and nothing else (the think block only when `require_think`), every block reads, their
number is the number expected and they match the expected calls one-to-one (in any order, by
`tool_calls.count_matched`: every expected key present with an equal value, strict JSON types
unless `lenient`). The first reply that fails deactivates its rollout.

>>> expected = ({"name": "f", "arguments": {"x": 1}},)
>>> check_reply('<think>ok</think><tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>',
...     expected)
TurnCheck(correct=1, mismatch=None)
>>> check_reply('<tool_call>{"name": "f", "arguments": {"x": "1"}}</tool_call>', expected,
...     require_think=False)
TurnCheck(correct=0, mismatch='calls')
>>> episode_reward("multistep", correct=2, total=2, mismatch=False)
1.5
>>> episode_reward("multistep", correct=1, total=2, mismatch=True)
0.3
>>> relevance_reward("<think>no tool fits</think>Sorry, which city do you mean?")
1.2
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from atropos.environments.common.tool_calls import count_matched, parse_text
from atropos.rewards.group import all_equal, length_penalty
from atropos.rewards.text import split_think  # (still importable from here, where it was)

__all__ = [
    "ALL_CORRECT_BONUS",
    "MISMATCH_PENALTY",
    "TurnCheck",
    "check_reply",
    "episode_reward",
    "group_scores",
    "relevance_reward",
]

ALL_CORRECT_BONUS = 0.5
MISMATCH_PENALTY = 0.2
RELEVANCE_BONUS = 0.1  # for an apology, and again for asking the user for information

_ONLY_CALLS = re.compile(r"\s*(?:<tool_call>.*?</tool_call>\s*)+", re.DOTALL)
_APOLOGY = re.compile(r"\b(sorry|apologi[sz]e|apologies|unfortunately)\b", re.IGNORECASE)
_ASKS = re.compile(
    r"\?|\b(could you|can you|would you|please (provide|share|specify|tell|confirm)|"
    r"let me know|i need (more|a bit more|the|to know))\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class TurnCheck:
    """How one reply went: expected calls it got right, and why it failed (None: it passed).

    `mismatch` is one of `think` (no single leading think block), `format` (anything but
    `<tool_call>` blocks after it), `malformed` (a block that does not read), `count` (another
    number of calls than expected) or `calls` (a call that matches no expected one).
    """

    correct: int
    mismatch: str | None


def check_reply(
    reply: str,
    expected: Sequence[Mapping[str, Any]],
    require_think: bool = True,
    lenient: bool = False,
) -> TurnCheck:
    """Check one reply to a tool-call turn (see the module docstring)."""
    rest = split_think(reply, required=require_think, leading=True)
    if rest is None:
        return TurnCheck(0, "think")
    if not _ONLY_CALLS.fullmatch(rest):
        return TurnCheck(0, "format")
    parsed = parse_text(rest)
    if parsed.malformed:
        return TurnCheck(0, "malformed")
    correct = count_matched(expected, parsed.calls, lenient)
    if len(parsed.calls) != len(expected):
        return TurnCheck(correct, "count")
    return TurnCheck(correct, None if correct == len(expected) else "calls")


def relevance_reward(reply: str, require_think: bool = True) -> float:
    """A relevance turn's reward: 1.0 for a plain-text answer that calls nothing, +0.1 if it
    apologizes, +0.1 if it asks the user for information; -0.2 for a call, a bad think block
    or an empty answer."""
    rest = split_think(reply, required=require_think, leading=True)
    if rest is None or "<tool_call>" in rest or not rest.strip():
        return -MISMATCH_PENALTY
    score = 1.0
    if _APOLOGY.search(rest):
        score += RELEVANCE_BONUS
    if _ASKS.search(rest):
        score += RELEVANCE_BONUS
    return round(score, 6)


def episode_reward(scenario: str, correct: int, total: int, mismatch: bool) -> float:
    """A tool-call episode's reward: `correct / total`, +0.5 when every call was right and no
    reply failed, -0.2 when a reply failed; -1.0 in the multiturn scenario with fewer than 2
    correct calls, and -1.0 for any reward that is not positive."""
    reward = correct / total if total else 0.0
    if total and correct == total and not mismatch:
        reward += ALL_CORRECT_BONUS
    if mismatch:
        reward -= MISMATCH_PENALTY
    if scenario == "multiturn" and correct < 2:
        return -1.0
    return reward if reward > 0 else -1.0


def group_scores(
    scenario: str,
    rewards: Sequence[float],
    lengths: Sequence[int],
    max_token_length: int,
    ensure_scores_differ: bool = True,
) -> list[float] | None:
    """The group's scores, or None to drop it.

    When every reward is above 0.99, each is scaled by upstream's length factor (1.0 up to half
    of `max_token_length` trained tokens, falling linearly to 0.0 at `max_token_length`). A
    group whose scores are then all equal is dropped when `ensure_scores_differ`, except in the
    relevance scenario (kept here; the runner's own rule still applies when it sends).

    >>> group_scores("single", [1.5, 1.5], [10, 75], 100)
    [1.5, 0.75]
    >>> group_scores("single", [-1.0, -1.0], [10, 10], 100) is None
    True
    >>> group_scores("relevance", [1.1, 1.1], [10, 10], 100)
    [1.1, 1.1]
    """
    scores = [float(r) for r in rewards]
    if scores and all(s > 0.99 for s in scores):
        factors = length_penalty([1.0] * len(scores), lengths, max_token_length)
        scores = [round(s * f, 6) for s, f in zip(scores, factors, strict=True)]
    if ensure_scores_differ and scenario != "relevance" and all_equal(scores):
        return None
    return scores

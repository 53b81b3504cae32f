"""Episodes of `tool_use_multiturn`: Hermes ShareGPT conversations cut at the model's tool calls.

A row is a `conversations` list (`from`/`value`, or `role`/`content`) with roles system, human,
gpt and tool. Every gpt turn holding `<tool_call>` blocks is a turn the policy must produce,
with those calls expected; everything between two such turns (the tool responses, and in the
multiturn scenario the assistant's answer and the user's follow-up) is *replayed* from the data
before the next turn, never executed. A row whose first reply has no call is a relevance
episode: one turn, where the right answer calls nothing.

>>> call = '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
>>> row = {"conversations": [{"from": "system", "value": "<tools>...</tools>"},
...     {"from": "human", "value": "Do f"}, {"from": "gpt", "value": call},
...     {"from": "tool", "value": "<tool_response>{}</tool_response>"},
...     {"from": "gpt", "value": call}]}
>>> episode = to_episode(row, "example")
>>> episode.scenario, [len(t.calls) for t in episode.turns], episode.turns[1].replay[0]["role"]
('multistep', [1, 1], 'tool')
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from atropos.environments.common.data_loading import (
    SPLIT_SEED,
    data_path,
    load_hub,
    read_jsonl,
    split_rows,
)
from atropos.environments.common.tool_calls import parse_text

__all__ = [
    "HINTS",
    "SCENARIOS",
    "SYSTEM_PREAMBLE",
    "ExpectedTurn",
    "ToolEpisode",
    "load_episodes",
    "to_episode",
]

log = logging.getLogger("atropos.env")

SCENARIOS = ("single", "multistep", "multiturn", "relevance")
SYSTEM_PREAMBLE = (
    "You are a careful assistant that can call functions. Before every reply, think inside"
    " <think> </think> tags. Then either call functions, writing only <tool_call> blocks after"
    " </think>, or answer the user in plain text."
)
#: A line per scenario added to the system prompt when `scenario_hints` is on.
HINTS = {
    "single": "",
    "multistep": (
        "When one call needs the result of another, make the first call, wait for its"
        " <tool_response>, then make the next."
    ),
    "multiturn": (
        "The user may ask follow-up questions; call functions again whenever a new request"
        " needs them."
    ),
    "relevance": (
        "If no function fits the request, apologize and say what you can do; if a function"
        " fits but a required argument is missing, ask the user for it. Never guess arguments."
    ),
}
_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
    "ipython": "tool",
}


@dataclass(frozen=True)
class ExpectedTurn:
    """One reply the policy must produce.

    Attributes:
        replay: the messages spliced in before this turn (tool responses, the user's
            follow-ups), masked; empty for the first turn, whose prompt is the context.
        calls: the expected calls, `{"name", "arguments"}`; empty for a relevance turn.
    """

    replay: tuple[dict[str, str], ...]
    calls: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class ToolEpisode:
    """One training or evaluation item.

    Attributes:
        id: the row's `id` (or where it came from).
        scenario: `single`, `multistep`, `multiturn` or `relevance`.
        context: the prompt of the first turn: the system turn (preamble, hint, tool schemas)
            and the conversation up to the first reply the policy must give.
        turns: the replies the policy must give, in order.
    """

    id: str
    scenario: str
    context: tuple[dict[str, str], ...]
    turns: tuple[ExpectedTurn, ...]

    @property
    def total_calls(self) -> int:
        """How many calls the whole episode expects (0 for relevance)."""
        return sum(len(t.calls) for t in self.turns)


def _messages(row: Mapping[str, Any], where: str) -> list[dict[str, str]]:
    turns = row.get("conversations")
    if turns is None:
        turns = row.get("messages")
    if not isinstance(turns, list):
        raise ValueError(f"{where}: expected a 'conversations' list, got {type(turns).__name__}")
    out = []
    for turn in turns:
        if not isinstance(turn, Mapping):
            raise ValueError(f"{where}: a turn must be an object, got {type(turn).__name__}")
        who = turn.get("from", turn.get("role"))
        role = _ROLES.get(str(who))
        value = turn.get("value", turn.get("content"))
        if role is None or not isinstance(value, str):
            raise ValueError(f"{where}: unreadable turn (from={who!r})")
        out.append({"role": role, "content": value})
    return out


def _scenario(row: Mapping[str, Any], turns: list[ExpectedTurn]) -> str:
    """The row's `scenario_category` when it is one we know and fits the row, else inferred."""
    if not turns or not turns[0].calls:
        return "relevance"
    given = row.get("scenario_category")
    if given in SCENARIOS and given != "relevance":
        return str(given)
    if any(m["role"] == "user" for t in turns for m in t.replay):
        return "multiturn"
    return "single" if len(turns) == 1 else "multistep"


def _system(system: str, scenario: str, hints: bool) -> str:
    parts = [SYSTEM_PREAMBLE]
    if hints and HINTS.get(scenario):
        parts.append(HINTS[scenario])
    if system:
        parts.append(system)
    return "\n\n".join(parts)


def to_episode(row: Mapping[str, Any], where: str, hints: bool = True) -> ToolEpisode:
    """The episode of a ShareGPT row; `where` names the row in errors.

    Raises:
        ValueError: no human turn, no reply, an unreadable `<tool_call>` in a reply, or a
            turn the policy must produce that does not follow a user or tool message.
    """
    messages = _messages(row, where)
    system = "\n\n".join(m["content"] for m in messages if m["role"] == "system")
    chat = [m for m in messages if m["role"] != "system"]
    if not chat or chat[0]["role"] != "user":
        raise ValueError(f"{where}: the conversation must open with a human turn")
    context: list[dict[str, str]] = []
    turns: list[ExpectedTurn] = []
    pending: list[dict[str, str]] = []  # messages since the last expected turn
    for message in chat:
        parsed = parse_text(message["content"]) if message["role"] == "assistant" else None
        if parsed is None or not (parsed.calls or parsed.malformed):
            (pending if turns else context).append(message)
            continue
        if parsed.malformed:
            raise ValueError(f"{where}: a gpt turn has {parsed.malformed} unreadable <tool_call>")
        before = pending if turns else context
        if not before or before[-1]["role"] == "assistant":
            raise ValueError(f"{where}: a gpt tool-call turn must follow a human or tool turn")
        turns.append(ExpectedTurn(tuple(pending) if turns else (), tuple(parsed.calls)))
        pending = []
    if not turns:  # relevance: the first reply calls nothing
        first = next((i for i, m in enumerate(chat) if m["role"] == "assistant"), None)
        if first is None:
            raise ValueError(f"{where}: no gpt turn")
        context = chat[:first]
        turns = [ExpectedTurn((), ())]
    scenario = _scenario(row, turns)
    head = {"role": "system", "content": _system(system, scenario, hints)}
    ident = str(row.get("id") or row.get("task_id") or where)
    return ToolEpisode(ident, scenario, (head, *context), tuple(turns))


def _convert(
    rows: list[dict[str, Any]], source: str, hints: bool, strict: bool
) -> list[ToolEpisode]:
    """Episodes of `rows`; unusable hub rows are skipped (counted in a log line), fixture rows
    are errors (`strict`)."""
    episodes, skipped = [], 0
    for n, row in enumerate(rows, 1):
        try:
            episodes.append(to_episode(row, f"{source} row {n}", hints))
        except ValueError:
            if strict:
                raise
            skipped += 1
    if skipped:
        log.warning(
            "%s: skipped %d of %d rows that are not tool-use episodes", source, skipped, len(rows)
        )
    return episodes


def load_episodes(
    split: str,
    dataset_name: str | None = None,
    test_fraction: float = 0.05,
    hints: bool = True,
    scenarios: tuple[str, ...] | list[str] = SCENARIOS,
) -> list[ToolEpisode]:
    """The episodes of `split` ("train" or "test") whose scenario is in `scenarios`.

    The shipped fixture has its own two files; a hub dataset's `train` split is shuffled with
    seed 42 and its first `ceil(test_fraction * rows)` rows held out (the same rows every run).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if not dataset_name:
        path = data_path("tool_use_multiturn", f"{split}.jsonl")
        episodes = _convert(read_jsonl(path), str(path), hints, strict=True)
    else:
        rows = load_hub(dataset_name, "train")
        if len(rows) < 2:
            raise ValueError(f"{dataset_name} has {len(rows)} rows: too few to split")
        test_size = min(len(rows) - 1, max(1, math.ceil(test_fraction * len(rows))))
        train, test = split_rows(rows, test_size, SPLIT_SEED)
        chosen = test if split == "test" else train
        episodes = _convert(chosen, f"{dataset_name} ({split})", hints, strict=False)
    return [e for e in episodes if e.scenario in scenarios]

"""One `mt_grpo` episode, played token-exact, in either of its two modes.

**Chat turns** (default): the system turn and the question, then each reply; a reply with one
`<tool_call>` gets the tool's result back as a `tool` turn, a reply without one is the answer
and ends the episode. Each turn goes through `ManagedServer.chat_turn`, which extends the held
ids, so the sequence's trained tokens are exactly the replies and the tool turns are masked.

**Tools inside thinking** (`tools_in_think`): one assistant turn. Generation stops at each
`</tool_call>` (`continuation.stop_at_call`); the result is inserted right after the call as a
`<tool_response>` block, masked, inside the same turn, and the policy continues from the exact
ids (`ManagedServer.continue_turn`). The answer follows `</think>`.

Either way an episode is a list of turns, each with the span of its own token ids (a reply, or
the stretch of the one reply up to a call), which is where turn-level credit lands. It ends
when the policy answers, or at the first limit of its `RolloutLimits` (`Budgets.limits_for`):
`max_turns` turns (the task's calls, the answer and `extra_turns` more), `--env.max_tool_calls`,
`--env.max_seconds`; or at `max_token_length`, or (thinking mode) a call after `</think>`.
`Episode.outcome` names how it ended for `envs.outcome`: `truncated/<limit>` for a limit (a cut
answer and the context are `tokens`), `invalid/call_after_think` for the policy's own fault.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from atropos.environments.common.multiturn import TEMPLATE_SLACK, reply_room
from atropos.environments.common.tool_calls import parse_text
from atropos.environments.mt_grpo.continuation import (
    CALL_CLOSE,
    Chunk,
    chunk_of,
    ended_at_call,
    stop_at_call,
)
from atropos.environments.mt_grpo.world import TOOLS, Task, World
from atropos.envs.outcome import RolloutLimits, invalid, truncated
from atropos.inference.sequence import DriftKind, SequenceNode
from atropos.inference.tokenize import as_token_ids

__all__ = ["Budgets", "Episode", "Turn", "play_chat", "play_in_think", "system_prompt"]

_ONE_CALL = "write exactly one <tool_call> holding a JSON object with name and arguments"
_INTRO = (
    "You answer questions about a made-up atlas, which you can only know through its tools."
    ' Call a tool with <tool_call>{"name": ..., "arguments": {...}}</tool_call>.'
)
_CHAT = (
    " Make one call per reply; its result comes back in the next message. You may think first"
    " inside <think></think>. When you know the answer, reply without a call and give the"
    " answer in \\boxed{}."
)
_THINK = (
    " Think inside <think></think> and make your calls while thinking, one at a time: each"
    " result appears right after its call as <tool_response>...</tool_response>, and you go on"
    " thinking. Then close </think> and give the answer in \\boxed{}."
)
#: The phrase that tells the thinking mode's prompt apart (the demo responder reads it).
THINK_MARK = "make your calls while thinking"


def system_prompt(tools_in_think: bool) -> str:
    """The system turn: the task, how to call tools in this mode, the tool schemas."""
    schemas = "\n".join(json.dumps(t) for t in TOOLS)
    return f"{_INTRO}{_THINK if tools_in_think else _CHAT}\n\n<tools>\n{schemas}\n</tools>"


@dataclass(frozen=True)
class Budgets:
    """An episode's limits (`MTGRPOConfig`'s fields of the same names)."""

    extra_turns: int
    max_reply_tokens: int
    max_token_length: int
    max_tool_calls: int | None = None
    max_seconds: float | None = None

    def turns_for(self, task: Task) -> int:
        """Turns an episode of `task` may take: its calls, the answer, `extra_turns` more."""
        return len(task.calls) + 1 + self.extra_turns

    def limits_for(self, task: Task) -> RolloutLimits:
        """An episode's `RolloutLimits` for `task` (turns, tool calls, seconds)."""
        return RolloutLimits(
            max_turns=self.turns_for(task),
            max_tool_calls=self.max_tool_calls,
            max_seconds=self.max_seconds,
        )


_LIMIT = {"max_turns": "turns", "context": "tokens", "length": "tokens"}
_LIMIT.update(max_tool_calls="tool_calls", max_seconds="seconds")


@dataclass
class Turn:
    """One turn: what the policy wrote in it and the span of its ids in the sequence
    (`[start, end)`; None once a re-rendered prompt restarted the sequence without it)."""

    text: str
    span: tuple[int, int] | None


@dataclass
class Episode:
    """One played episode.

    Attributes:
        task: what was asked.
        messages: the conversation (in thinking mode the one reply holds the tool results).
        node: the token-exact sequence (None: the prompt alone did not fit).
        turns: the policy's turns in order.
        answer_text: the text of the answering turn (the whole reply in thinking mode); None
            when the episode ended without an answer.
        stopped: `answered`, `length` (the answer was cut), `max_turns`, `max_tool_calls`,
            `max_seconds`, `context` or `call_after_think`.
        results: tool results given back; cut_stops: `</tool_call>` stop strings the server
            left out of the ids, inserted (masked) before the result; forks: re-rendered
            prompts that restarted the sequence.
    """

    task: Task
    messages: list[dict[str, Any]]
    node: SequenceNode | None = None
    turns: list[Turn] = field(default_factory=list)
    answer_text: str | None = None
    stopped: str = ""
    results: int = 0
    cut_stops: int = 0
    forks: int = 0
    started: float = field(default_factory=time.monotonic)

    def outcome(self, rule: str) -> dict[str, Any]:
        """Its `overrides` entry (`envs.outcome`): `truncated/<limit>` under `rule`,
        `invalid/call_after_think`, or `{}` (answered: scored)."""
        if self.stopped == "call_after_think":
            return invalid("call_after_think")
        limit = _LIMIT.get(self.stopped)
        return truncated(limit, rule) if limit else {}

    def limit_reached(self, budgets: Budgets) -> str | None:
        """`max_<limit>` when a limit of `budgets` stops the next turn, else None."""
        limit = budgets.limits_for(self.task).exceeded(
            turns=len(self.turns),
            tool_calls=self.results,
            seconds=time.monotonic() - self.started,
        )
        return None if limit is None else f"max_{limit}"


def _opening(task: Task, system: str) -> Episode:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": task.question}]
    return Episode(task, messages)


def _room(session: Any, messages: list[dict[str, Any]], budgets: Budgets) -> int:
    """Tokens the next reply may take after `messages` (below 1: none)."""
    room = reply_room(session.tokenizer, messages, budgets.max_token_length, TEMPLATE_SLACK)
    return min(budgets.max_reply_tokens, room)


def _result(world: World, text: str) -> dict[str, Any]:
    """The tool result of a turn that calls: its one call run, or an error."""
    parsed = parse_text(text)
    if len(parsed.calls) != 1 or parsed.malformed:
        return {"tool": None, "error": _ONE_CALL}
    return world.run(parsed.calls[0])


async def play_chat(
    session: Any, task: Task, world: World, budgets: Budgets, system: str, **sampling: Any
) -> Episode:
    """Play `task` as chat turns through `session` (a `ManagedServer`)."""
    episode = _opening(task, system)
    while True:
        limit = episode.limit_reached(budgets)
        if limit is not None:
            episode.stopped = limit
            return episode
        room = _room(session, episode.messages, budgets)
        if room < 1:
            episode.stopped = "context"
            return episode
        turn = await session.chat_turn(messages=episode.messages, n=1, max_tokens=room, **sampling)
        node, reply = turn.nodes[0], turn.contents[0]
        if node.drift is DriftKind.FORK:  # the earlier replies are prompt now, not trained
            episode.forks += 1
            for earlier in episode.turns:
                earlier.span = None
        episode.node = node
        episode.turns.append(Turn(reply, (len(turn.prompt_tokens), len(node.tokens))))
        episode.messages.append({"role": "assistant", "content": reply})
        parsed = parse_text(reply)
        if not parsed.calls and not parsed.malformed:
            episode.answer_text, episode.stopped = reply, "answered"
            return episode
        episode.results += 1
        content = json.dumps(_result(world, reply))
        episode.messages.append({"role": "tool", "content": content})


def _insertion(session: Any, result: dict[str, Any], cut: bool) -> tuple[str, list[int]]:
    """The text and ids put after a call inside the reply: the `</tool_call>` the server cut
    (when it did), then the result."""
    text = f"{CALL_CLOSE if cut else ''}\n<tool_response>\n{json.dumps(result)}\n</tool_response>\n"
    return text, as_token_ids(session.tokenizer.encode(text, add_special_tokens=False))


async def play_in_think(
    session: Any, task: Task, world: World, budgets: Budgets, system: str, **sampling: Any
) -> Episode:
    """Play `task` as one reply with tool calls inside its thinking (see the module docstring)."""
    episode = _opening(task, system)
    room = _room(session, episode.messages, budgets)
    if room < 1:
        episode.stopped = "context"
        return episode
    stop = stop_at_call(session.tokenizer)
    first = await session.chat_turn(
        messages=episode.messages, n=1, max_tokens=room, **stop, **sampling
    )
    chunk: Chunk | None = chunk_of(session.tokenizer, first.nodes[0], len(first.prompt_tokens))
    reply = ""
    while chunk is not None:
        reply, chunk = await _think_step(
            session, episode, chunk, reply, world, budgets, stop, sampling
        )
    episode.messages.append({"role": "assistant", "content": reply})
    return episode


async def _think_step(
    session: Any,
    episode: Episode,
    chunk: Chunk,
    reply: str,
    world: World,
    budgets: Budgets,
    stop: dict[str, Any],
    sampling: dict[str, Any],
) -> tuple[str, Chunk | None]:
    """Take in one chunk of the reply; (the reply so far, the next chunk or None: done)."""
    episode.node = chunk.node
    at_call, cut = ended_at_call(chunk)
    own = chunk.text + (CALL_CLOSE if cut else "")
    episode.turns.append(Turn(own, (chunk.start, len(chunk.node.tokens))))
    if not at_call:
        episode.answer_text = reply + chunk.text
        episode.stopped = "answered" if chunk.finish_reason == "stop" else "length"
        return reply + chunk.text, None
    reply += chunk.text
    if "</think>" in reply:
        episode.stopped = "call_after_think"
        return reply, None
    limit = episode.limit_reached(budgets)
    if limit is not None:
        episode.stopped = limit
        return reply, None
    text, inserted = _insertion(session, _result(world, own), cut)
    room = budgets.max_token_length - len(chunk.node.tokens) - len(inserted)
    if room < 1:
        episode.stopped = "context"
        return reply, None
    episode.results, episode.cut_stops = episode.results + 1, episode.cut_stops + cut
    extended = await session.continue_turn(
        chunk.node, inserted, max_tokens=min(budgets.max_reply_tokens, room), **stop, **sampling
    )
    following = chunk_of(session.tokenizer, extended, len(chunk.node.tokens) + len(inserted))
    return reply + text, following

"""One research episode, played token-exact: the prompt, the turn loop and what it ends with.

An episode is one chat in its own `ManagedServer` session: the system turn (the task and, unless
the template takes them, the tools), the question as the user turn, then each reply followed by
its tool results (`tools.Toolbox`) as `tool` turns (or one `user` turn of `<tool_response>`
blocks). Every turn after the first extends the held token ids, so the sequence holds exactly
the tokens the policy generated (trained, with the server's logprobs) and the tool results
masked (-100). It ends when the policy answers, or at the first limit of its `RolloutLimits`
(`Budgets.limits`): `max_turns` replies, `max_episode_tokens` generated tokens,
`--env.max_tool_calls`, `--env.max_seconds`; or at `max_token_length` (the next prompt plus one
more token would not fit). An episode that stops at a limit is `truncated/<limit>`
(`Episode.limit`; `context` counts as `tokens`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from atropos.environments.common.multiturn import TEMPLATE_SLACK, reply_room
from atropos.environments.common.tool_calls import parse_text
from atropos.environments.deep_research.questions import Question
from atropos.environments.deep_research.tools import TOOLS, Research, Toolbox
from atropos.envs.outcome import RolloutLimits
from atropos.inference.sequence import SequenceNode

__all__ = ["Budgets", "Episode", "play", "system_prompt", "tool_messages"]

_TASK = (
    "You answer questions by researching documents with tools. Search for documents, open the"
    " ones that look relevant and read them; when you know the answer, call answer with a short"
    " answer (a name, a number, a few words) and the doc_ids of the opened documents that"
    " support it. Answers without opened, supporting documents count for less. Call a tool with"
    ' <tool_call>{"name": ..., "arguments": {...}}</tool_call>; you may think first inside'
    " <think></think>. You have at most {turns} replies."
)


def system_prompt(max_turns: int, list_tools: bool = True) -> str:
    """The system turn: the task, and the tool schemas unless the template gets them."""
    text = _TASK.replace("{turns}", str(max_turns))
    if list_tools:
        schemas = "\n".join(json.dumps(t["function"]) for t in TOOLS)
        text += f"\n\n<tools>\n{schemas}\n</tools>"
    return text


def tool_messages(results: list[str], role: str) -> list[dict[str, str]]:
    """The turns carrying `results`: one `tool` message each, or one `user` message of
    `<tool_response>` blocks."""
    if role == "tool":
        return [{"role": "tool", "content": r} for r in results]
    blocks = "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
    return [{"role": "user", "content": blocks}]


@dataclass(frozen=True)
class Budgets:
    """An episode's limits (`DeepResearchConfig`'s fields of the same names)."""

    max_turns: int
    max_reply_tokens: int
    max_episode_tokens: int
    max_token_length: int
    max_tool_calls: int | None = None
    max_seconds: float | None = None

    @property
    def limits(self) -> RolloutLimits:
        """The episode's `RolloutLimits` (turns, generated tokens, tool calls, seconds)."""
        return RolloutLimits(
            max_turns=self.max_turns,
            max_tokens=self.max_episode_tokens,
            max_tool_calls=self.max_tool_calls,
            max_seconds=self.max_seconds,
        )


_STOPPED = {"turns": "max_turns", "tokens": "token_budget"}  # the names `stopped` had
_LIMIT = {"max_turns": "turns", "token_budget": "tokens", "context": "tokens"}
_LIMIT.update(max_tool_calls="tool_calls", max_seconds="seconds")


@dataclass
class Episode:
    """One played episode.

    Attributes:
        question: what was asked.
        messages: the whole conversation, tool results after the last reply included.
        node: the token-exact sequence through the last reply (None: the prompt did not fit).
        research: what the tools saw (searches, opens, errors, the answer).
        turns: replies given; generated: tokens generated over all replies.
        stopped: why it ended: `answered`, `max_turns`, `token_budget`, `max_tool_calls`,
            `max_seconds` or `context`.
        calls: tool calls made; started: when it began (`time.monotonic()`).
    """

    question: Question
    messages: list[dict[str, Any]]
    node: SequenceNode | None = None
    research: Research = field(default_factory=Research)
    turns: int = 0
    generated: int = 0
    stopped: str = ""
    calls: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def limit(self) -> str | None:
        """The `RolloutLimits` limit that stopped it (`truncated/<limit>`), None if answered."""
        return _LIMIT.get(self.stopped)


def _reply_limit(episode: Episode, budgets: Budgets, tokenizer: Any, tools: Any) -> int | str:
    """Tokens the next reply may take, or why there is no next reply."""
    limit = budgets.limits.exceeded(
        turns=episode.turns,
        tokens=episode.generated,
        tool_calls=episode.calls,
        seconds=time.monotonic() - episode.started,
    )
    if limit is not None:
        return _STOPPED.get(limit, f"max_{limit}")
    left = budgets.max_episode_tokens - episode.generated
    room = reply_room(tokenizer, episode.messages, budgets.max_token_length, TEMPLATE_SLACK, tools)
    if room < 1:
        return "context"
    return min(budgets.max_reply_tokens, left, room)


async def play(
    session: Any,
    question: Question,
    toolbox: Toolbox,
    budgets: Budgets,
    *,
    system: str,
    tool_role: str = "tool",
    native_tools: bool = False,
    **sampling: Any,
) -> Episode:
    """Play one episode of `question` through `session` (a `ManagedServer`)."""
    messages = [
        {"role": "system", "content": system},
        {"role": "user", "content": question.question},
    ]
    episode = Episode(question, messages)
    tools = TOOLS if native_tools else None
    extra = {"tools": tools} if tools else {}
    while episode.research.answer is None:
        limit = _reply_limit(episode, budgets, session.tokenizer, tools)
        if isinstance(limit, str):
            episode.stopped = limit
            return episode
        turn = await session.chat_turn(
            messages=episode.messages, n=1, max_tokens=limit, **extra, **sampling
        )
        reply = turn.contents[0]
        episode.node, episode.turns = turn.nodes[0], episode.turns + 1
        episode.generated += turn.completion_tokens
        episode.messages.append({"role": "assistant", "content": reply})
        results = await toolbox.respond(reply, episode.research)
        episode.calls += len(parse_text(reply).calls)
        if episode.research.answer is None:
            episode.messages.extend(tool_messages(results, tool_role))
    episode.stopped = "answered"
    return episode

"""`ors:URL#ENV` as an Atropos environment: a remote ORS environment's tasks, tools and rewards,
played token-exact by the policy.

An item is a task index of the training split (the split of type `train`, else the first;
`--env.split` picks another); `evaluate` plays the split of type `test` (else `validation`;
`--env.eval_split`). A group is `group_size` episodes of one task, each on its own ORS session
(an ORS environment is stateful per session). The session's prompt is the user turn; its tools
go to the chat template's `tools` (or a `<tools>` block in the system prompt when the template
renders none). The first reply is one `chat_turn` with `n=group_size` on a `ManagedServer`;
each episode goes on alone on its own sequence (`continue_alone`): the calls of a reply are run
in order on the session, each output appended as a tool turn (masked), until a tool answers
`finished`, a reply makes no call (then the environment's `@terminal` tool, when it has one,
gets the reply's text), `max_turns` replies, or the token budget.

Reward: ORS gives a reward inline with any tool output (and with the one that finishes). An
episode's score is the sum of the rewards it was given (none: 0.0); each tool turn keeps its
own as `reward` in the group's `messages`, so per-step rewards are not lost. A call the
environment refuses (unknown tool, bad input) is the policy's fault: its error is the tool
turn. A failure of the server (unreachable, 5xx, timeout, a tool that raised) raises `ORSError`
(`failure_kind` `ors_*`): the group is counted failed, never scored. Sessions are deleted when
the group ends, also when it is cancelled.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import Field

from atropos.environments.common.multiturn import (
    continue_alone,
    node_group,
    reply_room,
    require_token_servers,
)
from atropos.environments.common.tool_calls import parse_text
from atropos.envs.base import BaseEnv
from atropos.envs.config import BaseEnvConfig, ConfigError
from atropos.envs.evaluation import episode_report, evaluate_each
from atropos.envs.simple import ShuffledPasses
from atropos.envs.types import Item, ScoredDataGroup
from atropos.inference.sequence import SequenceNode
from atropos.interop import parse
from atropos.interop.ors.client import ORSClient, ORSSession, ToolResult
from atropos.interop.ors.wire import ORSError, blocks_text, openai_tools

__all__ = ["SYSTEM_PROMPT", "ORSConfig", "ORSEnv", "env_class"]

SYSTEM_PROMPT = (
    "You can call tools to complete the task. To call tools, reply with one"
    ' <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call> block per call; the results'
    " come back as tool messages."
)


class ORSConfig(BaseEnvConfig):
    """A remote ORS environment's settings."""

    split: str | None = Field(default=None, description="training split (unset: type train)")
    eval_split: str | None = Field(
        default=None, description="evaluation split (unset: type test, else validation)"
    )
    max_turns: int = Field(default=8, ge=1, description="policy replies per episode at most")
    max_gen_per_turn: int = Field(default=512, ge=1, description="token limit of one reply")
    temperature: float = Field(default=0.8, ge=0, description="sampling temperature (training)")
    request_timeout: float = Field(default=60.0, gt=0, description="seconds per ORS request")
    api_key_env: str = Field(
        default="OPENREWARD_API_KEY", description="variable holding the server's key, if any"
    )
    eval_limit: int = Field(default=0, ge=0, description="held-out tasks per evaluation (0: all)")


@dataclass
class Episode:
    """One rollout: its session, conversation, sequence, rewards and how it ended."""

    session: ORSSession
    messages: list[dict[str, Any]]
    node: SequenceNode
    finish: str
    rewards: list[float] = field(default_factory=list)
    turns: int = 1
    calls: int = 0
    ended: str | None = None  # finished, no_call, max_turns, length, budget
    tools: list[dict[str, Any]] | None = None  # the schemas the template renders (None: none)
    terminal: dict[str, Any] | None = None  # the environment's `@terminal` tool, if any

    @property
    def score(self) -> float:
        return float(sum(self.rewards))


@dataclass(frozen=True)
class TaskTools:
    """A task's tools: the schemas the template renders (None: none, or in the system prompt)
    and its `@terminal` tool (None: none)."""

    tools: list[dict[str, Any]] | None
    terminal: dict[str, Any] | None


class ORSEnv(BaseEnv[ORSConfig]):
    """A remote ORS environment (set by `env_class`): its tasks, tools and rewards."""

    name = "ors"
    url: ClassVar[str] = ""
    remote_env: ClassVar[str | None] = None
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 4, "max_token_length": 4096, "use_wandb": False
    }  # fmt: skip
    seed: ClassVar[int] = 0

    async def setup(self) -> None:
        """Resolve the environment, its splits and task counts, and its tools."""
        require_token_servers(self)
        s = self.config
        key = os.environ.get(s.api_key_env) or None
        self.client = ORSClient(self.url, self.remote_env, api_key=key, timeout=s.request_timeout)
        self.on_close(self.client.aclose)
        try:  # a server that cannot be asked at the start is one clear error, not a traceback
            await self.client.resolve_env()
            splits = await self.client.splits()
            self.train_split = _pick(splits, s.split, ("train",), "split")
            self.test_split = _pick(splits, s.eval_split, ("test", "validation"), "eval_split")
            count = await self.client.num_tasks(self.train_split)
        except (ValueError, ORSError) as e:
            raise ConfigError(
                str(e) if isinstance(e, ValueError) else f"ors:{self.url}: {e}"
            ) from None
        if count < 1:
            raise ConfigError(f"{self.url}#{self.client.env}: split {self.train_split!r} is empty")
        self._passes = ShuffledPasses(list(range(count)), self.seed)
        _ = self.tokenizer  # loaded before the first group

    async def get_next_item(self) -> Item:
        return self._passes.next()

    # ----- an episode ---------------------------------------------------------------------------

    async def open(self, split: str, index: int, n: int) -> list[ORSSession]:
        """`n` sessions on one task; all closed again if one fails to open."""
        opened = await asyncio.gather(
            *(self.client.open(split, index) for _ in range(n)), return_exceptions=True
        )
        sessions = [o for o in opened if isinstance(o, ORSSession)]
        failed = [o for o in opened if isinstance(o, BaseException)]
        if failed:
            await asyncio.shield(_close(sessions))
            raise failed[0]
        return sessions

    async def context(self, session: ORSSession) -> tuple[list[dict[str, Any]], TaskTools]:
        """The first turn: the system prompt (with a `<tools>` block when the template renders
        no tools) and the task's prompt; and the task's tools."""
        listed = await session.tools()
        schemas = openai_tools(listed.get("tools") or [])
        tools = schemas if _renders_tools(self.tokenizer, schemas) else None
        blank = TaskTools(tools, listed.get("terminal_tool"))
        system = SYSTEM_PROMPT
        if schemas and tools is None:
            lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in schemas)
            system += f"\n\n<tools>\n{lines}\n</tools>"
        prompt = blocks_text(await session.prompt())
        return [{"role": "system", "content": system}, {"role": "user", "content": prompt}], blank

    async def play(
        self, split: str, index: int, n: int, temperature: float | None = None
    ) -> list[Episode] | None:
        """`n` episodes of task `index`, token-exact; None when its prompt alone does not fit.
        The sessions are deleted at the end, also on failure or cancellation."""
        sessions = await self.open(split, index, n)
        try:
            return await self._play(sessions, split, temperature)
        finally:
            await asyncio.shield(_close(sessions))

    async def _play(
        self, sessions: list[ORSSession], split: str, temperature: float | None
    ) -> list[Episode] | None:
        s, tokenizer = self.config, self.tokenizer
        context, blank = await self.context(sessions[0])
        tools = blank.tools
        room = self._room(tokenizer, context, tools)
        if room < 1:
            return None
        sampling = {
            "split": "train" if split == self.train_split else "eval",
            "temperature": s.temperature if temperature is None else temperature,
        }
        async with self.server.managed_server(tokenizer=tokenizer) as managed:
            first = await managed.chat_turn(
                messages=context,
                n=len(sessions),
                max_tokens=min(s.max_gen_per_turn, room),
                tools=tools,
                **sampling,
            )
            episodes = [
                Episode(
                    sess,
                    [*context, {"role": "assistant", "content": text}],
                    node,
                    finish,
                    tools=tools,
                    terminal=blank.terminal,
                )  # fmt: skip
                for sess, text, finish, node in zip(
                    sessions, first.contents, first.finish_reasons, first.nodes, strict=True
                )
            ]
            outcomes = await asyncio.gather(
                *(self._go_on(managed, ep, sampling) for ep in episodes), return_exceptions=True
            )
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise failed[0]
        return episodes

    def _room(
        self, tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> int:
        return reply_room(tokenizer, messages, self.config.max_token_length, tools=tools)

    async def _go_on(self, managed: Any, ep: Episode, sampling: dict[str, Any]) -> None:
        """Run each reply's calls and sample the next reply, until the episode ends."""
        s = self.config
        while ep.ended is None:
            parsed = parse_text(str(ep.messages[-1]["content"]))
            if ep.finish == "length":
                ep.ended = "length"
            elif not parsed.calls:
                await self._terminal(ep)
            else:
                messages = [*ep.messages, *await self._run_calls(ep, parsed.calls)]
                if ep.ended is not None:
                    ep.messages = messages
                    return
                if ep.turns >= s.max_turns:
                    ep.messages, ep.ended = messages, "max_turns"
                    return
                room = self._room(managed.tokenizer, messages, ep.tools)
                if room < 1:
                    ep.messages, ep.ended = messages, "budget"
                    return
                turn = await continue_alone(
                    managed, ep.node, messages, max_tokens=min(s.max_gen_per_turn, room),
                    tools=ep.tools, **sampling,
                )  # fmt: skip
                ep.node, ep.finish = turn.nodes[0], turn.finish_reasons[0]
                ep.messages = [*messages, {"role": "assistant", "content": turn.contents[0]}]
                ep.turns += 1

    async def _run_calls(self, ep: Episode, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The tool turns of one reply's calls, run in order on the episode's session (a call
        after the one that finished the episode is not run)."""
        turns = []
        for call in calls:
            arguments = call.get("arguments")
            result = await ep.session.call(str(call["name"]), arguments or {})
            ep.calls += 1
            turns.append(_tool_turn(str(call["name"]), result))
            if result.reward is not None:
                ep.rewards.append(result.reward)
            if result.finished:
                ep.ended = "finished"
                break
        return turns

    async def _terminal(self, ep: Episode) -> None:
        """A reply without calls ends the episode; its text goes to the `@terminal` tool."""
        ep.ended = "no_call"
        if ep.terminal is None:
            return
        arg = ep.terminal.get("arg")
        text = str(ep.messages[-1]["content"])
        result = await ep.session.call(str(ep.terminal["name"]), {arg: text} if arg else {})
        if result.reward is not None:
            ep.rewards.append(result.reward)
        ep.messages[-1] = {**ep.messages[-1], "reward": result.reward}
        ep.ended = "finished" if result.finished else "no_call"

    # ----- groups and evaluation ----------------------------------------------------------------

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        episodes = await self.play(self.train_split, int(item), self.config.group_size)
        if not episodes:
            self.drop("prompt_too_long")
            return None, []
        scores = [ep.score for ep in episodes]
        self.record_mean("train/avg_score", scores)
        self.record_mean("train/finished", [float(ep.ended == "finished") for ep in episodes])
        self.record_mean("train/turns", [float(ep.turns) for ep in episodes])
        self.record_mean("train/tool_calls", [float(ep.calls) for ep in episodes])
        nodes = [ep.node for ep in episodes]
        return node_group(nodes, scores, [ep.messages for ep in episodes]), []

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """One episode per task of the evaluation split at `eval_temperature`: `eval/avg_score`
        (the mean return), `eval/finished` (the share a tool ended: `finished`)."""
        s = self.config
        count = await self.client.num_tasks(self.test_split)
        tasks = list(range(count))[: s.eval_limit or None]
        params = {"temperature": s.eval_temperature, "max_tokens": s.max_gen_per_turn}
        return await evaluate_each(self, tasks, self._eval_one, _EVAL_REPORT, params)

    async def _eval_one(self, index: int) -> Episode | None:
        played = await self.play(self.test_split, index, 1, self.config.eval_temperature)
        return played[0] if played else None


_EVAL_REPORT = episode_report("index", finished="finished")


def _tool_turn(name: str, result: ToolResult) -> dict[str, Any]:
    """A tool message for `result`, its reward kept (`reward`: None when none was given)."""
    return {"role": "tool", "name": name, "content": result.text, "reward": result.reward}


def _pick(splits: dict[str, str], chosen: str | None, types: tuple[str, ...], flag: str) -> str:
    """The split named `chosen`, else the first of the first type in `types`, else the first."""
    if chosen is not None:
        if chosen not in splits:
            raise ConfigError(f"--env.{flag} {chosen!r}: the splits are {sorted(splits)}")
        return chosen
    for kind in types:
        for name, found in splits.items():
            if found == kind:
                return name
    if not splits:
        raise ConfigError("the ORS environment has no splits")
    return next(iter(splits))


def _renders_tools(tokenizer: Any, schemas: list[dict[str, Any]]) -> bool:
    """Whether the chat template renders `tools` (else they go in the system prompt)."""
    if not schemas:
        return False
    probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    try:
        plain = tokenizer.apply_chat_template(probe, tokenize=False)
        with_tools = tokenizer.apply_chat_template(probe, tokenize=False, tools=schemas)
    except Exception:  # a template that refuses `tools` renders none
        return False
    return bool(with_tools != plain)


async def _close(sessions: list[ORSSession]) -> None:
    await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)


def env_class(spec: str) -> type[ORSEnv]:
    """The environment class of `ors:URL[#ENV]` (a subclass of `ORSEnv` bound to it)."""
    parsed = parse(spec)
    label = "".join(c if c.isalnum() or c in "_-" else "_" for c in parsed.env or "remote")
    attrs = {
        "name": f"ors_{label}",
        "url": parsed.target,
        "remote_env": parsed.env,
        "__doc__": f"The ORS environment {spec}.",
        "__module__": __name__,
    }
    made: type[ORSEnv] = type(f"ORS_{label}", (ORSEnv,), attrs)
    return made

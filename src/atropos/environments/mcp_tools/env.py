"""`MCPTools`: the environment and its token-exact rollout loop.

A group is `group_size` episodes of one task. The first reply is one `chat_turn` with
`n=group_size` on a `ManagedServer` session; each episode then goes on by itself, on its own
`ManagedServer` over the same pinned server holding only its own sequence: the calls of its
last reply are run against the MCP servers (`ToolServers`), their results appended as tool
turns (prompt tokens: masked, logprob 1.0) and the next reply sampled and trained with the
server's logprobs. An episode ends at a reply without calls (its final answer), after
`max_turns` replies, at a reply cut by the token limit, or when the next turn would not fit
in `max_token_length`; or at a limit of its `RolloutLimits` (`max_turns`, `max_tool_calls`,
`max_seconds`). How each ended is its outcome (`atropos.envs.outcome`): a limit, a reply cut
by its token limit or a full budget make it `truncated/<limit>` (scored as it stands, or masked
under `--env.truncated mask`); an episode that wrote an unreadable `<tool_call>` (and was not
cut) is `invalid/malformed_call`, scored as usual; a tool server that stops answering fails the
group (`failed/tool_server`), never scores it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from atropos.environments.common.multiturn import (
    continue_alone,
    node_group,
    reply_room,
    require_token_servers,
)
from atropos.environments.common.tool_calls import ParsedCalls, parse_text
from atropos.environments.mcp_tools.config import MCPToolsConfig
from atropos.environments.mcp_tools.servers import ToolReply, ToolServers
from atropos.environments.mcp_tools.tasks import (
    Task,
    call_share,
    episode_score,
    final_score,
    load_tasks,
)
from atropos.envs.base import BaseEnv
from atropos.envs.config import ConfigError
from atropos.envs.evaluation import Report, evaluate_each
from atropos.envs.outcome import RolloutLimits, invalid, truncated, with_outcomes
from atropos.envs.simple import ShuffledPasses
from atropos.envs.types import Item, ScoredDataGroup
from atropos.inference.sequence import DriftKind, SequenceNode

__all__ = ["SYSTEM_PROMPT", "Episode", "MCPTools"]

log = logging.getLogger("atropos.env")

SYSTEM_PROMPT = (
    "You can call tools to answer the user's request. To call tools, reply with one"
    ' <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call> block per call and nothing'
    " else; the results come back as tool messages. When you know the answer, reply with it"
    " inside <answer></answer> and call no tool."
)
_MALFORMED = (
    'error: a <tool_call> block could not be read: write {"name": "TOOL", "arguments": {...}}'
    " as JSON"
)


@dataclass
class Episode:
    """One rollout of a task: the conversation and its token-exact sequence.

    Attributes:
        messages: the prompt, then each reply and the tool turns after it.
        node: the sequence (tokens, masks, logprobs) through the last reply.
        finish: the last reply's finish reason.
        calls: every call the policy made (`{"name", "arguments"}`), in order.
        errors: tool turns that were errors (unknown tool, bad arguments, a failed tool,
            an unreadable block, a call past `max_calls_per_turn`).
        turns: replies given.
        malformed: unreadable `<tool_call>` blocks it wrote (`invalid/malformed_call`).
        forks: later turns whose prompt did not extend the held tokens (`DriftKind.FORK`).
        ended: "answer", "max_turns", "max_tool_calls", "max_seconds", "length" (a reply
            cut by its token limit) or "budget" (the next turn would not fit); None while it
            runs.
        started: when it started (`time.monotonic()`), for `max_seconds`.
    """

    messages: list[dict[str, Any]]
    node: SequenceNode
    finish: str
    calls: list[dict[str, Any]] = field(default_factory=list)
    errors: int = 0
    turns: int = 1
    malformed: int = 0
    forks: int = 0
    ended: str | None = None
    started: float = field(default_factory=time.monotonic)

    @property
    def final(self) -> str | None:
        """The final answer's reply (None unless the episode ended with one)."""
        return str(self.messages[-1]["content"]) if self.ended == "answer" else None

    @property
    def limit(self) -> str | None:
        """The limit that cut the episode (`outcome.LIMITS`), None when it answered."""
        return _LIMIT_OF.get(self.ended or "")


_LIMIT_OF = {
    "max_turns": "turns",
    "max_tool_calls": "tool_calls",
    "max_seconds": "seconds",
    "length": "tokens",
    "budget": "tokens",
}


class MCPTools(BaseEnv[MCPToolsConfig]):
    """Tool use against MCP servers started from the config, scored on the final answer."""

    name = "mcp_tools"
    requires: ClassVar[dict[str, str]] = {"mcp": "mcp"}
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 8, "max_token_length": 4096, "use_wandb": False
    }  # fmt: skip
    seed: ClassVar[int] = 0
    _servers: ToolServers | None = None
    tools: list[dict[str, Any]] | None = None  # the schemas given to the chat template

    # ----- set-up -------------------------------------------------------------------------------

    async def setup(self) -> None:
        """Load the tasks, start the MCP servers (once per process) and decide where the tool
        schemas go.

        Raises:
            ConfigError: an openai server (this env needs token ids), tasks that do not load
                or expect tools no server offers, a server that does not start.
        """
        require_token_servers(self)
        s = self.config
        self.tasks = load_tasks("train", s.dataset_name)
        self.test_tasks = load_tasks("test", s.dataset_name)
        if self._servers is None:
            servers = self._servers = ToolServers(s.servers, s.server_restarts)
            self.on_close(servers.stop)  # before the start: a run stopped during it stops them
            await asyncio.gather(  # the tokenizer loads while the servers start
                servers.start(s.start_timeout, s.stop_grace, s.prefix_tools),
                asyncio.to_thread(lambda: self.tokenizer),
            )
        self._check_expected_tools()
        self.tools = self._schemas_for_template()
        self._passes = ShuffledPasses(self.tasks, self.seed)

    @property
    def servers(self) -> ToolServers:
        """The running MCP servers (after `setup`)."""
        if self._servers is None:
            raise RuntimeError("mcp_tools: the MCP servers start in setup(); call it first")
        return self._servers

    def _check_expected_tools(self) -> None:
        offered = set(self.servers.tools)
        for task in [*self.tasks, *self.test_tasks]:
            unknown = sorted({c["name"] for c in task.expected_calls} - offered)
            if unknown:
                raise ConfigError(
                    f"task {task.id!r} expects calls to {unknown}, which no MCP server offers"
                    f" (the tools: {sorted(offered)})"
                )

    def _schemas_for_template(self) -> list[dict[str, Any]] | None:
        """The schemas for the chat template's `tools`, or None when they go in the system
        prompt (asked for, or the template renders no tools)."""
        schemas = self.servers.schemas()
        if self.config.tool_schemas == "system":
            return None
        probe = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        try:
            plain = self.tokenizer.apply_chat_template(probe, tokenize=False)
            with_tools = self.tokenizer.apply_chat_template(probe, tokenize=False, tools=schemas)
        except Exception:  # a template that refuses `tools`: it renders none
            with_tools = plain = ""
        if with_tools == plain:
            log.warning(
                "mcp_tools: the chat template renders no tools; the tool schemas go in the"
                " system prompt (--env.tool_schemas system says so and hides this warning)"
            )
            return None
        return schemas

    async def get_next_item(self) -> Item:
        return self._passes.next()

    def prompt(self, task: Task) -> list[dict[str, Any]]:
        """The first turn: the system prompt (with a `<tools>` block when the template gets no
        tools) and the task's request."""
        system = SYSTEM_PROMPT
        if self.tools is None:
            lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in self.servers.schemas())
            system += f"\n\n<tools>\n{lines}\n</tools>"
        return [{"role": "system", "content": system}, {"role": "user", "content": task.prompt}]

    # ----- rollouts -----------------------------------------------------------------------------

    @property
    def limits(self) -> RolloutLimits:
        """An episode's bounds from the config (the token bound is `max_token_length`)."""
        return self.config.rollout_limits(max_turns=self.config.max_turns)

    def _room(self, tokenizer: Any, messages: list[dict[str, Any]]) -> int:
        """Tokens left for the next reply after `messages` (rendered with the tools)."""
        return reply_room(tokenizer, messages, self.config.max_token_length, tools=self.tools)

    async def play(
        self, task: Task, n: int, split: str = "train", temperature: float | None = None
    ) -> list[Episode] | None:
        """`n` episodes of `task`, token-exact; None when its prompt alone does not fit.

        Raises:
            ToolServerError: an MCP server stopped answering (the group is not scored).
        """
        s, tokenizer = self.config, self.tokenizer  # the tokenizer before the servers
        context = self.prompt(task)
        room = self._room(tokenizer, context)
        if room < 1:
            return None
        sampling = {
            "split": split,
            "temperature": s.temperature if temperature is None else temperature,
        }
        async with self.server.managed_server(tokenizer=tokenizer) as session:
            first = await session.chat_turn(
                messages=context,
                n=n,
                max_tokens=min(s.max_gen_per_turn, room),
                tools=self.tools,
                **sampling,
            )
            episodes = [
                Episode([*context, {"role": "assistant", "content": content}], node, finish)
                for content, finish, node in zip(
                    first.contents, first.finish_reasons, first.nodes, strict=True
                )
            ]
            outcomes = await asyncio.gather(
                *(self._go_on(session, ep, sampling) for ep in episodes), return_exceptions=True
            )
        failed = [o for o in outcomes if isinstance(o, BaseException)]
        if failed:
            raise failed[0]
        return episodes

    async def _go_on(self, session: Any, ep: Episode, sampling: dict[str, Any]) -> None:
        """Run the calls of each reply and sample the next, until the episode ends."""
        s, limits = self.config, self.limits
        while ep.ended is None:
            parsed = parse_text(str(ep.messages[-1]["content"]))
            used = {"turns": ep.turns, "tool_calls": len(ep.calls)}
            limit = limits.exceeded(**used, seconds=time.monotonic() - ep.started)
            if ep.finish == "length":
                ep.ended = "length"
            elif not parsed.calls and not parsed.malformed:
                ep.ended = "answer"
            elif limit is not None:
                ep.ended = f"max_{limit}"
            else:
                messages = [*ep.messages, *await self._tool_turns(parsed, ep)]
                room = self._room(session.tokenizer, messages)
                if room < 1:
                    ep.ended = "budget"
                    return
                await self._reply(session, ep, messages, min(s.max_gen_per_turn, room), sampling)

    async def _tool_turns(self, parsed: ParsedCalls, ep: Episode) -> list[dict[str, Any]]:
        """The tool turns answering one reply's calls, run at once (unreadable blocks and calls
        past `max_calls_per_turn` get an error turn each)."""
        s = self.config
        run, extra = parsed.calls[: s.max_calls_per_turn], parsed.calls[s.max_calls_per_turn :]
        replies = list(
            await asyncio.gather(
                *(
                    self.servers.call(
                        c["name"], c.get("arguments"), s.call_timeout, s.max_result_chars
                    )
                    for c in run
                )
            )
        )
        too_many = f"error: at most {s.max_calls_per_turn} calls per reply; this one was not run"
        replies += [ToolReply(too_many, True)] * len(extra)
        ep.calls.extend({"name": c["name"], "arguments": c.get("arguments")} for c in parsed.calls)
        turns = [
            {"role": "tool", "name": str(c["name"]), "content": r.text}
            for c, r in zip(parsed.calls, replies, strict=True)
        ]
        turns += [{"role": "tool", "content": _MALFORMED}] * parsed.malformed
        ep.errors += sum(r.error for r in replies) + parsed.malformed
        ep.malformed += parsed.malformed
        return turns

    async def _reply(
        self,
        session: Any,
        ep: Episode,
        messages: list[dict[str, Any]],
        max_tokens: int,
        sampling: dict[str, Any],
    ) -> None:
        """Sample the episode's next reply after `messages`, extending its own sequence."""
        turn = await continue_alone(
            session, ep.node, messages, max_tokens=max_tokens, tools=self.tools, **sampling
        )
        ep.node, ep.finish = turn.nodes[0], turn.finish_reasons[0]
        ep.forks += ep.node.drift is DriftKind.FORK
        ep.messages = [*messages, {"role": "assistant", "content": turn.contents[0]}]
        ep.turns += 1

    # ----- scoring ------------------------------------------------------------------------------

    def score(self, task: Task, ep: Episode) -> float:
        """An episode's score (`tasks.episode_score`: the answer, plus `call_credit` for the
        expected calls)."""
        return episode_score(task, ep.final, ep.calls, self.config.call_credit)

    def _record(self, task: Task, episodes: list[Episode], scores: list[float]) -> None:
        """Keep this group's numbers for `wandb_log`'s means."""
        self.record_mean("train/accuracy", [final_score(task, e.final) for e in episodes])
        self.record_mean("train/avg_score", scores)
        self.record_mean("train/answered", [float(e.ended == "answer") for e in episodes])
        self.record_mean("train/turns", [float(e.turns) for e in episodes])
        self.record_mean("train/tool_calls", [float(len(e.calls)) for e in episodes])
        self.record_mean("train/tool_errors", [float(e.errors) for e in episodes])
        self.record_mean("train/expected_calls_made", [call_share(task, e.calls) for e in episodes])
        self.record_mean("train/drift_forks", [float(e.forks) for e in episodes])

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        task: Task = item
        episodes = await self.play(task, self.config.group_size)
        if not episodes:  # its prompt alone does not fit
            self.drop("prompt_too_long")
            return None, []
        scores = [self.score(task, ep) for ep in episodes]
        self._record(task, episodes, scores)  # all-equal groups: the runner's rule drops them
        rule = self.config.truncated
        entries = [
            truncated(ep.limit, rule)
            if ep.limit
            else invalid("malformed_call")
            if ep.malformed
            else {}
            for ep in episodes
        ]
        return with_outcomes(_group(episodes, scores), entries), []

    # ----- evaluation ---------------------------------------------------------------------------

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """One episode per held-out task at `eval_temperature` (0: greedy), at most
        `max_eval_workers` at once; logs `eval/accuracy` (right final answers),
        `eval/avg_score` and `eval/tool_calls` with a sample per task.

        `envs.evaluation.evaluate_each`, not `Env.evaluate`: an episode is a multi-turn
        conversation."""
        s = self.config
        params = {"temperature": s.eval_temperature, "max_tokens": s.max_gen_per_turn}
        tasks = self.test_tasks[: s.eval_limit or None]
        return await evaluate_each(self, tasks, self._eval_episode, self._eval_report, params)

    async def _eval_episode(self, task: Task) -> Episode | None:
        played = await self.play(task, 1, "eval", self.config.eval_temperature)
        return played[0] if played else None

    def _eval_report(self, played: list[tuple[Task, Episode]]) -> Report:
        samples = [self.eval_sample(task, ep) for task, ep in played]

        def mean(key: str) -> float:
            return sum(float(x[key]) for x in samples) / len(samples)

        metrics = {
            "eval/accuracy": mean("correct"),
            "eval/avg_score": mean("score"),
            "eval/tool_calls": mean("tool_calls"),
        }
        return metrics, samples

    def eval_sample(self, task: Task, ep: Episode) -> dict[str, Any]:
        """The row of `samples.jsonl` for one held-out task."""
        return {
            "id": task.id,
            "messages": ep.messages,
            "score": self.score(task, ep),
            "correct": final_score(task, ep.final),
            "tool_calls": len(ep.calls),
            "ended": ep.ended,
        }


def _group(episodes: list[Episode], scores: list[float]) -> ScoredDataGroup:
    """The group of `episodes`: each row is its sequence's tokens, masks and logprobs, with
    the conversation those tokens hold (through its last reply)."""
    nodes = [ep.node for ep in episodes]
    return node_group(nodes, scores, [ep.node.messages or ep.messages for ep in episodes])

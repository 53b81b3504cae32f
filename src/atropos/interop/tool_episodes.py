"""The tool-use kinds of `interop.episodes`: `mcp_tools` (`ToolUse`) and `tool_use_multiturn`
(`Replayed`, at the end of this module) as stepped episodes.

The env's own parts do the work: its MCP servers (started by its `setup`) list the tools and
run each call (`ToolServers.call`, with `--env.call_timeout` and `--env.max_result_chars`), and
its scorer (`tasks.episode_score`: the final answer, plus `--env.call_credit` for the expected
calls) gives the reward at the end. Splits: `train` and `test`, the env's task sets.

- ORS: the tools are the servers' tools (their input schemas) and `answer {"answer"}`; a tool
  call's output is the tool's text (no reward, not finished); `answer` ends the episode with the
  score. The episode ends, scored as no answer, after `--env.max_tool_calls` calls (unset:
  `--env.max_turns` times `--env.max_calls_per_turn`).
- OpenEnv (a whole reply): a reply's `<tool_call>` blocks are run (at most
  `--env.max_calls_per_turn`; unreadable blocks and extra calls get an error turn, as in the
  env's own loop), their tool turns the next observation; a reply without calls is the final
  answer, scored. After `--env.max_turns` replies (or `--env.max_tool_calls` calls) the episode
  ends, scored as it stands (no answer).

Choice: published, the tool schemas go in the system prompt (as `--env.tool_schemas system`),
so a policy that reads text (OpenEnv's action is text) sees them; ORS lists them too. A tool
server that stops answering raises `ToolServerError` (the episode fails; never a reward).

`tool_use_multiturn` replays recorded conversations: its tool responses are data, never run,
and each turn is judged on the whole reply's set of calls. So a turn is one whole reply (over
ORS the one tool `reply {"text"}`, as a game's `act`), judged by the env (`judge`: the calls
against the turn's expected ones, the think block when `--env.require_think`); the next
observation is the recorded messages before the next turn; the episode ends at the first failed
turn or after the last, its reward the env's (`reward`: the scenario's rule, -1 floor), none
before. The length penalty of its group scores is the trainer's side, not applied here.
"""

from __future__ import annotations

from typing import Any

from atropos.environments.common.tool_calls import parse_text
from atropos.environments.mcp_tools.servers import ToolReply
from atropos.environments.mcp_tools.tasks import episode_score
from atropos.interop.stepped import Adapter, Episode, OneTool, Step, text_argument, tool_spec

__all__ = ["Replayed", "ToolUse"]

ANSWER = tool_spec("answer", "Give your final answer; it ends the episode.", "answer", "it")


class ToolUse(Adapter):
    """`mcp_tools`: its MCP servers' tools, run by them, and `answer`, scored by the env."""

    tools: list[dict[str, Any]] = []

    async def setup(self) -> None:
        env: Any = self.env
        env.config = env.config.model_copy(update={"tool_schemas": "system"})
        await super().setup()

    async def load(self) -> None:
        env: Any = self.env
        offered = env.servers.tools
        if "answer" in offered:
            raise ValueError(
                "an MCP server offers a tool named 'answer', the name of the final-answer tool"
                " of a published mcp_tools: rename it (or set the servers' prefix_tools)"
            )
        self.tools = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in (offered[n] for n in sorted(offered))
        ] + [ANSWER]
        self.splits["train"] = list(env.tasks)
        if env.test_tasks:
            self.splits["test"] = list(env.test_tasks)

    async def start(self, item: Any) -> Episode:
        return _ToolEpisode(self.env, item)


class _ToolEpisode(Episode):
    def __init__(self, env: Any, task: Any) -> None:
        super().__init__()
        self.env, self.task, self.s = env, task, env.config
        self.max_turns = 2**31  # the limits are this kind's own (module docstring)
        self.messages = env.prompt(task)
        self.calls: list[dict[str, Any]] = []
        per_turn = self.s.max_turns * self.s.max_calls_per_turn
        self.max_calls = self.s.max_tool_calls or per_turn

    def _score(self, final: str | None) -> Step:
        score = episode_score(self.task, final, self.calls, self.s.call_credit)
        return Step(f"score: {score:g}", score, True)

    async def _run(self, name: str, arguments: Any) -> ToolReply:
        self.calls.append({"name": name, "arguments": arguments})
        s = self.s
        reply: ToolReply = await self.env.servers.call(
            name, arguments, s.call_timeout, s.max_result_chars
        )
        return reply

    async def _call(self, name: str, arguments: dict[str, Any]) -> Step:
        if name == "answer":
            return self._score(text_argument(name, arguments, "answer"))
        if name not in self.env.servers.tools:
            known = ", ".join([*sorted(self.env.servers.tools), "answer"])
            raise ValueError(f"{name!r} is not a valid tool (the tools: {known})")
        reply = await self._run(name, arguments)
        if len(self.calls) >= self.max_calls:
            return self._score(None)
        return Step(reply.text)

    async def _reply(self, text: str) -> Step:
        parsed = parse_text(text)
        if not parsed.calls and not parsed.malformed:
            return self._score(text)
        s = self.s
        run, extra = parsed.calls[: s.max_calls_per_turn], parsed.calls[s.max_calls_per_turn :]
        replies = [await self._run(str(c["name"]), c.get("arguments")) for c in run]
        too_many = f"error: at most {s.max_calls_per_turn} calls per reply; this one was not run"
        self.calls += [{"name": c["name"], "arguments": c.get("arguments")} for c in extra]
        replies += [ToolReply(too_many, True)] * len(extra)
        replies += [ToolReply("error: a <tool_call> block could not be read", True)] * (
            parsed.malformed
        )
        if self.turns + 1 >= s.max_turns or len(self.calls) >= self.max_calls:
            return self._score(None)
        names = [str(c["name"]) for c in parsed.calls] + [""] * parsed.malformed
        turns = tuple(
            {"role": "tool", "name": n, "content": r.text}
            for n, r in zip(names, replies, strict=True)
        )
        return Step("\n\n".join(r.text for r in replies), None, False, turns)


# ----- replayed tool use (tool_use_multiturn) --------------------------------------------------

REPLY = tool_spec(
    "reply",
    "Give your reply to this turn, as the system prompt asks: <think>...</think>, then your"
    " <tool_call> blocks (or, when no function fits, your answer to the user).",
    "text",
    "your whole reply",
)


class Replayed(Adapter):
    """`tool_use_multiturn`: a turn is one whole reply (`reply {"text"}` over ORS), judged by the
    env against the turn's expected calls; the recorded tool responses (and the user's
    follow-ups) are the next observation; the env's episode reward at the end."""

    tools = [REPLY]

    async def load(self) -> None:
        env: Any = self.env
        self.splits["train"] = list(env.episodes)
        if env.test_episodes:
            self.splits["test"] = list(env.test_episodes)

    async def start(self, item: Any) -> Episode:
        return _ReplayedEpisode(self.env, item)


class _ReplayedEpisode(OneTool):
    tool, field = "reply", "text"

    def __init__(self, env: Any, episode: Any) -> None:
        from atropos.environments.tool_use_multiturn.env import Trajectory

        super().__init__()
        self.env, self.episode = env, episode
        self.messages = [dict(m) for m in episode.context]
        self.max_turns = len(episode.turns)
        # judged and rewarded by the env's own rules; no token sequence here (the remote
        # trainer holds the tokens)
        self.trajectory = Trajectory(list(self.messages), node=None)  # type: ignore[arg-type]

    async def _reply(self, text: str) -> Step:
        turn = self.trajectory.turns
        self.env.judge(self.episode, self.trajectory, turn, text)
        if self.trajectory.stopped is not None or turn + 1 >= len(self.episode.turns):
            reward = float(self.env.reward(self.episode, self.trajectory))
            return Step(f"reward: {reward:g}", reward, True)
        replay = tuple(dict(m) for m in self.episode.turns[turn + 1].replay)
        return Step("\n\n".join(str(m["content"]) for m in replay), None, False, replay)

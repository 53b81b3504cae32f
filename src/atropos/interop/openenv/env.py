"""`OpenEnv`: an OpenEnv environment (a running server, or an installed class we serve) played
as an Atropos environment, token-exactly.

`openenv:http://HOST:PORT` plays the server there; `openenv:package.module:Class` serves that
class first (`launch`). Items are reset seeds (`--env.first_seed` on, one per item); a group is
`group_size` episodes of one seed, each on its own WebSocket session (at most
`--env.max_sessions` open at once, the server's capacity for a class we serve) and its own
`ManagedServer` session, so every turn extends the held token ids: the policy's replies are
trained, the observations (user turns) and tool results (tool turns) masked.

An episode: `reset(seed)` gives the first observation, rendered as the user turn
(`actions.observation_text`); each reply becomes actions (`actions.ActionMapping`: tool calls,
a text field or a JSON object), stepped in order; each step's reward is kept on the reply's
message (`reward`, the sum over its steps) and the next observation is the next user (or tool)
turn. It ends when a step says `done`, at a tool environment's answer without calls, after
`max_turns` replies (`truncated/turns`) or when the next turn would not fit in
`max_token_length` (`truncated/tokens`). Its score is its return: the sum of its step rewards
(a reward of null counts 0). A failure of the remote side (`wire.OpenEnvError`) fails the whole
group (`failed/openenv_*`), never a 0.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import Field, SecretStr

from atropos.environments.common.multiturn import node_group, reply_room, require_token_servers
from atropos.envs.base import BaseEnv
from atropos.envs.config import BaseEnvConfig, ConfigError
from atropos.envs.evaluation import episode_report, evaluate_each
from atropos.envs.outcome import truncated, with_outcomes
from atropos.envs.types import Item, ScoredDataGroup
from atropos.inference.sequence import SequenceNode
from atropos.interop.openenv.actions import (
    ActionMapping,
    Reading,
    observation_text,
    tool_result_text,
)
from atropos.interop.openenv.wire import ActionRejected, OpenEnvError, Session, fetch_schema

__all__ = ["Episode", "OpenEnv", "OpenEnvConfig"]

TOOLS_SYSTEM = (
    'You act in an environment through its tools. Call them with <tool_call>{"name": ...,'
    ' "arguments": {...}}</tool_call> blocks; the results come back as tool messages. Reply'
    " without a call when you are done."
)


class OpenEnvConfig(BaseEnvConfig):
    """`openenv`'s settings (on top of every environment's)."""

    target: str = Field(default="", description="the server's URL or package.module:Class")
    action_field: str = Field(default="", description="the action's text field (unset: auto)")
    tool_parser: str = Field(default="hermes", description="how the policy writes tool calls")
    reset_args: dict[str, Any] = Field(default_factory=dict, description="more reset options")
    max_turns: int = Field(default=8, ge=1, description="replies per episode at most")
    reply_tokens: int = Field(default=512, ge=1, description="token limit of one reply")
    temperature: float = Field(default=1.0, ge=0, description="sampling temperature")
    first_seed: int = Field(default=0, ge=0, description="reset seed of the first item")
    eval_episodes: int = Field(default=20, ge=0, description="episodes per evaluation")
    eval_seed: int = Field(default=1_000_000, ge=0, description="seed of the first eval one")
    step_timeout: float = Field(default=60.0, gt=0, description="seconds per reset/step answer")
    connect_timeout: float = Field(default=10.0, gt=0, description="seconds to connect")
    start_timeout: float = Field(default=120.0, gt=0, description="seconds to serve a class")
    max_sessions: int = Field(default=16, ge=1, description="episodes open on the server")
    python: str = Field(default="", description="interpreter serving a class (unset: auto)")
    api_key: SecretStr = Field(SecretStr(""), description="bearer key for the server")


@dataclass
class Episode:
    """One episode: its conversation, sequence, step rewards and how it ended."""

    messages: list[dict[str, Any]]
    node: SequenceNode | None = None
    rewards: list[float] = field(default_factory=list)
    turns: int = 0
    steps: int = 0
    rejected: int = 0  # replies that were no action the server took
    ended: str = ""  # done, answer, max_turns, tokens

    @property
    def score(self) -> float:
        """The return: the sum of the step rewards."""
        return float(sum(self.rewards))


class OpenEnv(BaseEnv[OpenEnvConfig]):
    """An OpenEnv environment (`openenv:URL` or `openenv:package.module:Class`)."""

    name = "openenv"
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 4, "max_token_length": 4096, "use_wandb": False
    }  # fmt: skip
    url: str = ""
    mapping: ActionMapping
    tools: list[dict[str, Any]] | None = None

    @classmethod
    def named(cls, target: str) -> type[OpenEnv]:
        """This environment for `target` (`openenv:TARGET` on the command line)."""
        if not target:
            raise ValueError("openenv: name a server or a class, as in openenv:http://HOST:PORT")
        defaults = {**cls.config_defaults, "target": target}
        attrs = {"name": f"openenv:{target}", "config_defaults": defaults}
        return type("OpenEnv_named", (cls,), attrs)

    # ----- set-up -------------------------------------------------------------------------------

    def _headers(self) -> dict[str, str] | None:
        key = self.config.api_key.get_secret_value()
        return {"Authorization": f"Bearer {key}"} if key else None

    async def setup(self) -> None:
        """Serve the class (when one is named), read the schema, decide the action mapping."""
        require_token_servers(self)
        s = self.config
        if not s.target:
            raise ConfigError("openenv: no target: run openenv:URL or openenv:package.module:Class")
        capacity = s.max_sessions
        if s.target.startswith(("http://", "https://")):
            self.url = s.target.rstrip("/")
        else:
            from atropos.interop.openenv.launch import launch

            try:
                launched = await launch(s.target, s.python, s.max_sessions, s.start_timeout)
            except ValueError as err:
                raise ConfigError(str(err)) from None
            self.on_close(launched.stop)
            self.url, capacity = launched.url, launched.capacity
        self._gate = asyncio.Semaphore(capacity)
        schema = await fetch_schema(self.url, s.connect_timeout, self._headers())
        action = schema.get("action") or {}
        self.tools = await self._list_tools(action) if _may_have_tools(action) else None
        try:
            self.mapping = ActionMapping.of(action, bool(self.tools), s.action_field, s.tool_parser)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        self.tokenizer  # noqa: B018  (loaded once here, not in the first rollouts)

    async def _list_tools(self, action_schema: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The environment's tools as chat-template schemas (None: it has none)."""
        s = self.config
        async with Session(self.url, s.step_timeout, s.connect_timeout, self._headers()) as remote:
            try:
                step = await remote.step({"type": "list_tools"})
            except (ActionRejected, OpenEnvError):
                return None
        tools = step.observation.get("tools")
        if not isinstance(tools, list) or not tools:
            return None
        return [
            {
                "type": "function",
                "function": {
                    "name": t.get("name", ""),
                    "description": t.get("description", ""),
                    "parameters": t.get("input_schema") or t.get("inputSchema") or {},
                },
            }
            for t in tools
            if isinstance(t, dict)
        ]

    async def get_next_item(self) -> Item:
        seed = self.__dict__.setdefault("_next_seed", self.config.first_seed)
        self._next_seed = seed + 1
        return {"seed": seed}

    def checkpoint_state(self) -> dict[str, Any]:
        """Where the seeds are: a restarted run goes on with the next one."""
        return {"_next_seed": self.__dict__.get("_next_seed", self.config.first_seed)}

    # ----- episodes -----------------------------------------------------------------------------

    async def play_one(self, seed: int, split: str = "train", **sampling: Any) -> Episode:
        """One episode from `seed`, on its own remote and token-exact sessions."""
        s = self.config
        async with self._gate:
            async with Session(self.url, s.step_timeout, s.connect_timeout, self._headers()) as r:
                first = await r.reset(seed=seed, **s.reset_args)
                system = [{"role": "system", "content": TOOLS_SYSTEM}] if self.tools else []
                user = {"role": "user", "content": observation_text(first.observation)}
                ep = Episode([*system, user])
                if first.done:
                    raise OpenEnvError(f"{self.url}: the episode was over at reset", "openenv_done")
                tokenizer = self.tokenizer
                async with self.server.managed_server(tokenizer=tokenizer) as session:
                    await self._turns(session, r, ep, split, sampling)
        return ep

    async def _turns(
        self, session: Any, remote: Session, ep: Episode, split: str, sampling: dict[str, Any]
    ) -> None:
        s = self.config
        params = {"temperature": s.temperature, **sampling, "split": split}
        while True:
            room = reply_room(session.tokenizer, ep.messages, s.max_token_length, 16, self.tools)
            if room < 1:
                ep.ended = "tokens"
                return
            turn = await session.chat_turn(
                messages=ep.messages,
                n=1,
                max_tokens=min(s.reply_tokens, room),
                tools=self.tools,
                **params,
            )
            ep.node, ep.turns = turn.nodes[0], ep.turns + 1
            reply: dict[str, Any] = {"role": "assistant", "content": turn.contents[0]}
            ep.messages.append(reply)
            reward, follow, done = await self._act(remote, self.mapping.read(turn.contents[0]), ep)
            reply["reward"] = reward
            ep.rewards.append(reward)
            if done or not follow:
                ep.ended = "done" if done else "answer"
                return
            if ep.turns >= s.max_turns:
                ep.ended = "max_turns"
                return
            ep.messages.extend(follow)

    async def _act(
        self, remote: Session, reading: Reading, ep: Episode
    ) -> tuple[float, list[dict[str, Any]], bool]:
        """Step the reply's actions: (their reward, the turns that show the results, done)."""
        if reading.problem is not None:
            ep.rejected += 1
            return 0.0, [{"role": "user", "content": f"error: {reading.problem}"}], False
        reward, follow = 0.0, []
        for action in reading.actions:
            try:
                step = await remote.step(action)
            except ActionRejected as err:
                ep.rejected += 1
                follow.append({"role": "user", "content": f"error: the action was refused: {err}"})
                break
            ep.steps += 1
            reward += step.reward or 0.0
            if action.get("type") == "call_tool":
                text = tool_result_text(step.observation)
                follow.append({"role": "tool", "name": action["tool_name"], "content": text})
            else:
                follow.append({"role": "user", "content": observation_text(step.observation)})
            if step.done:
                return reward, follow, True
        return reward, follow, False

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        episodes = await self._group(int(item["seed"]), self.config.group_size)
        if any(e.node is None for e in episodes):  # its first observation alone does not fit
            self.drop("prompt_too_long")
            return None, []
        self.record_mean("train/return", [e.score for e in episodes])
        self.record_mean("train/turns", [float(e.turns) for e in episodes])
        self.record_mean("train/done", [float(e.ended == "done") for e in episodes])
        self.record_mean("train/rejected_actions", [float(e.rejected) for e in episodes])
        return _group(episodes), []

    async def _group(self, seed: int, n: int, **sampling: Any) -> list[Episode]:
        """`n` episodes of `seed`; the first remote failure fails them all (after every
        session is closed)."""
        outcomes = await asyncio.gather(
            *(self.play_one(seed, **sampling) for _ in range(n)), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return [o for o in outcomes if isinstance(o, Episode)]

    # ----- evaluation ---------------------------------------------------------------------------

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """One episode per eval seed at `eval_temperature`: `eval/avg_score` (the mean return),
        `eval/finished` (the share the environment ended: `done`)."""
        s = self.config
        seeds = list(range(s.eval_seed, s.eval_seed + s.eval_episodes))
        params = {"temperature": s.eval_temperature, "max_tokens": s.reply_tokens}
        return await evaluate_each(self, seeds, self._eval_one, _EVAL_REPORT, params)

    async def _eval_one(self, seed: int) -> Episode:
        return await self.play_one(seed, "eval", temperature=self.config.eval_temperature)


def _may_have_tools(action_schema: dict[str, Any]) -> bool:
    """Whether the action schema may be an MCP environment's (the base `Action`, or one with
    `tool_name`): only then is `list_tools` asked."""
    props = action_schema.get("properties") or {}
    return "tool_name" in props or set(props) <= {"metadata", "type"}


def _group(episodes: list[Episode]) -> ScoredDataGroup:
    nodes = [e.node for e in episodes if e.node is not None]
    group = node_group(nodes, [e.score for e in episodes], [e.messages for e in episodes])
    limits = {"max_turns": "turns", "tokens": "tokens"}
    entries = [truncated(limits[e.ended]) if e.ended in limits else {} for e in episodes]
    return with_outcomes(group, entries)


_EVAL_REPORT = episode_report("seed", finished="done")

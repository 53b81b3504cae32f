"""`AgentEnv`: an environment whose rollout is an agent program talking to the policy.

Implement `load()` (the tasks), `agent(task, client)` (an async function that runs the agent
with `client`'s OpenAI or Anthropic client, or set `--env.agent_command` to run an external
program) and `score(task, run)` (or let the agent post its reward). For each task, `group_size`
sessions of the rollout proxy (`atropos.proxy`) run at once; every model call of the agent goes
through its session, so what is trained is exactly what the policy generated:

    class Adder(AgentEnv):
        name = "adder"

        def load(self):
            return [{"question": "What is 2 + 3?", "answer": "5"}]

        async def agent(self, task, client):
            reply = await client.openai.chat.completions.create(
                model=client.model, messages=[{"role": "user", "content": task["question"]}]
            )
            return reply.choices[0].message.content

        def score(self, task, run):
            return 1.0 if task["answer"] in str(run.output) else 0.0

An external agent (`--env.agent_command "python my_agent.py"`) gets the task as JSON on stdin and
in `ATROPOS_TASK`, its session in `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `ANTHROPIC_BASE_URL`,
`ANTHROPIC_API_KEY` (and `ATROPOS_SESSION_URL` to post a reward); its stdout is `run.output`.
Its environment also sets `OPENAI_AGENTS_DISABLE_TRACING=1` (unless that variable is already
set in ours): the OpenAI Agents SDK would otherwise upload its traces to api.openai.com with the
session's key, fail and print `[non-fatal] Tracing request failed` on every run. An agent run in
process (`agent(task, client)`) is the host's own: call `agents.set_tracing_disabled(True)`.

**From rollouts to a group.** A rollout is one session; it may hold several sequences (a
sub-agent, a rewritten history: `atropos.proxy.trajectory`). Every sequence of every rollout
becomes a row of the group and carries its rollout's reward as its score. When every rollout is
one sequence the group is an ordinary GRPO group. When some rollout has several, the group
also carries per-token `advantages`: each rollout's GRPO advantage (its reward minus the mean
over the group's rollouts, over their standard deviation), given to every token of each of its
sequences, so a rollout is not weighted by how many sequences it split into; the group declares
its size (`group_overrides.group_size`).

**Outcomes** (`atropos.envs.outcome`). A rollout whose agent stopped at a limit (the proxy
refused a call past its session's `max_agent_turns` or `max_agent_tokens`, the agent's own
turn limit, `agent_timeout`) with some calls made is `truncated/<limit>` (`turns`, `tokens`,
`seconds`): scored as it stands by `score`, or masked under `--env.truncated mask`. A rollout
whose agent failed otherwise (an exception, a non-zero exit, no model call) is
`failed/<reason>` (`agent_error`, `agent_exit`, `agent_timeout`, `agent_no_calls`; a harness's
own reasons): `collect_trajectories` raises `RolloutFailed`, so the runner counts the item's
rollouts as failed and nothing is scored. `--env.failed_agent_score S` is an explicit opt-in to
train on failed runs anyway: they get score S and are marked `invalid/agent_failed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import shlex
import signal
import time
from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import Field
from typing_extensions import TypeVar

from atropos.envs.base import BaseEnv
from atropos.envs.config import BaseEnvConfig
from atropos.envs.evaluation import evaluate_each, report_rows
from atropos.envs.limits import TruncatedConfig
from atropos.envs.outcome import RolloutFailed, invalid, truncated, with_outcomes
from atropos.envs.simple import ShuffledPasses
from atropos.envs.types import Item, ScoredDataGroup
from atropos.proxy.app import Proxy, ProxySettings
from atropos.proxy.serve import serving
from atropos.proxy.session import Limits, Session
from atropos.proxy.trajectory import Trajectory
from atropos.rewards.group import group_advantages

__all__ = ["AgentClient", "AgentEnv", "AgentEnvConfig", "AgentRun"]


class AgentEnvConfig(BaseEnvConfig, TruncatedConfig):
    """Settings of an agent environment (on top of every environment's); its time limit is
    `agent_timeout`, so of `LimitsConfig` it takes only `truncated`."""

    agent_command: str | None = Field(
        default=None, description="an external agent to run per rollout (shell words)"
    )
    agent_timeout: float = Field(default=600.0, gt=0, description="seconds per rollout")
    max_agent_turns: int = Field(default=32, ge=1, description="model calls per rollout")
    max_agent_tokens: int = Field(
        default=32768, ge=1, description="completion tokens per rollout, all calls together"
    )
    tool_parser: str = Field(default="hermes", description="how tool calls are read from text")
    failed_agent_score: float | None = Field(
        default=None,
        description="opt-in: train on failed rollouts with this score, marked invalid/agent_failed"
        " (unset: a failed rollout fails its group, counted failed/<reason>, never scored)",
    )


AgentConfigT = TypeVar("AgentConfigT", bound=AgentEnvConfig, default=AgentEnvConfig)


@dataclass
class AgentClient:
    """What an agent gets: its session's addresses and key, and ready clients.

    Attributes:
        base_url: the OpenAI base URL (`.../s/ID/v1`).
        anthropic_base_url: the Anthropic base URL (`.../s/ID`).
        api_key: the session's key (both APIs).
        model: the model name to ask for.
        session_url: where to `POST .../reward` a reward.
        session_id: the session's id (`Proxy.alias` names it for header-routed clients).
    """

    base_url: str
    anthropic_base_url: str
    api_key: str
    model: str
    session_url: str
    session_id: str = ""
    _clients: list[Any] = field(default_factory=list, repr=False)

    @property
    def openai(self) -> Any:
        """An `openai.AsyncOpenAI` for this session (made on first use)."""
        import openai

        client = openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0)
        self._clients.append(client)
        return client

    @property
    def anthropic(self) -> Any:
        """An `anthropic.AsyncAnthropic` for this session (the `agents` extra)."""
        import anthropic

        client = anthropic.AsyncAnthropic(
            base_url=self.anthropic_base_url, api_key=self.api_key, max_retries=0
        )
        self._clients.append(client)
        return client

    @property
    def environ(self) -> dict[str, str]:
        """The variables an external agent reads."""
        return {
            "OPENAI_BASE_URL": self.base_url,
            "OPENAI_API_KEY": self.api_key,
            "ANTHROPIC_BASE_URL": self.anthropic_base_url,
            "ANTHROPIC_API_KEY": self.api_key,
            "ATROPOS_MODEL": self.model,
            "ATROPOS_SESSION_URL": self.session_url,
        }

    async def aclose(self) -> None:
        for client in self._clients:
            await client.close()
        self._clients.clear()


@dataclass
class AgentRun:
    """One rollout: the agent's output, its session's trajectory and how it ended."""

    output: Any
    trajectory: Trajectory
    error: str | None = None
    seconds: float = 0.0
    limit: str | None = None  # the limit that stopped it (`truncated/<limit>`), if one did
    failure: str | None = None  # with `error` and no limit: the `failed/<reason>`

    @property
    def failed(self) -> bool:
        """Whether it failed (not at a limit), or made no model call: it has nothing to score."""
        return not self.trajectory.sequences or (self.error is not None and self.limit is None)

    @property
    def reward(self) -> float | None:
        """The reward the agent posted to its session, if any."""
        return self.trajectory.reward


class AgentEnv(BaseEnv[AgentConfigT]):
    """An environment whose rollouts are agent runs through the rollout proxy."""

    env_config_cls: ClassVar[type[BaseEnvConfig]] = AgentEnvConfig
    seed: ClassVar[int] = 0
    eval_group_size: ClassVar[int] = 1

    @abstractmethod
    def load(self) -> Iterable[Item]:
        """The tasks."""

    def load_eval(self) -> Iterable[Item]:
        """Tasks for `evaluate` (none by default)."""
        return []

    async def agent(self, task: Item, client: AgentClient) -> Any:
        """Run the agent on `task` with `client`; what it returns is `run.output`. Default:
        run `--env.agent_command`."""
        command = self.config.agent_command
        if not command:
            raise NotImplementedError(
                f"{type(self).__name__}: override agent(task, client) or set --env.agent_command"
            )
        return await run_command(command, task, client, self.config.agent_timeout)

    def score(self, task: Item, run: AgentRun) -> float:
        """The rollout's reward (may be `async def`). Default: the reward the agent posted."""
        if run.reward is None:
            raise ValueError(
                f"{type(self).__name__}: the agent posted no reward; override score(task, run)"
            )
        return run.reward

    # ----- BaseEnv hooks ------------------------------------------------------------------------

    async def setup(self) -> None:
        self.items = list(self.load())
        if not self.items:
            raise ValueError(f"{type(self).__name__}.load() returned no tasks")
        self._passes = ShuffledPasses(self.items, self.seed)
        text_only = all(getattr(c, "server_type", "") == "openai" for c in self._configs())
        self.proxy = Proxy(self.server, self.tokenizer, self.proxy_settings(), text_only=text_only)
        self._serving = serving(self.proxy)
        self.proxy_url = await self._serving.__aenter__()
        self.on_close(self._stop_proxy)

    def proxy_settings(self) -> ProxySettings:
        """The settings of the environment's own proxy (its limits from `--env.*`)."""
        return ProxySettings(
            model=self._model_name(),
            tool_parser=self.config.tool_parser,
            limits=Limits(
                max_turns=self.config.max_agent_turns,
                max_tokens=self.config.max_agent_tokens,
                max_seconds=self.config.agent_timeout + 60,
            ),
        )

    async def _stop_proxy(self) -> None:
        await self._serving.__aexit__(None, None, None)

    async def get_next_item(self) -> Item:
        return self._passes.next()

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        runs = await asyncio.gather(*(self.rollout(item) for _ in range(self.config.group_size)))
        scores = await self._scores(item, list(runs))
        if scores is None:
            return None, []
        return self.group(list(runs), scores), []  # type: ignore[return-value]

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        """One rollout per `load_eval()` task, each summed up by `eval_sample`, the whole by
        `eval_metrics` (`eval/mean_score`, `eval/accuracy` (> 0), `eval/failed_runs`)."""

        async def play(task: Item) -> dict[str, Any]:
            return await self.eval_sample(task, await self.rollout(task))

        return await evaluate_each(
            self, list(self.load_eval()), play, report_rows(self.eval_metrics), None
        )

    async def eval_sample(self, task: Item, run: AgentRun) -> dict[str, Any]:
        """One evaluation rollout as a logged sample: the task, the output, the error and the
        score (the failed-agent score for a failed run). Override to log more."""
        score = self._failed_score() if run.failed else await _value(self.score(task, run))
        return {"task": task, "output": str(run.output), "error": run.error, "score": score}

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """The evaluation's means over its samples (a failed run without a score counts 0)."""
        scores = [float(s["score"] or 0.0) for s in samples]
        return {
            "eval/mean_score": sum(scores) / len(scores),
            "eval/accuracy": sum(1 for v in scores if v > 0) / len(scores),
            "eval/failed_runs": sum(1 for s in samples if s["error"]) / len(samples),
        }

    # ----- rollouts ----------------------------------------------------------------------------

    async def rollout(self, task: Item) -> AgentRun:
        """Run the agent on `task` in a new session; its trajectory is read when it ends."""
        session = await self.proxy.create_session()
        client = self._client(session)
        start = time.monotonic()
        output, error, limit, failure = None, None, None, None
        try:
            timeout = self.config.agent_timeout
            output = await asyncio.wait_for(self.agent(task, client), timeout)
        except asyncio.TimeoutError:
            error = f"the agent ran past agent_timeout={self.config.agent_timeout:g} s"
            limit, failure = "seconds", "agent_timeout"
        except Exception as err:  # an agent's failure is the rollout's, not the run's
            error = f"{type(err).__name__}: {err}"
            limit, failure = _limit_of(err, session), _failure_of(err)
        finally:
            await client.aclose()
        trajectory = session.trajectory()
        self.proxy.delete(session.id)
        if not trajectory.sequences:
            limit, failure = None, "agent_no_calls" if error is None else failure
        return AgentRun(output, trajectory, error, time.monotonic() - start, limit, failure)

    def _client(self, session: Session) -> AgentClient:
        root = f"{self.proxy_url}/s/{session.id}"
        return AgentClient(
            base_url=f"{root}/v1",
            anthropic_base_url=root,
            api_key=session.key,
            model=self.proxy.settings.model,
            session_url=f"{self.proxy_url}/sessions/{session.id}",
            session_id=session.id,
        )

    async def _scores(self, task: Item, runs: list[AgentRun]) -> list[float] | None:
        """Each run's score; a failed run raises `RolloutFailed` (its reason) unless
        `failed_agent_score` opts in to scoring it."""
        scores = []
        for run in runs:
            if run.failed:
                failed = self._failed_score()
                if failed is None:
                    reason = run.failure or "agent_error"
                    raise RolloutFailed(reason, run.error or "the agent made no model call")
                scores.append(failed)
            else:
                scores.append(await _value(self.score(task, run)))
        return scores

    def outcome(self, run: AgentRun) -> dict[str, Any]:
        """A run's `overrides` entry: `truncated/<limit>` under `--env.truncated`,
        `invalid/agent_failed` for a failed run scored by `failed_agent_score`, else `{}`."""
        if run.failed:
            return invalid("agent_failed")
        if run.limit is not None:
            return truncated(run.limit, self.config.truncated)
        return {}

    def _failed_score(self) -> float | None:
        return self.config.failed_agent_score

    def group(self, runs: list[AgentRun], scores: list[float]) -> dict[str, Any]:
        """The group of these rollouts (see the module docstring for multi-sequence ones)."""
        rows = [(seq, score, i) for i, (run, score) in enumerate(zip(runs, scores, strict=True))
                for seq in run.trajectory.sequences]  # fmt: skip
        group: dict[str, Any] = {
            "tokens": [seq.tokens for seq, _, _ in rows],
            "masks": [seq.masks for seq, _, _ in rows],
            "scores": [score for _, score, _ in rows],
            "messages": [seq.messages for seq, _, _ in rows],
        }
        sources = {seq.token_source for seq, _, _ in rows}
        group["token_source"] = sources.pop() if len(sources) == 1 else "mixed"
        if all(seq.logprobs is not None for seq, _, _ in rows):
            group["inference_logprobs"] = [seq.logprobs for seq, _, _ in rows]
        versions = [seq.policy_version for seq, _, _ in rows if seq.policy_version is not None]
        if versions:
            group["policy_version"] = min(versions)
        if len(rows) != len(runs):
            advantages = group_advantages(scores)
            group["advantages"] = [[advantages[i]] * len(seq.tokens) for seq, _, i in rows]
            group["group_overrides"] = {"group_size": len(rows)}
        entries = [self.outcome(runs[i]) for _, _, i in rows]
        return with_outcomes(group, entries)

    # ----- settings ---------------------------------------------------------------------------

    def _configs(self) -> list[Any]:
        configs = self.server_configs
        return list(configs) if isinstance(configs, list) else [configs]

    def _model_name(self) -> str:
        names = [getattr(c, "model_name", None) for c in self._configs()]
        return next((str(n) for n in names if n), "atropos-policy")


def _limit_of(err: BaseException, session: Session) -> str | None:
    """The limit an agent's exception stopped at: the Agents SDK's own turn limit
    (`MaxTurnsExceeded`), or a session limit the proxy refused a call past; else None."""
    if type(err).__name__ == "MaxTurnsExceeded":
        return "turns"
    used = {"turns": session.turns, "tokens": session.completion_tokens}
    return session.limits.exceeded(**used)


def _failure_of(err: BaseException) -> str:
    """The `failed/<reason>` of an agent's exception: `agent_exit` for a command's non-zero
    exit (`run_command`), else the error's own reason, else `agent_error`."""
    if isinstance(err, AgentExited):
        return "agent_exit"
    kind = getattr(err, "failure_kind", None)
    return kind if isinstance(kind, str) and kind else "agent_error"


class AgentExited(RuntimeError):
    """An agent command exited non-zero (`run_command`)."""


async def _value(score: Any) -> float:
    if inspect.isawaitable(score):
        score = await score
    return float(score)


#: What an agent command's environment sets unless ours already does: the OpenAI Agents SDK's
#: trace upload off (`agents.tracing.provider` reads OPENAI_AGENTS_DISABLE_TRACING), since its
#: traces would go to api.openai.com with the session's key and fail.
_QUIET = {"OPENAI_AGENTS_DISABLE_TRACING": "1"}


async def run_command(command: str, task: Item, client: AgentClient, timeout: float) -> str:
    """Run an external agent for `task`: the task as JSON on stdin and in `ATROPOS_TASK`, the
    session in its environment (with `OPENAI_AGENTS_DISABLE_TRACING=1` unless ours sets it);
    its stdout (stripped) is the output. A non-zero exit raises `AgentExited` (a RuntimeError)
    with the end of its stderr; past `timeout` its process group is killed."""
    text = json.dumps(task, ensure_ascii=False, default=str)
    env = {**_QUIET, **os.environ, **client.environ, "ATROPOS_TASK": text}
    proc = await asyncio.create_subprocess_exec(
        *shlex.split(command),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(text.encode()), timeout)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-5:]
        raise AgentExited(f"agent command exited {proc.returncode}: {' | '.join(tail)}")
    return out.decode(errors="replace").strip()

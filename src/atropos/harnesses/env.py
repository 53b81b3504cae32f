"""`HarnessEnv`: an agent environment (`AgentEnv`) whose rollouts are real agent programs run
in sandboxes against the rollout proxy, each scored by the task's own test.

Per rollout (`atropos.harnesses.run`): a proxy session (its limits: `--env.max_agent_turns`
calls, `--env.max_agent_tokens` completion tokens), a sandbox whose only network is that
proxy, the harness run headless on the task's instruction within `--env.agent_timeout`
seconds, then the task's test in the same sandbox (exit 0 = 1.0, or its reward file).

Every sequence of a rollout's session is a row of the group carrying the rollout's score
(`AgentEnv.group`: a harness that compacts its context or spawns a sub-agent gives several).
A failed rollout (the harness's, the sandbox's or the test's infrastructure: never the
policy's) is not scored: it fails its group, counted `failed/agent_<reason>`
(`train/outcomes/...`), unless `--env.failed_agent_score` opts in to scoring it
(`invalid/agent_failed`), and its reason is counted in `train/harness_failed/<reason>`. A
harness stopped by a limit (exit "limit": the proxy refused a call past the session's turns or
tokens, or its own turn limit) is `truncated/<limit>`, scored as it stands or masked by
`--env.truncated`. Metrics per harness, means over rollouts:
`harness/<name>/calls` (model calls), `tokens` (completion tokens), `tool_calls` (calls the
policy's answers made), `breaks` (calls that started a new sequence: `fork` and `new`, never a
clean or realigned extension), `seconds` (the harness's wall time), `score` (scored rollouts
only), and `harness/<name>/exit/<reason>` (each way of ending's share of the rollouts since the
start: "ok", "limit", or a failure's reason)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any, ClassVar

from pydantic import Field

from atropos.envs.config import BaseEnvConfig
from atropos.envs.types import Item, ScoredDataGroup
from atropos.harnesses import harness_named
from atropos.harnesses.base import Harness, Installed
from atropos.harnesses.run import RolloutResult, RolloutSettings, run_rollout
from atropos.harnesses.tasks import HarnessTask, load_tasks
from atropos.inference.tool_calls import parse_tool_calls
from atropos.proxy.agent_env import AgentEnv, AgentEnvConfig, AgentRun
from atropos.proxy.session import Session
from atropos.proxy.trajectory import Trajectory

__all__ = ["HarnessEnv", "HarnessEnvConfig", "tool_calls_of"]

log = logging.getLogger("atropos.env.harness")
NEW_SEQUENCE = ("fork", "new")  # the break kinds that start a sequence (atropos.proxy.trajectory)


class HarnessEnvConfig(AgentEnvConfig):
    """Settings of a harness environment (on top of every agent environment's)."""

    harness: str = Field(
        default="mini-swe-agent",
        description="claude-code, codex, mini-swe-agent, or a command (shell words)",
    )
    tasks: str = Field(
        default="swe_patch", description="a JSONL of {instruction, snapshot, test}, or swe_patch"
    )
    provider: str = Field(
        default="bubblewrap", description="the sandbox provider: bubblewrap, process, docker"
    )
    image: str | None = Field(
        default=None, description="the local image the tasks run in (--env.provider docker)"
    )
    verifier_timeout: float = Field(default=300.0, gt=0, description="seconds for the test")
    start_timeout: float = Field(default=60.0, gt=0, description="seconds to start a sandbox")
    max_sandboxes: int = Field(default=16, ge=1, description="rollouts running at once")
    sandbox_memory_bytes: int | None = Field(
        default=None, description="RLIMIT_AS per process in the sandbox (unset: none)"
    )
    sandbox_pids: int = Field(default=512, ge=16, description="tasks at once per sandbox")


class HarnessEnv(AgentEnv[HarnessEnvConfig]):
    """Tasks done by an agent program in a sandbox, scored by their tests."""

    name = "harness"
    env_config_cls: ClassVar[type[BaseEnvConfig]] = HarnessEnvConfig
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 4, "use_wandb": False, "max_agent_turns": 32, "agent_timeout": 600.0
    }  # fmt: skip

    def load(self) -> Iterable[Item]:
        self.settings()  # where the tasks run: a provider without its image fails at once
        return load_tasks(self.config.tasks)

    async def setup(self) -> None:
        self.harness: Harness = harness_named(self.config.harness)
        self.installed: Installed = await asyncio.to_thread(self.harness.install)
        self._slots = asyncio.Semaphore(self.config.max_sandboxes)
        self.failures: Counter[str] = Counter()
        await super().setup()

    def settings(self) -> RolloutSettings:
        """Each rollout's settings, from the config."""
        config = self.config
        return RolloutSettings(
            provider=config.provider,
            timeout=config.agent_timeout,
            verifier_timeout=config.verifier_timeout,
            start_timeout=config.start_timeout,
            max_turns=config.max_agent_turns,
            memory_bytes=config.sandbox_memory_bytes,
            pids=config.sandbox_pids,
            image=config.image,
        )

    async def run(self, task: Item, session: Session) -> RolloutResult:
        """The harness on `task` against `session`, tested and scored (`run_rollout`); an
        environment with other tasks (Harbor's) overrides it."""
        settings = self.settings()
        model = self.proxy.settings.model
        return await run_rollout(
            self.harness, self.installed, task, session, self.proxy_url, model, settings
        )

    async def rollout(self, task: Item) -> AgentRun:
        """One harness run on `task` in its own session and sandbox, tested and scored. The
        session is deleted and the sandbox closed however it ends (cancellation included)."""
        session = await self.proxy.create_session()
        start = time.monotonic()
        try:
            async with self._slots:
                result = await self.run(task, session)
        finally:
            trajectory = session.trajectory()
            self.proxy.delete(session.id)
        self._record(result, trajectory)
        error, failure, limit = None, None, None
        if result.failure is not None:
            self.failures[result.failure] += 1
            error, failure = f"{result.failure}: {result.detail}", f"agent_{result.failure}"
            log.warning("harness %s failed on %s: %s", self.harness.name, _id(task), error)
        elif result.exit.reason == "limit":  # the session's limit, else the harness's own turns
            used = {"turns": session.turns, "tokens": session.completion_tokens}
            limit = session.limits.exceeded(**used) or "turns"
        seconds = time.monotonic() - start
        return AgentRun(result, trajectory, error, seconds, limit, failure)

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        group, backlog = await super().collect_trajectories(item)
        if group is not None and not group["tokens"]:  # failed before any model call
            self.drop("no_tokens")
            return None, backlog
        return group, backlog

    def score(self, task: Item, run: AgentRun) -> float:
        result: RolloutResult = run.output
        if result.score is None:  # a failed rollout never reaches score()
            raise ValueError(f"rollout failed ({result.failure}): it has no score")
        return result.score

    def _record(self, result: RolloutResult, trajectory: Trajectory) -> None:
        prefix = f"harness/{self.harness.name}"
        breaks = sum(trajectory.breaks.get(kind, 0) for kind in NEW_SEQUENCE)
        self.record_mean(f"{prefix}/calls", [float(trajectory.turns)])
        self.record_mean(f"{prefix}/tokens", [float(trajectory.completion_tokens)])
        self.record_mean(f"{prefix}/tool_calls", [float(tool_calls_of(trajectory, self))])
        self.record_mean(f"{prefix}/breaks", [float(breaks)])
        self.record_mean(f"{prefix}/seconds", [result.harness_seconds])
        if result.score is not None:
            self.record_mean(f"{prefix}/score", [result.score])
        reason = result.failure or result.exit.reason
        self.exits[reason] += 1

    @property
    def exits(self) -> Counter[str]:
        """Rollouts since the start, by how they ended ("ok", "limit", or a failure)."""
        exits: Counter[str] = self.__dict__.setdefault("_exits", Counter())
        return exits

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        """Adds `train/harness_failed/<reason>` (failed rollouts since the start) and
        `harness/<name>/exit/<reason>` (each way of ending's share of the rollouts)."""
        total = sum(self.exits.values()) or 1
        prefix = f"harness/{self.harness.name}/exit"
        extra = {f"train/harness_failed/{r}": float(n) for r, n in self.failures.items()}
        extra |= {f"{prefix}/{r}": n / total for r, n in self.exits.items()}
        await super().wandb_log({**(metrics or {}), **extra})


def tool_calls_of(trajectory: Trajectory, env: HarnessEnv) -> int:
    """Tool calls the policy made in the rollout: those of the answers each sequence generated
    (its last `len(spans)` assistant turns: a turn a later sequence re-renders after a fork is
    not generated there, so it counts once; a retokenized sequence has no spans: all its
    assistant turns)."""
    parser = env.proxy.settings.tool_parser
    count = 0
    for sequence in trajectory.sequences:
        answers = [m for m in sequence.messages or [] if m.get("role") == "assistant"]
        if sequence.token_source == "server":
            answers = answers[len(answers) - len(sequence.spans) :]
        for message in answers:
            calls = message.get("tool_calls")
            text = str(message.get("content") or "")
            count += len(calls) if calls else len(parse_tool_calls(text, parser).tool_calls)
    return count


def _id(task: Item) -> str:
    return task.id if isinstance(task, HarnessTask) else str(task)[:80]

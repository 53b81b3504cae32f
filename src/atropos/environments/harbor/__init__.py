"""`harbor`: Harbor task folders run unchanged, each rollout scored by the task's own verifier.

`atropos env process harbor --env.tasks PATH` reads PATH (a task folder, or a folder of them;
default: our three in `environments/data/harbor/`), builds each task's image from its
`environment/` (`image.py`), and for every rollout starts the task's sandbox (the docker
provider by default), runs the agent, then `tests/test.sh` in the same sandbox, or in a
verifier sandbox of its own (`environment_mode = "separate"`, Harbor's `tasks init`
default); the reward it writes (`/logs/verifier/reward.json`, else `reward.txt`) is the
score (`trial.py`).

The agent (one per run):

- the policy (default, single turn): it reads `instruction.md` and answers with one ```bash
  block, run once as a script in the sandbox (no block: nothing runs; the verifier still
  scores the untouched task);
- `--env.agent_command "..."`: a scripted agent run in the sandbox, the instruction in
  `/logs/agent/instruction.md` and `$HARBOR_INSTRUCTION`;
- `--env.harness NAME|COMMAND`: a harness (claude-code, codex, mini-swe-agent, or a command)
  run headless in the task's container against the rollout proxy; the environment is then
  `harness.HarborHarness` (an `AgentEnv` on HarnessEnv's plumbing: `Harbor(config)` returns
  one), its groups the proxy's token-exact sequences, its failures failed rollouts;
- `--env.oracle true`: the task's `solution/solve.sh`. Before any rollout every task's oracle
  is run once; a task whose oracle scores below `--env.oracle_min_reward` (default 1.0), or
  fails, is reported broken (logged with why, `harbor/broken_tasks`) and never sampled.

With a scripted agent or the oracle the policy's completions are still sampled (a group
needs tokens) but the score is the script's: these modes check tasks and plumbing, they are
not for training. A rollout whose trial failed (the image missing or not built, the sandbox
not started or dead, the verifier past its timeout or writing no reward) is never a score:
its group raises `SandboxError(reason)`, which the runner counts as failed
(`failed/SandboxError`), and the reason is counted in `train/harbor_failed/<reason>`, as
`code_execution` does. Metrics: `harbor/reward`, `harbor/agent_timeout_rate`,
`harbor/no_block_rate`, `harbor/failed_rate`. docs/harbor.md has the field mapping.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import Iterable
from typing import Any, ClassVar

from pydantic import Field

from atropos.environments.harbor.compose import runnable_tasks
from atropos.environments.harbor.image import ImageFailure, Images, TaskImages
from atropos.environments.harbor.task import SHIPPED_TASKS, HarborTask
from atropos.environments.harbor.trial import Agent, Limits, TrialResult, run_trial
from atropos.envs.config import BaseEnvConfig
from atropos.envs.simple import Env, rollout_group
from atropos.envs.types import Item, Message, ScoredDataGroup
from atropos.proxy.agent_env import AgentEnvConfig
from atropos.sandbox import SandboxError

__all__ = ["Harbor", "HarborConfig", "SHIPPED_TASKS", "bash_block"]

log = logging.getLogger("atropos.env.harbor")
ANSWER_FORMAT = (
    "You work in a Linux sandbox without network access, in the task's working directory."
    " Answer with exactly one ```bash code block: it runs once, as a script, and then the"
    " task is checked."
)
_BLOCK = re.compile(r"```(?:bash|sh|shell)?[ \t]*\n(.*?)```", re.DOTALL)


class HarborConfig(AgentEnvConfig):
    """`harbor`'s settings (`max_agent_turns`, `max_agent_tokens`, `tool_parser` and
    `failed_agent_score` apply with `--env.harness`)."""

    tasks: str | None = Field(
        default=None, description="a Harbor task folder or a folder of them (default: ours)"
    )
    harness: str | None = Field(
        default=None,
        description="the agent: claude-code, codex, mini-swe-agent, or a command, run in the"
        " task's container through the rollout proxy (unset: the policy's bash block)",
    )
    oracle: bool = Field(default=False, description="run solution/solve.sh as the agent")
    oracle_min_reward: float = Field(
        default=1.0, description="an oracle scoring below this marks its task broken"
    )
    agent_command: str | None = Field(
        default=None, description="a scripted agent to run in the sandbox (shell words)"
    )
    provider: str = Field(default="docker", description="the sandbox provider")
    agent_timeout: float = Field(
        default=600.0, gt=0, description="seconds per agent run when task.toml sets none"
    )
    start_timeout: float = Field(default=120.0, gt=0, description="seconds to start a sandbox")
    max_sandboxes: int = Field(default=8, ge=1, description="trials running at once")


class Harbor(Env[HarborConfig]):
    """Harbor tasks: the agent acts in the task's sandbox, the task's verifier scores it."""

    name = "harbor"
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 4, "max_token_length": 2048, "use_wandb": False
    }  # fmt: skip

    def __new__(cls, config: BaseEnvConfig, *args: Any, **kwargs: Any) -> Any:
        """With `--env.harness` the environment is `HarborHarness` (an `AgentEnv` on the
        rollout proxy, atropos.environments.harbor.harness); else this one."""
        harness = getattr(config, "harness", None)
        if cls is not Harbor or not harness:
            return super().__new__(cls)
        if getattr(config, "oracle", False) or getattr(config, "agent_command", None):
            raise ValueError(
                f"--env.harness {harness!r} is the agent: leave out --env.oracle and "
                "--env.agent_command (or leave out --env.harness to use them)"
            )
        from atropos.environments.harbor.harness import HarborHarness

        return HarborHarness(config, *args, **kwargs)

    def load(self) -> Iterable[Item]:
        return runnable_tasks(self.config.tasks or SHIPPED_TASKS)

    async def setup(self) -> None:
        self._images = TaskImages()
        self._slots = asyncio.Semaphore(self.config.max_sandboxes)
        self.broken: dict[str, str] = {}
        await super().setup()
        if self.config.oracle:
            self.items = await self._working(self.items)
            self._passes.items = self.items

    async def _working(self, tasks: list[HarborTask]) -> list[HarborTask]:
        """`tasks` less those whose oracle fails (kept in `self.broken` with why)."""
        results = await asyncio.gather(*(self.trial(t, Agent("oracle")) for t in tasks))
        for task, result in zip(tasks, results, strict=True):
            if result.failure is not None:
                self.broken[task.name] = f"{result.failure}: {result.detail}"
            elif result.reward is not None and result.reward < self.config.oracle_min_reward:
                self.broken[task.name] = (f"its oracle scored {result.reward:g}, below"
                                          f" {self.config.oracle_min_reward:g}")  # fmt: skip
        for name, why in self.broken.items():
            log.warning("harbor: task %s is broken and will not be trained on: %s", name, why)
        self.record_mean("harbor/broken_tasks", [float(len(self.broken))])
        working = [t for t in tasks if t.name not in self.broken]
        if not working:
            listed = "; ".join(f"{n}: {w}" for n, w in self.broken.items())
            raise ValueError(f"harbor: every task is broken (its oracle fails): {listed}")
        return working

    def prompt(self, item: Item) -> list[Message]:
        task: HarborTask = item
        return [{"role": "user", "content": f"{task.instruction.strip()}\n\n{ANSWER_FORMAT}"}]

    def score(self, item: Item, completion: str) -> float:
        raise NotImplementedError("harbor scores whole groups in collect_trajectories")

    async def collect_trajectories(self, item: Item) -> tuple[ScoredDataGroup | None, list[Item]]:
        task: HarborTask = item
        messages = self.prompt(task)
        rollouts = await self.generate(messages, n=self.config.group_size)
        blocks = [bash_block(r.text) for r in rollouts]
        results = await asyncio.gather(*(self.trial(task, self.agent(b)) for b in blocks))
        self.record_mean("harbor/failed_rate", (float(r.failure is not None) for r in results))
        for result in results:
            if result.failure is not None:
                self.failures[result.failure] += 1
        failed = next((r for r in results if r.failure is not None), None)
        if failed is not None:
            raise SandboxError(str(failed.failure), f"{task.name}: {failed.detail}")
        scores = [float(r.reward or 0.0) for r in results]
        self.record_mean("harbor/reward", scores)
        self.record_mean("harbor/agent_timeout_rate", (float(r.agent_timed_out) for r in results))
        self.record_mean("harbor/no_block_rate", (float(b is None) for b in blocks))
        adjusted = self.unless_all_equal(scores)
        if adjusted is None:
            return None, []
        return rollout_group(rollouts, [messages] * len(rollouts), adjusted), []

    @property
    def failures(self) -> Counter[str]:
        """Failed trials since the start, by reason."""
        failures: Counter[str] = self.__dict__.setdefault("_failures", Counter())
        return failures

    async def wandb_log(self, metrics: dict[str, Any] | None = None) -> None:
        """Adds `train/harbor_failed/<reason>`: failed trials since the start."""
        extra = {f"train/harbor_failed/{r}": float(n) for r, n in self.failures.items()}
        await super().wandb_log({**(metrics or {}), **extra})

    def agent(self, block: str | None) -> Agent:
        """This run's agent: the oracle, the scripted command, or the policy's block."""
        if self.config.oracle:
            return Agent("oracle")
        if self.config.agent_command:
            return Agent("command", self.config.agent_command)
        return Agent("script", block or "")

    async def trial(self, task: HarborTask, agent: Agent) -> TrialResult:
        """One trial of `task` (its image made first, once per task)."""
        images = await self.image(task)
        if isinstance(images, TrialResult):
            return TrialResult(failure=images.failure, detail=images.detail)
        limits = Limits(self.config.provider, self.config.start_timeout, self.config.agent_timeout)
        async with self._slots:
            return await run_trial(task, images[0], agent, limits, images[1])

    async def image(self, task: HarborTask) -> Images | TrialResult:
        """The task's image and its separate verifier's (if any), built once; a failure
        (kept, so it is not retried each rollout) as a failed `TrialResult`."""
        images = await self._images.of(task)
        if isinstance(images, ImageFailure):
            return TrialResult(failure=images.reason, detail=images.detail)
        return images


def bash_block(text: str) -> str | None:
    """The last ```bash (or ```sh, or bare ```) block of `text`; None when there is none.

    >>> bash_block("I will:\\n```bash\\necho hi > out.txt\\n```")
    'echo hi > out.txt\\n'
    >>> bash_block("no code") is None
    True
    """
    found = _BLOCK.findall(text)
    return found[-1] if found else None

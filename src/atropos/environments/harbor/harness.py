"""`harbor` with `--env.harness NAME|COMMAND`: the agent of every Harbor trial is a harness
(Claude Code, Codex CLI, mini-SWE-agent, or a command) talking to the policy through the
rollout proxy, as in the `harness` environment (`HarnessEnv`, whose plumbing this is: a proxy
session per rollout with its limits, rollouts at once, metrics, failures by reason, one row
per sequence of the session).

Per rollout: the task's image (built once per task, `image.TaskImages`), its container (the
docker provider, profile "task") with the model-only network to the proxy and the harness's
install mounted read-only, the harness run headless on `instruction.md` within the task's
`[agent] timeout_sec` (`atropos.harnesses.run.run_harness`, via `trial.run_trial`), then the
task's verifier as without a harness (shared or separate); the reward it writes is the score.
A harness failure (`timeout`, `exit_nonzero`, `no_model_call`, ...) and a trial's own
(`image_missing`, `no_reward`, a `SandboxError` reason, ...) fail the rollout with that
reason: never a score of 0 (`train/harness_failed/<reason>`).

`atropos.environments.harbor.Harbor` becomes this class when its config names a harness."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, ClassVar

from pydantic import Field

from atropos.environments.harbor.compose import runnable_tasks
from atropos.environments.harbor.image import ImageFailure, TaskImages
from atropos.environments.harbor.task import SHIPPED_TASKS, HarborTask
from atropos.environments.harbor.trial import (
    Agent,
    HarnessAgent,
    Limits,
    TrialResult,
    run_trial,
)
from atropos.envs.config import BaseEnvConfig
from atropos.envs.types import Item
from atropos.harnesses.base import HarnessExit
from atropos.harnesses.env import HarnessEnv, HarnessEnvConfig
from atropos.harnesses.run import HarnessRun, RolloutResult
from atropos.proxy.session import Session

__all__ = ["HarborHarness", "HarborHarnessConfig", "rollout_result"]


class HarborHarnessConfig(HarnessEnvConfig):
    """`harbor --env.harness ...`: the harness environment's settings over Harbor tasks
    (their images, work dirs, resources and verifier timeouts are the tasks' own)."""

    tasks: str = Field(
        default="", description="a Harbor task folder or a folder of them (default: ours)"
    )
    provider: str = Field(default="docker", description="the sandbox provider")
    start_timeout: float = Field(default=120.0, gt=0, description="seconds to start a sandbox")
    max_sandboxes: int = Field(default=8, ge=1, description="trials running at once")


class HarborHarness(HarnessEnv):
    """Harbor tasks done by a harness in the task's container, scored by the task's verifier."""

    name = "harbor"
    env_config_cls: ClassVar[type[BaseEnvConfig]] = HarborHarnessConfig
    config_defaults: ClassVar[dict[str, Any]] = {
        "group_size": 4, "use_wandb": False, "max_agent_turns": 32, "agent_timeout": 600.0
    }  # fmt: skip

    def load(self) -> Iterable[Item]:
        return runnable_tasks(self.config.tasks or SHIPPED_TASKS)

    async def setup(self) -> None:
        self.images = TaskImages()
        await super().setup()

    async def run(self, task: Item, session: Session) -> RolloutResult:
        """One trial of `task` with the harness as its agent, against `session`."""
        harbor: HarborTask = task
        images = await self.images.of(harbor)
        if isinstance(images, ImageFailure):
            return RolloutResult(HarnessExit(False, "sandbox"), None, images.reason, images.detail)
        run = HarnessRun(self.harness, self.installed, session)
        model = self.proxy.settings.model
        agent = HarnessAgent(run, self.proxy_url, model, self.config.max_agent_turns)
        config = self.config
        limits = Limits(config.provider, config.start_timeout, config.agent_timeout)
        trial = await run_trial(harbor, images[0], Agent("harness", harness=agent), limits,
                                images[1])  # fmt: skip
        return rollout_result(trial)


def rollout_result(trial: TrialResult) -> RolloutResult:
    """A trial as the harness environment's rollout: scored by its reward, or failed with the
    harness's reason or the trial's."""
    exit = trial.harness_exit or HarnessExit(False, "sandbox")
    if trial.failure is not None or trial.reward is None:
        failure = trial.failure or "no_reward"
        return RolloutResult(exit, None, failure, trial.detail, trial.agent_seconds)
    return RolloutResult(exit, trial.reward, None, trial.detail, trial.agent_seconds)

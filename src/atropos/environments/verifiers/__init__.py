"""`verifiers`: run an installed verifiers environment, every model call through our proxy.

`atropos env process verifiers:NAME` (or `verifiers --env.taskset NAME`) loads the verifiers
taskset `NAME` with verifiers' own loader (`verifiers.v1`: `resolve_env_config`,
`load_environment`), and plays each rollout as verifiers does: its harness program runs the
conversation (the taskset's own harness when it ships one, else `null`, verifiers' plain chat
loop, which offers the taskset's tools), its interception server relays each model call, and
the call lands in the rollout's session of our proxy (`atropos.proxy`), so the trained tokens
are the server's own. The episode's reward is what the task's rubric gave (`@vf.reward`
functions, weighted, and judges; `Trace.reward`), its reward functions and metrics are logged.

verifiers' interception keeps one client per endpoint and tells rollouts apart by the
`X-Session-ID` header (its trace id): each trace is aliased to its rollout's session as it is
minted (`Proxy.alias`), so one client and one key serve every rollout. The key is read by
verifiers from `ATROPOS_VERIFIERS_API_KEY`, a name its subprocess runtime withholds from the
programs it starts (it drops every variable whose name holds `API_KEY`).

Chosen differently from verifiers' defaults: the runtime is `subprocess` (verifiers': Prime's
sandboxes, which need an account), and a taskset without its own harness gets `null` rather
than `bash`, which would run the policy's shell commands on this machine; ask for them with
`--env.harness bash --env.runtime docker`. Details and the other settings: docs/ecosystem.md.
"""

from __future__ import annotations

import os
import secrets
from typing import Any, ClassVar

from pydantic import Field

from atropos.environments.verifiers.episodes import (
    episode_error,
    episode_reward,
    episode_signals,
)
from atropos.proxy.agent_env import AgentClient, AgentEnv, AgentEnvConfig, AgentRun
from atropos.proxy.app import ProxySettings

__all__ = ["KEY_VARIABLE", "Verifiers", "VerifiersConfig"]

KEY_VARIABLE = "ATROPOS_VERIFIERS_API_KEY"


class VerifiersConfig(AgentEnvConfig):
    """`verifiers`' settings (on top of every agent environment's)."""

    taskset: str = Field(default="", description="the verifiers taskset id (verifiers:NAME)")
    taskset_args: dict[str, Any] = Field(
        default_factory=dict, description="the taskset's config fields, as JSON or YAML"
    )
    harness: str = Field(
        default="", description="verifiers harness id (unset: the taskset's own, else null)"
    )
    harness_args: dict[str, Any] = Field(
        default_factory=dict, description="the harness's config fields"
    )
    runtime: str = Field(
        default="subprocess", description="where programs run: subprocess, docker, prime, ..."
    )
    verifiers_env: str = Field(
        default="", description="a verifiers Env id (unset: the taskset's own, else single-agent)"
    )
    env_args: dict[str, Any] = Field(
        default_factory=dict, description="more fields of verifiers' EnvConfig (timeouts, roles)"
    )
    max_tasks: int = Field(
        default=10_000, ge=1, description="tasks read from the taskset (an endless one too)"
    )
    eval_size: int = Field(default=20, ge=0, description="tasks of `evaluate`")
    eval_taskset_args: dict[str, Any] | None = Field(
        default=None, description="taskset config of `evaluate` (unset: the training taskset)"
    )
    max_tokens_per_call: int | None = Field(
        default=1024, ge=1, description="max_tokens of each model call (unset: the server's)"
    )


class Verifiers(AgentEnv[VerifiersConfig]):
    """An installed verifiers environment, its model calls recorded token-exactly."""

    name = "verifiers"
    requires: ClassVar[dict[str, str]] = {"verifiers": "verifiers"}
    config_defaults: ClassVar[dict[str, Any]] = {"group_size": 4, "use_wandb": False}

    @classmethod
    def named(cls, taskset: str) -> type[Verifiers]:
        """This environment for the taskset `taskset` (`verifiers:NAME` on the command line)."""
        if not taskset:
            raise ValueError("verifiers: name a taskset, as in verifiers:NAME")
        defaults = {**cls.config_defaults, "taskset": taskset}
        attrs = {"name": f"verifiers:{taskset}", "config_defaults": defaults}
        return type(f"Verifiers_{taskset.replace('-', '_')}", (cls,), attrs)

    # ----- loading ------------------------------------------------------------------------------

    def load(self) -> list[dict[str, Any]]:
        from atropos.environments.verifiers.loading import load_env, read_tasks

        self.vf_env = load_env(self.config, self.config.taskset_args)
        self.tasks = read_tasks(self.vf_env.taskset, self.config.max_tasks)
        return [{"index": i, "key": t.key, "name": t.data.name} for i, t in enumerate(self.tasks)]

    def load_eval(self) -> list[dict[str, Any]]:
        from atropos.environments.verifiers.loading import load_env, read_tasks

        if not hasattr(self, "eval_tasks"):  # read once: every evaluation uses the same tasks
            args = self.config.eval_taskset_args
            source = self.vf_env if args is None else load_env(self.config, args)
            self.eval_tasks = read_tasks(source.taskset, self.config.eval_size)
        return [
            {"index": i, "key": t.key, "name": t.data.name, "eval": True}
            for i, t in enumerate(self.eval_tasks)
        ]

    def proxy_settings(self) -> ProxySettings:
        settings = super().proxy_settings()
        settings.api_key = secrets.token_urlsafe(32)
        return settings

    async def setup(self) -> None:
        await super().setup()  # load() and the proxy
        os.environ[KEY_VARIABLE] = str(self.proxy.settings.api_key)
        self._serving_vf = self.vf_env.serving()
        await self._serving_vf.__aenter__()
        self.on_close(self._stop_verifiers)

    async def _stop_verifiers(self) -> None:
        try:
            await self._serving_vf.__aexit__(None, None, None)
        finally:  # the proxy's key does not outlive the proxy in this process's environment
            os.environ.pop(KEY_VARIABLE, None)

    # ----- rollouts -----------------------------------------------------------------------------

    async def agent(self, task: dict[str, Any], client: AgentClient) -> Any:
        import verifiers.v1 as vf
        from verifiers.v1.env import RunSlot

        vf_task = (self.eval_tasks if task.get("eval") else self.tasks)[task["index"]]
        temperature = self.config.eval_temperature if task.get("eval") else 1.0
        ctx = vf.ModelContext(
            model=client.model,
            client=vf.EvalClientConfig(base_url=f"{self.proxy_url}/v1", api_key_var=KEY_VARIABLE),
            sampling=vf.Sampling(
                temperature=temperature, max_tokens=self.config.max_tokens_per_call
            ),
        )

        def bind(trace: Any) -> None:  # minted before its first call: route it to the session
            self.proxy.alias(trace.id, client.session_id)

        episode = await self.vf_env.run_slot(RunSlot(vf_task), ctx, on_trace=bind)
        error = episode_error(episode)
        if error is not None:
            raise RuntimeError(error)
        return episode

    def score(self, task: dict[str, Any], run: AgentRun) -> float:
        rewards, metrics = episode_signals(run.output)
        for key, value in {**rewards, **metrics}.items():
            self.record_mean(f"verifiers/{key}", [value])
        return episode_reward(run.output)

    async def eval_sample(self, task: dict[str, Any], run: AgentRun) -> dict[str, Any]:
        """A sample with the rubric's reward (0 for a failed run), each reward function's and
        metric's value and the last reply."""
        sample: dict[str, Any] = {"task": task, "error": run.error, "score": 0.0}
        if run.error is None:
            sample["score"] = episode_reward(run.output)
            sample["rewards"], sample["metrics"] = episode_signals(run.output)
            sample["reply"] = run.output.traces[-1].last_reply
        return sample

    def eval_metrics(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        """The base means and each reward function's mean (`eval/reward/<name>`)."""
        metrics = super().eval_metrics(samples)
        keys = sorted({k for s in samples for k in s.get("rewards", {})})
        for key in keys:
            values = [s["rewards"][key] for s in samples if key in s.get("rewards", {})]
            metrics[f"eval/{key}"] = sum(values) / len(values)
        return metrics

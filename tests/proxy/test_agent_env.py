"""`AgentEnv`: rollouts as agent runs through the proxy (Python agents and external commands),
rewards posted or scored, failures, multi-sequence rollouts, and evaluate."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from atropos.envs.config import BaseEnvConfig
from atropos.envs.outcome import RolloutFailed, failure_reason
from atropos.inference.config import APIServerConfig
from atropos.proxy.agent_env import AgentClient, AgentEnv, AgentEnvConfig, AgentRun, run_command
from atropos.testing import FakeInferenceServer


def responder(prompt: str) -> str:
    return "yes" if "good" in prompt else "no"


class Asker(AgentEnv):
    """Asks the task's question once (or twice, in two unrelated conversations)."""

    name = "asker"

    def load(self) -> list[dict[str, Any]]:
        return [{"question": "good?"}, {"question": "bad?"}]

    def load_eval(self) -> list[dict[str, Any]]:
        return self.load()

    async def agent(self, task: dict[str, Any], client: AgentClient) -> Any:
        reply = await client.openai.chat.completions.create(
            model=client.model, messages=[{"role": "user", "content": task["question"]}]
        )
        if task.get("twice"):  # a sub-agent: a second, unrelated conversation
            await client.openai.chat.completions.create(
                model=client.model, messages=[{"role": "user", "content": "summarise"}]
            )
        return reply.choices[0].message.content

    def score(self, task: dict[str, Any], run: AgentRun) -> float:
        return 1.0 if run.output == "yes" else 0.0


def make(env_cls: type[AgentEnv], url: str, **config: Any) -> AgentEnv:
    settings = {"group_size": 2, "use_wandb": False, "tokenizer_name": "tiny", **config}
    server = APIServerConfig(base_url=url, server_type="vllm", model_name="atropos-tiny")
    return env_cls(env_cls.env_config_cls(**settings), [server])


def collect(env: AgentEnv, item: dict[str, Any]) -> Any:
    async def main() -> Any:
        await env.setup()
        try:
            return await env.collect_trajectories(item)
        finally:
            await env.aclose()

    return asyncio.run(main())


@pytest.fixture(scope="module")
def fake() -> Any:
    with FakeInferenceServer(responder=responder) as server:
        yield server


def test_a_group_is_one_row_per_rollout_with_the_servers_tokens(fake):
    group, backlog = collect(make(Asker, fake.base_url), {"question": "good?"})
    assert backlog == [] and group["scores"] == [1.0, 1.0]
    assert group["token_source"] == "server" and "advantages" not in group
    for tokens, masks, logprobs in zip(
        group["tokens"], group["masks"], group["inference_logprobs"], strict=True
    ):
        assert len(tokens) == len(masks) == len(logprobs)
        assert [m for m in masks if m != -100]  # the reply is trained


def test_a_multi_sequence_rollout_gives_every_sequence_its_rollouts_advantage(fake):
    group, _ = collect(make(Asker, fake.base_url, group_size=2), {"question": "good?", "twice": 1})
    assert len(group["tokens"]) == 4 and group["group_overrides"] == {"group_size": 4}
    assert group["scores"] == [1.0] * 4
    assert all(set(a) == {0.0} for a in group["advantages"])  # equal rewards: nothing to learn
    assert [len(a) for a in group["advantages"]] == [len(t) for t in group["tokens"]]


AGENT = textwrap.dedent(
    """
    import json, os, sys, urllib.request
    task = json.load(sys.stdin)
    assert json.loads(os.environ["ATROPOS_TASK"]) == task
    key = os.environ["OPENAI_API_KEY"]
    def post(url, body):
        request = urllib.request.Request(url, json.dumps(body).encode(), method="POST",
            headers={"authorization": "Bearer " + key, "content-type": "application/json"})
        return json.load(urllib.request.urlopen(request))
    reply = post(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
                 {"model": os.environ["ATROPOS_MODEL"],
                  "messages": [{"role": "user", "content": task["question"]}]})
    text = reply["choices"][0]["message"]["content"]
    post(os.environ["ATROPOS_SESSION_URL"] + "/reward", {"reward": 0.25 if text == "yes" else 0})
    if task.get("fail"):
        sys.exit("the agent gave up")
    print(text)
    """
)


class External(AgentEnv):
    name = "external"

    def load(self) -> list[dict[str, Any]]:
        return [{"question": "good?"}]


def test_an_external_agent_gets_its_session_and_its_posted_reward_is_the_score(fake, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    env = make(External, fake.base_url, agent_command=f"{sys.executable} {script}")
    group, _ = collect(env, {"question": "good?"})
    assert group["scores"] == [0.25, 0.25] and len(group["tokens"]) == 2


def test_a_failed_agent_fails_the_group_unless_a_failure_score_opts_in(fake, tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    command = f"{sys.executable} {script}"
    with pytest.raises(RolloutFailed) as failed:  # counted failed/agent_exit, never scored
        collect(make(External, fake.base_url, agent_command=command), {"fail": 1})
    assert failure_reason(failed.value) == "agent_exit"
    env = make(External, fake.base_url, agent_command=command, failed_agent_score=-1.0)
    group, _ = collect(env, {"question": "x", "fail": 1})
    assert group["scores"] == [-1.0, -1.0]  # each failed run still asked once: trained on
    assert group["overrides"] == [{"outcome": "invalid/agent_failed"}] * 2  # the opt-in marked
    runs = asyncio.run(
        _runs(make(External, fake.base_url, agent_command=command), {"question": "x", "fail": 1})
    )
    assert all("the agent gave up" in (run.error or "") for run in runs)


async def _runs(env: AgentEnv, task: dict[str, Any]) -> list[AgentRun]:
    await env.setup()
    try:
        return [await env.rollout(task) for _ in range(2)]
    finally:
        await env.aclose()


def test_timeouts_and_missing_agents_are_the_rollouts_errors(fake):
    class Slow(Asker):
        async def agent(self, task: dict[str, Any], client: AgentClient) -> Any:
            await asyncio.sleep(10)

    runs = asyncio.run(_runs(make(Slow, fake.base_url, agent_timeout=0.2), {"question": "q"}))
    assert all("agent_timeout=0.2" in (r.error or "") for r in runs)
    runs = asyncio.run(_runs(make(External, fake.base_url), {"question": "q"}))
    assert all("--env.agent_command" in (r.error or "") for r in runs)


def test_evaluate_runs_one_rollout_per_task(fake, tmp_path: Path):
    env = make(Asker, fake.base_url, data_dir_to_save_evals=str(tmp_path))

    async def main() -> dict[str, float]:
        await env.setup()
        try:
            return await env.evaluate()
        finally:
            await env.aclose()

    metrics = asyncio.run(main())
    assert metrics == {"eval/mean_score": 0.5, "eval/accuracy": 0.5, "eval/failed_runs": 0.0}
    samples = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [s["output"] for s in samples] == ["yes", "no"]


def test_the_config_is_typed_by_the_generic_argument():
    class Tuned(AgentEnvConfig):
        extra: int = 3

    class Mine(AgentEnv[Tuned]):
        def load(self) -> list[dict[str, Any]]:
            return [{}]

    assert Mine.env_config_cls is Tuned
    env = Mine(BaseEnvConfig(group_size=2, use_wandb=False), [])
    assert env.config.extra == 3 and env.config.agent_timeout == 600.0


class _Session:
    environ = {"OPENAI_BASE_URL": "http://127.0.0.1:1/v1", "OPENAI_API_KEY": "sk-atropos-x"}


SHOW_TRACING = "import os; print(os.environ.get('OPENAI_AGENTS_DISABLE_TRACING'))"


def test_an_agent_command_runs_with_the_agents_sdks_tracing_off(monkeypatch):
    command = f"{sys.executable} -c {json.dumps(SHOW_TRACING)}"
    monkeypatch.delenv("OPENAI_AGENTS_DISABLE_TRACING", raising=False)
    run = asyncio.run(run_command(command, {}, _Session(), 30))  # type: ignore[arg-type]
    assert run == "1"
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "0")  # the user's choice is kept
    assert asyncio.run(run_command(command, {}, _Session(), 30)) == "0"  # type: ignore[arg-type]

"""Harnesses in Docker: the real `codex` binary (a static build: the cheapest real harness)
driven by a scripted policy over the fake inference server, in containers of the tests'
engine whose only network is the environment's rollout proxy.

- `harbor --env.harness codex`: our `count-errors` Harbor task in its own image (profile
  "task"): the right command scores 1 and a wrong one 0 (the task's verifier, shared mode),
  what is trained is what the server returned; a command that hangs past the task's
  `[agent] timeout_sec` is a failed rollout (`timeout`), never a score.
- `harness --env.provider docker --env.image IMAGE`: a JSONL task in the sandbox tests'
  Debian bookworm image (a locked container), scored by its test.

After each: no container on the engine, no model relay of ours, no proxy session."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from atropos.environments.harbor import SHIPPED_TASKS, Harbor
from atropos.environments.harbor.harness import HarborHarness
from atropos.harnesses.env import HarnessEnv, HarnessEnvConfig
from atropos.inference.config import APIServerConfig
from atropos.sandbox._host import owner_label
from atropos.testing import FakeInferenceServer

from .helpers import failing_as_none

BASE = "atropos-harbor:bookworm"  # what our Harbor tasks' Dockerfiles start from
RIGHT = "cat /app/logs/*.log | grep -c ERROR > /app/errors.txt"
WRONG = "echo 0 > /app/errors.txt"
first_calls = itertools.count()


def call(cmd: str, **more: Any) -> str:
    arguments = {"cmd": cmd, **more}
    return f"<tool_call>{json.dumps({'name': 'exec_command', 'arguments': arguments})}</tool_call>"


def policy(prompt: str) -> str:
    """Turn 1: the command (rollouts of a group take the right and a wrong one in turn);
    turn 2: done. [hang]: a command that outlives the agent's timeout."""
    if "<|im_start|>tool" in prompt:
        return "Done."
    if "[hang]" in prompt:
        return call("sleep 60", yield_time_ms=30000)
    if "greet.py" in prompt:
        word = "goodbye" if next(first_calls) % 2 == 0 else "goodby"
        return call(f"echo \"print('{word}')\" > greet.py")
    return call(RIGHT if next(first_calls) % 2 == 0 else WRONG)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeInferenceServer]:
    # Codex's own instructions and tools are ~12k tiny-tokenizer tokens a call
    with FakeInferenceServer(responder=policy, max_model_len=65536) as server:
        yield server


@pytest.fixture(scope="module")
def engine(
    docker_engine: Any, sandbox_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """`DOCKER_HOST` at the tests' engine, our tasks' base tagged from the sandbox image,
    task images saved to a cache of the module's own."""
    docker_engine.docker(["tag", sandbox_image, BASE], check=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", docker_engine.host)
        patch.setenv("ATROPOS_IMAGE_CACHE", str(tmp_path_factory.mktemp("harness-images")))
        yield docker_engine


@pytest.fixture(autouse=True)
def nothing_left(engine: Any) -> Iterator[None]:
    yield
    assert engine.docker(["ps", "-aq"], check=True).stdout.split() == []
    assert relays() == []


def relays() -> list[int]:
    """Our process's model relays still running."""
    found, mine = [], owner_label().encode()
    for pid in os.listdir("/proc"):
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if b"sandbox/relay.py" in line and mine in line:
            found.append(int(pid))
    return found


def harbor_task(tmp_path: Path, marker: str = "", timeout: float | None = None) -> Path:
    """A copy of our `count-errors` task (named after `marker`), its instruction marked."""
    folder = tmp_path / f"count-errors{marker}"
    shutil.copytree(SHIPPED_TASKS / "count-errors", folder)
    toml = folder / "task.toml"
    text = toml.read_text().replace("atropos/count-errors", f"atropos/count-errors{marker}")
    if timeout is not None:
        text = text.replace("[agent]\ntimeout_sec = 60.0", f"[agent]\ntimeout_sec = {timeout}")
    toml.write_text(text)
    instruction = folder / "instruction.md"
    instruction.write_text(f"{instruction.read_text()}\n[{marker or 'task'}]\n")
    return folder


def collect(env: Any) -> Any:
    async def main() -> Any:
        await env.setup()
        try:
            group, _ = await failing_as_none(env, env.items[0])
            assert not env.proxy.sessions
            return group
        finally:
            await env.aclose()

    return asyncio.run(main())


def servers(fake: FakeInferenceServer) -> list[APIServerConfig]:
    return [APIServerConfig(base_url=fake.base_url, server_type="vllm", model_name="atropos-tiny")]


def harbor_env(fake: FakeInferenceServer, tasks: Path, **config: Any) -> Any:
    settings = {"harness": "codex", "tasks": str(tasks), "group_size": 2,
                "tokenizer_name": "tiny", **config}  # fmt: skip
    return Harbor(Harbor.env_config_cls(**settings), servers(fake))


def trained(group: dict[str, Any]) -> list[list[int]]:
    return [
        [t for t, m in zip(tokens, masks, strict=True) if m != -100]
        for tokens, masks in zip(group["tokens"], group["masks"], strict=True)
    ]


@pytest.mark.slow
def test_codex_solves_a_harbor_task_in_its_container_and_its_verifier_scores_it(
    fake, engine, tmp_path
):
    fake.reset_counters()
    env = harbor_env(fake, harbor_task(tmp_path))
    assert isinstance(env, HarborHarness)  # --env.harness makes harbor an agent env
    group = collect(env)
    assert group is not None and sorted(group["scores"]) == [0.0, 1.0]
    assert env.exits == {"ok": 2} and not env.failures
    rows = trained(group)
    assert len(rows) == 2  # one extending conversation per rollout
    assert sum(map(len, rows)) == fake.tokens_generated  # every trained token is the server's
    assert any("grep -c ERROR" in env.tokenizer.decode(row) for row in rows)


@pytest.mark.slow
def test_a_harness_that_hangs_past_the_tasks_timeout_fails_the_rollout(fake, engine, tmp_path):
    env = harbor_env(fake, harbor_task(tmp_path, "hang", timeout=5.0))
    group = collect(env)
    assert group is None  # failed rollouts drop the group: never scored 0
    assert env.failures == {"timeout": 2} and env.exits == {"timeout": 2}


def test_a_harness_with_the_oracle_is_one_clear_error(fake):
    with pytest.raises(ValueError, match="leave out --env.oracle"):
        harbor_env(fake, SHIPPED_TASKS, oracle=True)
    plain = Harbor(Harbor.env_config_cls(group_size=2), servers(fake))
    assert type(plain) is Harbor  # without --env.harness: today's agents


@pytest.mark.slow
def test_harness_env_on_docker_runs_the_task_in_the_image(fake, engine, sandbox_image, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "greet.py").write_text("print('hello')\n")
    row = {"id": "greet", "instruction": "Make greet.py print goodbye.", "snapshot": "repo",
           "test": 'test "$(python3 greet.py)" = goodbye'}  # fmt: skip
    (tmp_path / "tasks.jsonl").write_text(json.dumps(row) + "\n")
    settings = {"harness": "codex", "tasks": str(tmp_path / "tasks.jsonl"), "group_size": 2,
                "tokenizer_name": "tiny", "provider": "docker", "image": sandbox_image,
                "agent_timeout": 120.0}  # fmt: skip
    env = HarnessEnv(HarnessEnvConfig(**settings), servers(fake))
    group = collect(env)
    assert group is not None and sorted(group["scores"]) == [0.0, 1.0]
    assert env.exits == {"ok": 2}


def test_docker_without_an_image_is_one_clear_error(fake, tmp_path):
    (tmp_path / "t.jsonl").write_text('{"instruction": "x", "test": "true"}\n')
    config = HarnessEnvConfig(harness="codex", tasks=str(tmp_path / "t.jsonl"),
                                       provider="docker")  # fmt: skip
    env = HarnessEnv(config, servers(fake))
    with pytest.raises(ValueError, match="--env.provider docker needs --env.image"):
        env.load()

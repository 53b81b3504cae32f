"""Each real harness against `atropos local serve tiny` (the shipped tiny policy on the CPU, a
real server process on 127.0.0.1): the policy writes noise, so a rollout ends as a failed one
with its reason or as a scored one at 0, within its deadline; it never hangs nor raises, and
leaves no sandbox, no session and no process behind.

Cost: one server start (about 5 s) and one rollout per harness, with a couple of calls and 64
completion tokens at most. The tiny model reads Claude Code's prompt (about 25k tokens) in about
10 s a call on this machine and Codex's (about 12k) in about 3 s: about 1-2 minutes in all."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from atropos.harnesses.env import HarnessEnv
from atropos.harnesses.run import RolloutResult
from atropos.inference.config import APIServerConfig
from atropos.testing.proc import descendants, live_processes
from atropos.testing.server_process import ServerProcess

pytest.importorskip("torch")

MODEL = "atropos-tiny"
DEADLINE = 150.0  # the harness's wall time; the noise it gets ends it well before
MAX_MODEL_LEN = 40960  # Claude Code's prompt is about 25k tiny-tokenizer tokens


class LocalServe(ServerProcess):
    """`atropos local serve tiny` as a process of its own, on a free port."""

    label = "atropos local serve"
    log_name = "local-serve"

    def command(self) -> list[str]:
        return [
            sys.executable, "-m", "atropos", "local", "serve", "tiny", "--port", str(self.port),
            "--served-model-name", MODEL, "--device", "cpu",
            "--max-model-len", str(MAX_MODEL_LEN), "--seed", "0",
        ]  # fmt: skip


@pytest.fixture(scope="module")
def local_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalServe]:
    server = LocalServe(
        sys.executable,
        tmp_path_factory.mktemp("local-serve"),
        served_model_name=MODEL,
        start_timeout=120.0,
        stop_grace=10.0,
    )
    with server:
        yield server


def rollout(server: LocalServe, tasks: Path, harness: str) -> tuple[Any, HarnessEnv, float]:
    """One rollout of `harness` on the task, through a `HarnessEnv` over the local server: the
    run (`AgentRun`), the env (closed) and the seconds it took."""
    settings = {
        "harness": harness,
        "tasks": str(tasks),
        "group_size": 1,
        "tokenizer_name": "tiny",
        "agent_timeout": DEADLINE,
        "verifier_timeout": 30.0,
        "max_agent_turns": 2,
        "max_agent_tokens": 64,
    }
    api = APIServerConfig(base_url=server.base_url, server_type="vllm", model_name=MODEL)
    env = HarnessEnv(HarnessEnv.env_config_cls(**settings), [api])

    async def main() -> Any:
        await env.setup()
        try:
            return await env.rollout(env.items[0])
        finally:
            assert not env.proxy.sessions  # the rollout's session is gone
            await env.aclose()

    started = time.monotonic()
    run = asyncio.run(main())
    return run, env, time.monotonic() - started


@pytest.mark.parametrize("harness", ["mini-swe-agent", "codex", "claude-code"])
def test_noise_from_the_tiny_policy_is_a_failed_or_zero_scored_rollout(
    local_server, calc_tasks, sandbox_root, harness
):
    before = {p.pid for p in descendants({os.getpid()}, live_processes())}  # server, fixtures
    run, env, seconds = rollout(local_server, calc_tasks, harness)
    result: RolloutResult = run.output
    assert seconds < DEADLINE + 60, f"{harness} took {seconds:.0f} s"
    if result.failure is not None:  # failed, with its reason and what it said
        assert run.error and result.score is None and env.failures == {result.failure: 1}
    else:  # scored as it stands: the noise fixed nothing
        assert result.score == 0.0 and result.exit.reason in ("ok", "limit", "format_errors")
    assert result.harness_seconds <= DEADLINE + 5
    assert run.trajectory.turns <= 2 and run.trajectory.completion_tokens <= 64
    # nothing left: no sandbox folder, no process the rollout started (the server and any
    # session fixture's daemons, such as the tests' Docker engine, were there before)
    assert not [p for p in sandbox_root.glob("owner-*/*")]
    after = descendants({os.getpid()}, live_processes())
    assert [p.cmdline for p in after if p.pid not in before] == []

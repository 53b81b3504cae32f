"""Per-harness metrics (`harness/<name>/...`) of a scripted run, whose values are known exactly:
model calls, completion tokens, tool calls, breaks, wall time and the exits' shares, plus
`train/harness_failed/<reason>` for failed rollouts.

The harness is the command harness of test_core (a small bash-tool agent in Python), run in
bubblewrap against the fake server. Cost: 3 tests, one group each, about 1-3 s a test."""

from __future__ import annotations

import asyncio
from typing import Any

from atropos.harnesses.env import HarnessEnv

from .helpers import Script, collect, make_env, tool_call
from .test_core import COMMAND, DONE, GOOD

LS = tool_call("bash", command="ls")
PREFIX = "harness/command"


def metrics(env: HarnessEnv) -> dict[str, Any]:
    """What the env's next `wandb_log` records (the means over the group's rollouts)."""
    asyncio.run(env.wandb_log())
    return dict(env.metrics)


def test_a_scripted_run_has_its_exact_calls_tokens_tool_calls_and_no_break(
    script_server, calc_tasks
):
    server = script_server(Script([GOOD, DONE]))  # per rollout: a tool call, then the answer
    env = make_env(server, calc_tasks, harness=COMMAND)
    group, exits = collect(env)
    assert exits == ["ok", "ok"] and group["scores"] == [1.0, 1.0]
    seen = metrics(env)
    assert seen[f"{PREFIX}/calls"] == 2.0
    assert seen[f"{PREFIX}/tokens"] == server.tokens_generated / 2  # the mean of the two
    assert seen[f"{PREFIX}/tool_calls"] == 1.0
    assert seen[f"{PREFIX}/breaks"] == 0.0  # one conversation, one sequence
    assert seen[f"{PREFIX}/score"] == 1.0
    assert seen[f"{PREFIX}/exit/ok"] == 1.0
    assert 0.0 < seen[f"{PREFIX}/seconds"] < 120.0  # within the rollout's deadline
    assert not any(key.startswith("train/harness_failed/") for key in seen)


def test_a_second_conversation_is_a_break_and_its_tool_calls_count(script_server, calc_tasks):
    # the agent runs twice: two conversations (the second opens with `ls`), two sequences
    server = script_server(Script([GOOD, DONE], first=[GOOD, LS]))
    env = make_env(server, calc_tasks, harness=f"{COMMAND} && {COMMAND}", group_size=1)
    group, exits = collect(env)
    assert exits == ["ok"] and len(group["tokens"]) == 2  # two rows, one rollout's score each
    seen = metrics(env)
    assert seen[f"{PREFIX}/calls"] == 4.0
    assert seen[f"{PREFIX}/tokens"] == server.tokens_generated
    assert seen[f"{PREFIX}/tool_calls"] == 2.0
    assert seen[f"{PREFIX}/breaks"] == 1.0  # the second conversation continued none


def test_failed_rollouts_are_counted_by_reason_with_their_exit_share(script_server, calc_tasks):
    server = script_server(Script([GOOD, DONE]))
    env = make_env(server, calc_tasks, harness=f"{COMMAND} && exit 3")
    group, exits = collect(env)
    assert group is None and exits == ["exit_nonzero", "exit_nonzero"]
    seen = metrics(env)
    assert seen["train/harness_failed/exit_nonzero"] == 2.0  # rollouts since the start
    assert seen[f"{PREFIX}/exit/exit_nonzero"] == 1.0
    assert seen[f"{PREFIX}/calls"] == 2.0 and seen[f"{PREFIX}/tool_calls"] == 1.0
    assert f"{PREFIX}/score" not in seen  # a failed rollout has none

"""Typed rollout outcomes (`atropos.envs.outcome`): every rollout ends scored, failed,
truncated or invalid, and no rollout that hit an infrastructure fault reaches the output with a
score. Faults are injected per item (`atropos.testing.faults`): a server answering 500, dying
mid-request, answering 429 or hanging past the deadline; a judge that hangs, rate-limits or
answers malformed JSON."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from atropos.envs.config import ResolvedConfig
from atropos.envs.judge import JudgeConfig, JudgeFailed
from atropos.envs.outcome import (
    LimitReached,
    RolloutFailed,
    RolloutLimits,
    count_groups,
    failure_reason,
    invalid,
    truncated,
    with_outcomes,
)
from atropos.envs.runner.groups import prepare
from atropos.envs.runner.process import ProcessRunner
from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.inference.errors import InferenceError, InferenceTimeout
from atropos.testing import FakeInferenceServer
from atropos.testing.fake_judge import FakeJudge
from atropos.testing.faults import (
    FaultArithmetic,
    FaultJudged,
    FaultPlan,
    audit,
    judge_says,
    right_answer,
    run_process,
)

# ----- the types ----------------------------------------------------------------------------------


class SandboxError(RuntimeError):  # the sandbox package's, by name (envs sit below it)
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def test_failure_reasons_name_the_infrastructure_that_failed():
    assert failure_reason(RolloutFailed("tool_server", "gone")) == "tool_server"
    assert failure_reason(JudgeFailed("timeout", "slow")) == "judge_timeout"
    assert failure_reason(InferenceError.from_status(429, "slow down")) == "inference_http_429"
    assert failure_reason(InferenceTimeout("late")) == "inference_timeout"
    assert failure_reason(asyncio.TimeoutError()) == "timeout"
    assert failure_reason(SandboxError("dead")) == "sandbox_dead"
    assert failure_reason(ValueError("a bug")) == "ValueError"


def test_rollout_limits_name_the_limit_reached_and_refuse_nonsense():
    limits = RolloutLimits(max_turns=3, max_tokens=100, max_tool_calls=5, max_seconds=2.0)
    assert limits.exceeded(turns=2, tokens=99, tool_calls=4, seconds=1.9) is None
    assert limits.exceeded(turns=3) == "turns" and limits.exceeded(seconds=2.5) == "seconds"
    with pytest.raises(LimitReached, match="tool_calls"):
        limits.check(tool_calls=5)
    for bad in ({"max_turns": 0}, {"max_seconds": float("inf")}, {"max_tokens": True}):
        with pytest.raises(ValueError, match="positive number, or None"):
            RolloutLimits(**bad)


def test_outcome_entries_and_the_group_checks():
    with pytest.raises(ValueError, match="'score'.*'mask'"):
        truncated("turns", "drop")
    group = {"tokens": [[1, 2], [3, 4], [5, 6]], "masks": [[1, 2]] * 3, "scores": [1.0, 0.0, 2.0]}
    group["overrides"] = [{"temperature": 0.5}, {}, {}]
    marked = with_outcomes(group, [truncated("turns", "mask"), invalid("no_answer"), {}])
    assert marked["overrides"][0] == {
        "temperature": 0.5,
        "outcome": "truncated/turns",
        "set_advantage_to_zero": True,
    }
    counted: Counter[str] = Counter()
    count_groups(counted, [marked])
    assert counted == {"truncated/turns": 1, "invalid/no_answer": 1, "scored": 1}
    drops: Counter[str] = Counter()
    settings: dict[str, Any] = {"group_size": 3, "max_token_len": -1, "policy_version": None}
    settings |= {"ensure_scores_differ": False, "env_id": None, "drops": drops}
    assert prepare(marked, **settings) is not None
    marked["overrides"][1] = {"outcome": "failed/tool_server"}  # an env kept a failed row
    assert prepare(marked, **settings) is None and drops == {"failed_rollout": 1}


# ----- runs with faults injected ------------------------------------------------------------------


def run(env_cls: type, policy: str, out: Path, groups: int, **env: Any) -> Any:
    """`env_cls` run by the process runner against the `policy` server until it wrote `groups`
    groups; short deadlines, so a hang costs about a second."""
    code, runner = run_process(env_cls, policy, out, groups, group_size=4, workers=8,
                               server_wait=30, **env)  # fmt: skip
    assert code == 0
    return runner


def check(runner: ProcessRunner, plans: list[FaultPlan], out: Path) -> dict[str, int]:
    """Every rollout has an outcome, the failed ones by reason, none of them in the output."""
    found = audit(out, plans)
    outcomes = runner.outcomes
    failed = {k: n for k, n in outcomes.items() if k.startswith("failed/")}
    assert found["faulted_rows"] == 0 and found["rows_without_nonce"] == 0
    assert found["rows"] == sum(n for k, n in outcomes.items() if not k.startswith("failed/"))
    assert sum(failed.values()) == 4 * sum(runner.failures.values())  # group_size each
    assert all(p.faulted for p in plans) and failed, "the run should have hit faults"
    return failed


def test_policy_server_faults_fail_rollouts_and_never_score_them(tmp_path):
    plan = FaultPlan(0.3, seed=1, hang=2.0)
    with FakeInferenceServer(responder=plan.responder(right_answer)) as fake:
        out = tmp_path / "single.jsonl"
        runner = run(FaultArithmetic, fake.base_url, out, groups=12)
    failed = check(runner, [plan], out)
    assert set(failed) <= {
        "failed/inference_http_5xx",
        "failed/inference_http_429",
        "failed/inference_timeout",
        "failed/inference_unavailable",
    }
    assert runner.outcomes["scored"] + runner.outcomes["truncated/tokens"] == 12 * 4


def test_judge_faults_fail_rollouts_and_never_score_them(tmp_path):
    plan = FaultPlan(0.3, kinds=("500", "429", "hang"), seed=2, hang=2.0)
    with (
        FakeInferenceServer(responder=right_answer) as policy,
        FakeInferenceServer(responder=plan.responder(judge_says)) as judge,
    ):
        settings = JudgeConfig(base_url=judge.base_url, timeout=1.0, retries=1)
        out = tmp_path / "judged.jsonl"
        runner = run(FaultJudged, policy.base_url, out, groups=8, judge=settings)
    failed = check(runner, [plan], out)
    assert {k.split("/")[1].split("_")[0] for k in failed} == {"judge"}


@pytest.mark.parametrize("mode", ["malformed", "rate_limited"])
def test_a_judge_that_answers_badly_or_rate_limits_fails_rollouts(tmp_path, mode):
    provider = FakeJudge(mode="malformed") if mode == "malformed" else FakeJudge(rpm=240, burst=4)
    with FakeInferenceServer(responder=right_answer) as policy, provider:
        settings = JudgeConfig(base_url=provider.base_url, timeout=1.0, retries=1)
        out = tmp_path / "judged.jsonl"
        groups = 0 if mode == "malformed" else 2
        config_env = {"judge": settings}
        if mode == "malformed":  # nothing can be written: a short run that gives up
            config_env["total_steps"] = 1
        runner = make_and_run(policy.base_url, out, groups, config_env)
    outcomes = runner.outcomes
    failed = {k for k in outcomes if k.startswith("failed/")}
    if mode == "malformed":
        assert "failed/judge_malformed" in failed and outcomes["scored"] == 0
        assert failed <= {"failed/judge_malformed", "failed/judge_breaker_open"}
        assert not out.exists()
    else:
        assert failed and all(k.startswith("failed/judge_") for k in failed)
        rows = audit(out, [])["rows"]  # what the judge answered for, every one scored
        assert rows >= 4 and rows == outcomes["scored"] + outcomes["truncated/tokens"]


def make_and_run(policy: str, out: Path, groups: int, env: dict[str, Any]) -> ProcessRunner:
    """A judged run that may end without writing everything (the runner's barren limit)."""
    total = env.pop("total_steps", groups)
    config = FaultJudged.env_config_cls(
        tokenizer_name="tiny", group_size=4, use_wandb=False, total_steps=total,
        max_num_workers=1, ensure_scores_are_not_same=False,
        data_path_to_save_groups=str(out), **env,
    )  # fmt: skip
    servers = [APIServerConfig(base_url=policy, server_type="vllm", model_name="m", timeout=5.0)]
    resolved = ResolvedConfig(config, servers, ServerManagerConfig(), "process")  # type: ignore[arg-type]
    runner = ProcessRunner(FaultJudged(config, servers, manager=resolved.manager), resolved)
    runner.barren_limit = 6
    asyncio.run(runner.run(show_progress=False))
    return runner

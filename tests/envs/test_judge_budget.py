"""The judge's budget against a fake judge provider (`FakeJudge`): rates held, 429 pauses,
retries only where allowed, the deadline, the circuit breaker, and failed rollouts counted
per reason by the runner (never scored)."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import Field

from atropos.environments.rlaif import RLAIF
from atropos.envs import judge as judge_module
from atropos.envs.budget import Rate
from atropos.envs.config import BaseEnvConfig, ResolvedConfig
from atropos.envs.judge import Judge, JudgeConfig, JudgeFailed
from atropos.envs.runner.process import ProcessRunner
from atropos.envs.simple import Env
from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.inference.retry import RetryPolicy
from atropos.testing import FakeInferenceServer
from atropos.testing.fake_judge import FakeJudge

from ..environments.helpers import make_env

MESSAGES = [{"role": "user", "content": "Which is better? \\boxed{A} or \\boxed{B}"}]


class JudgedConfig(BaseEnvConfig):
    judge: JudgeConfig = Field(default_factory=JudgeConfig)


class Judged(Env):
    name = "judged_budget"
    env_config_cls = JudgedConfig

    def load(self):
        return [{"prompt": "hi"}]

    def score(self, item, completion):
        return 0.0


def make_judge(url: str, **settings: object) -> Judge:
    """A judge at `url` with `settings` (`--judge.*`), on an env whose policy is unreachable."""
    config = JudgedConfig(
        tokenizer_name="tiny", use_wandb=False, judge=JudgeConfig(base_url=url, **settings)
    )
    servers = [APIServerConfig(base_url="http://127.0.0.1:9/v1", model_name="policy")]
    resolved = ResolvedConfig(config, servers, ServerManagerConfig(), "process")
    return Judge(config.judge, Judged(config, servers, manager=resolved.manager))


async def outcomes(judge: Judge, calls: int) -> list[str]:
    """Make `calls` concurrent judge calls: "ok" or the failure's reason, in order."""

    async def one() -> str:
        try:
            await judge.complete(MESSAGES, 1)
        except JudgeFailed as failed:
            return failed.reason
        return "ok"

    return list(await asyncio.gather(*(one() for _ in range(calls))))


def run_calls(judge: Judge, calls: int) -> list[str]:
    """`outcomes` in a loop of its own; the judge's server manager closed after."""

    async def main() -> list[str]:
        try:
            return await outcomes(judge, calls)
        finally:
            await judge.aclose()

    return asyncio.run(main())


@pytest.fixture
def quick_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries wait at most 50 ms (the jitter rule unchanged), so the tests do not sleep."""
    monkeypatch.setattr(judge_module, "BACKOFF", RetryPolicy(1, 0.01, 0.05))


# ----- the buckets --------------------------------------------------------------------------------


def test_a_rate_spends_at_most_its_burst_plus_its_rate_in_any_window():
    rate = Rate(per_minute=600)  # 10 a second, a burst of 10
    starts = [rate.reserve(1, now=0.0) for _ in range(100)]
    assert all(s is not None for s in starts)
    times = [s for s in starts if s is not None]
    for i, start in enumerate(times):
        for window in (0.5, 1.0, 5.0):
            inside = sum(start <= t < start + window for t in times[i:])
            assert inside <= 10 + 10 * window
    assert times[9] == 0.0 and times[10] > 0  # the burst at once, then paced


def test_a_token_estimate_is_corrected_by_the_usage():
    rate = Rate(per_minute=6000)  # 100 tokens a second
    rate.reserve(100, now=0.0)  # a full bucket's worth
    later = rate.ready_at(100, now=0.0)
    rate.adjust(20 - 100)  # the answer said 20 tokens, not 100
    assert rate.ready_at(100, now=0.0) < later
    assert rate.ready_at(100, now=0.0) == pytest.approx(0.2)


def test_a_judge_storm_never_exceeds_its_requests_per_minute():
    with FakeJudge(rpm=6000) as provider:  # the provider allows far more than the budget
        judge = make_judge(provider.base_url, rpm=600, max_concurrency=0)  # 10 a second
        results = run_calls(judge, 40)
        windows = list(provider.windows(1.0))
    assert results == ["ok"] * 40 and provider.statuses == {200: 40}
    # one second's burst plus a second's rate, and 2 for arrivals bunched by the network
    assert max(windows) <= 10 + 10 + 2
    span = max(provider.arrivals) - min(provider.arrivals)
    assert span >= (40 - 10) / 10 * 0.9  # paced, not sent at once


def test_concurrency_is_held_per_provider():
    with FakeJudge(mode="hang") as provider:
        judge = make_judge(provider.base_url, max_concurrency=3, timeout=30)

        async def main() -> int:
            calls = [asyncio.ensure_future(judge.complete(MESSAGES, 1)) for _ in range(10)]
            async with asyncio.timeout(10):
                while len(provider.arrivals) < 3:
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # room for a 4th to arrive, if the gate let it
            arrived = len(provider.arrivals)
            provider.mode = "ok"
            await asyncio.gather(*calls)
            await judge.aclose()
            return arrived

        assert asyncio.run(main()) == 3
        assert provider.statuses[200] == 10


def test_a_429_pauses_the_provider_for_its_retry_after():
    with FakeJudge(rpm=60, burst=1) as provider:  # one now, the next a second later
        judge = make_judge(provider.base_url, max_concurrency=0)
        assert run_calls(judge, 2) == ["ok", "ok"]
        first, limited, retried = sorted(provider.arrivals)
    assert provider.statuses == {200: 2, 429: 1}
    assert retried - limited >= 1.0 - 0.05  # Retry-After: 1 honoured (clock margin)


def test_retries_only_for_retryable_errors(quick_backoff):
    for mode, expected, sent in [
        ("500", "retries_exhausted", 3),
        ("429", "retries_exhausted", 3),
        ("400", "rejected", 1),
        ("malformed", "malformed", 1),
    ]:
        with FakeJudge(mode=mode, retry_after=0) as provider:
            judge = make_judge(provider.base_url, retries=2, breaker_threshold=0)
            assert run_calls(judge, 1) == [expected], mode
            assert len(provider.arrivals) == sent, mode


def test_a_hanging_judge_fails_at_the_deadline():
    with FakeJudge(mode="hang") as provider:
        judge = make_judge(provider.base_url, timeout=0.5)
        assert run_calls(judge, 2) == ["timeout", "timeout"]
        assert len(provider.arrivals) == 2  # one attempt each: the deadline covers retries


def test_a_budget_that_cannot_let_a_call_go_in_time_fails_it_at_once():
    with FakeJudge() as provider:
        # one call per 10 s, a 2 s deadline: the second and third calls could only go after
        # the deadline, so they fail when asked (2 s leaves room for the first call's round
        # trip on a loaded machine; waiting out the deadline would take 2 s or more)
        judge = make_judge(provider.base_url, rpm=6, timeout=2.0)

        async def main() -> tuple[list[str], float]:
            loop = asyncio.get_running_loop()
            started = loop.time()
            results = await outcomes(judge, 3)
            await judge.aclose()
            return results, loop.time() - started

        results, took = asyncio.run(main())
    assert results == ["ok", "timeout", "timeout"] and len(provider.arrivals) == 1
    assert took < 2.0  # refused when asked, not after waiting out the deadline


def test_the_breaker_opens_refuses_without_sending_and_recovers(quick_backoff):
    with FakeJudge(mode="500") as provider:
        judge = make_judge(provider.base_url, retries=0, breaker_threshold=3, breaker_cooldown=0.5)

        async def main() -> list[list[str]]:
            steps = []
            for _ in range(3):
                steps.append(await outcomes(judge, 1))  # three failures in a row: it opens
            steps.append(await outcomes(judge, 2))  # open: refused, nothing sent
            await asyncio.sleep(0.6)
            steps.append(await outcomes(judge, 1))  # the half-open probe fails: open again
            steps.append(await outcomes(judge, 1))
            provider.mode = "ok"
            await asyncio.sleep(0.6)
            steps.append(await outcomes(judge, 1))  # the probe answers: closed
            steps.append(await outcomes(judge, 3))
            await judge.aclose()
            return steps

        steps = asyncio.run(main())
    assert steps == [
        ["retries_exhausted"],
        ["retries_exhausted"],
        ["retries_exhausted"],
        ["breaker_open", "breaker_open"],
        ["retries_exhausted"],
        ["breaker_open"],
        ["ok"],
        ["ok", "ok", "ok"],
    ]
    assert provider.statuses == {500: 4, 200: 4}


def test_half_open_lets_exactly_one_probe_through():
    with FakeJudge(mode="500") as provider:
        judge = make_judge(provider.base_url, retries=0, breaker_threshold=1, breaker_cooldown=0.3)

        async def main() -> list[str]:
            await outcomes(judge, 1)  # opens
            provider.mode = "hang"
            await asyncio.sleep(0.4)
            probe = asyncio.ensure_future(judge.complete(MESSAGES, 1))
            async with asyncio.timeout(10):
                while len(provider.arrivals) < 2:
                    await asyncio.sleep(0.01)
            others = await outcomes(judge, 3)  # while the probe is out
            provider.mode = "ok"
            await probe
            await judge.aclose()
            return others

        assert asyncio.run(main()) == ["breaker_open"] * 3
        assert len(provider.arrivals) == 2


# ----- failed rollouts in the runner --------------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "settings", "reasons"),
    [
        ("400", {}, {"judge_rejected"}),
        ("hang", {"timeout": 0.3, "breaker_threshold": 0}, {"judge_timeout"}),
        (
            "500",
            {"retries": 0, "breaker_threshold": 2},
            {"judge_retries_exhausted", "judge_breaker_open"},
        ),
    ],
)
def test_a_judge_that_cannot_answer_fails_the_rollout_with_its_reason(
    tmp_path, mode, settings, reasons
):
    out = tmp_path / "rlaif.jsonl"
    with (
        FakeInferenceServer(responder=lambda prompt: "A short reply.") as policy,
        FakeJudge(mode=mode) as provider,
    ):
        judge = JudgeConfig(base_url=provider.base_url, breaker_cooldown=60, **settings)
        env = make_env(
            RLAIF,
            policy.base_url,
            group_size=None,
            injection_rate=0.0,
            judge=judge,
            total_steps=4,
            max_num_workers=2,
            data_path_to_save_groups=str(out),
        )
        resolved = ResolvedConfig(env.config, env.server_configs, env.manager_config, "process")
        runner = ProcessRunner(env, resolved)
        runner.barren_limit = 6
        assert asyncio.run(runner.run(show_progress=False)) == 1  # no group in 6 items: stop
    assert set(runner.failures) == reasons and sum(runner.failures.values()) >= 6
    assert not out.exists() or out.read_text() == ""  # nothing scored, no fabricated 0
    metrics = json.loads(out.with_suffix(".metrics.json").read_text())
    assert set(metrics["failed"]) == reasons

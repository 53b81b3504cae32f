"""The judge: `--judge.*` namespace layering, pairwise votes in both orders, rubric ratings."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import Field

from atropos.envs import registry
from atropos.envs.cli import parse
from atropos.envs.config import BaseEnvConfig, ConfigError, ResolvedConfig
from atropos.envs.judge import (
    Judge,
    JudgeConfig,
    PairVerdict,
    boxed_choice,
    compare,
    parse_rubric,
    rate,
)
from atropos.envs.simple import Env
from atropos.inference.config import APIServerConfig, ServerManagerConfig
from atropos.testing import FakeInferenceServer


class JudgedConfig(BaseEnvConfig):
    judge: JudgeConfig = Field(default_factory=JudgeConfig)


class Judged(Env):
    name = "judged"
    env_config_cls = JudgedConfig

    @classmethod
    def config_init(cls):
        server = APIServerConfig(base_url="http://127.0.0.1:1/v1", model_name="policy")
        return JudgedConfig(tokenizer_name="tiny", use_wandb=False), [server]

    def load(self):
        return [{"prompt": "hi"}]

    def score(self, item, completion):
        return 0.0


def test_judge_settings_have_their_own_namespace_in_every_layer(tmp_path, monkeypatch):
    conf = tmp_path / "c.yaml"
    conf.write_text("judge:\n  model_name: from-file\n  votes: 5\n  timeout: 30\n")
    monkeypatch.setenv("ATROPOS_JUDGE__VOTES", "7")
    resolved = parse(
        Judged,
        "process",
        [
            "--config",
            str(conf),
            "--judge.base_url",
            "http://127.0.0.1:9010/v1",
            "--judge.api-key",
            "sk-judge",
        ],
    )
    judge = resolved.env.judge  # type: ignore[attr-defined]
    assert judge.base_url == "http://127.0.0.1:9010/v1" and judge.model_name == "from-file"
    assert judge.votes == 7 and judge.timeout == 30  # variables beat the file, flags beat both
    assert judge.api_key.get_secret_value() == "sk-judge"
    shown = resolved.redacted()["env"]["judge"]
    assert "api_key" not in shown and shown["votes"] == 7


def test_judge_flags_are_checked_like_any_other(tmp_path):
    with pytest.raises(ConfigError, match=r"--judge\.vots: unknown|--judge\.votes\?"):
        parse(Judged, "process", ["--judge.vots", "3"])
    with pytest.raises(ConfigError, match=r"--judge\.votes"):
        parse(Judged, "process", ["--judge.votes", "0"])
    conf = tmp_path / "c.yaml"
    conf.write_text("judge:\n  modle_name: x\n")
    with pytest.raises(ConfigError, match=r"did you mean .*judge\.model_name\?"):
        parse(Judged, "process", ["--config", str(conf)])
    conf.write_text("jduge:\n  model_name: x\n")
    with pytest.raises(ConfigError, match=r"did you mean .*judge\?"):
        parse(Judged, "process", ["--config", str(conf)])


def test_help_lists_the_judge_flags(capsys):
    with pytest.raises(SystemExit):
        parse(Judged, "process", ["--help"])
    out = capsys.readouterr().out
    assert "--judge.base_url" in out and "--env.judge " not in out


@pytest.mark.parametrize(
    ("text", "choice"),
    [
        ("\\boxed{A}", "A"),
        ("thinking \\boxed{B} no wait \\boxed{A}", "A"),
        ("\\boxed{ b }", "B"),
        ("\\boxed{\\text{A}}", None),  # nested braces: not a plain verdict
        ("\\boxed{AB}", None),
        ("A", None),
        ("", None),
    ],
)
def test_boxed_choice(text, choice):
    assert boxed_choice(text) == choice


def test_pair_scores_are_centred_shares_of_parsed_votes():
    assert PairVerdict(a=6, b=0).scores == (0.5, -0.5)
    assert PairVerdict(a=3, b=3).scores == (0.0, 0.0)
    assert PairVerdict(a=2, b=1, unparsed=3).scores == pytest.approx((1 / 6, -1 / 6))
    assert PairVerdict(unparsed=6).scores is None


def render(first: str, second: str) -> list[dict]:
    return [{"role": "user", "content": f"[A] {first}\n[B] {second}\nWhich is spookier?"}]


def spooky_judge(prompt: str) -> str:
    """Prefers the answer that mentions ghosts; says nothing parseable about dull pairs."""
    body = prompt.rsplit("[A]", 1)[-1]
    first, second = body.split("[B]", 1)
    if ("ghost" in first) == ("ghost" in second):
        return "they are the same to me"
    return "\\boxed{A}" if "ghost" in first else "\\boxed{B}"


def first_judge(prompt: str) -> str:
    return "\\boxed{A}"


def judged_env(policy_url: str, judge: JudgeConfig) -> Judged:
    config = JudgedConfig(tokenizer_name="tiny", use_wandb=False, judge=judge)
    servers = [APIServerConfig(base_url=policy_url, model_name="policy")]
    resolved = ResolvedConfig(config, servers, ServerManagerConfig(), "process")
    return Judged(config, servers, manager=resolved.manager)


def test_votes_map_back_in_both_orders_on_a_separate_judge_server():
    with FakeInferenceServer() as policy, FakeInferenceServer(responder=spooky_judge) as judge_srv:
        env = judged_env(policy.base_url, JudgeConfig(base_url=judge_srv.base_url, votes=3))

        async def main():
            judge = Judge(env.config.judge, env)
            assert judge.separate
            won = await compare(judge, render, "a ghost!", "a tax form")
            lost = await compare(judge, render, "a tax form", "a ghost!")
            even = await compare(judge, render, "a form", "a tax form", votes=2)
            await judge.aclose()
            return won, lost, even

        won, lost, even = asyncio.run(main())
        assert judge_srv.requests and not policy.requests  # the judge's own server answered
    assert (won.a, won.b, won.unparsed, won.scores) == (6, 0, 0, (0.5, -0.5))
    assert (lost.a, lost.b) == (0, 6)
    assert (even.parsed, even.unparsed, even.scores) == (0, 4, None)


def test_a_judge_that_always_picks_the_first_answer_scores_a_pair_even():
    with FakeInferenceServer(responder=first_judge) as policy:
        env = judged_env(policy.base_url, JudgeConfig())

        async def main():
            judge = Judge(env.config.judge, env)
            assert not judge.separate  # no base_url: the policy's servers judge
            verdict = await compare(judge, render, "x", "y")
            await env.server.aclose()
            return verdict

        verdict = asyncio.run(main())
    assert (verdict.a, verdict.b, verdict.scores) == (3, 3, (0.0, 0.0))


@pytest.mark.parametrize(
    ("text", "scores"),
    [
        ("Consistency: 8\nLore accuracy: 6/10\nEngagingness: 9", [8, 6, 9]),
        (
            "**Consistency**: 8\n- lore_accuracy = 6.5\n# Engagingness: 2\nEngagingness: 3",
            [8, 6.5, 3],
        ),
        ("Consistency: 8\nEngagingness: 9", None),  # a criterion missing
        ("Consistency: 11\nLore accuracy: 6\nEngagingness: 9", None),  # off the scale
        ("I rate it consistency 8", None),
    ],
)
def test_parse_rubric(text, scores):
    criteria = ["consistency", "lore_accuracy", "engagingness"]
    parsed = parse_rubric(text, criteria)
    assert parsed == (
        None if scores is None else dict(zip(criteria, map(float, scores), strict=True))
    )


def test_rate_averages_parsed_answers_and_counts_the_rest():
    answers = iter(["Consistency: 8\nLore accuracy: 4\nEngagingness: 6", "no idea"] * 2)

    def responder(prompt: str) -> str:
        return next(answers)

    with FakeInferenceServer(responder=responder) as policy:
        env = judged_env(policy.base_url, JudgeConfig(votes=4))

        async def main():
            verdict = await rate(
                Judge(env.config.judge, env),
                [{"role": "user", "content": "rate"}],
                ["consistency", "lore_accuracy", "engagingness"],
            )
            await env.server.aclose()
            return verdict

        verdict = asyncio.run(main())
    assert (verdict.parsed, verdict.unparsed) == (2, 2)
    assert verdict.means == {"consistency": 8.0, "lore_accuracy": 4.0, "engagingness": 6.0}


def test_the_env_closes_its_judges_own_server():
    with FakeInferenceServer() as policy, FakeInferenceServer(responder=first_judge) as judge_srv:
        env = judged_env(policy.base_url, JudgeConfig(base_url=judge_srv.base_url))

        async def main():
            judge = Judge(env.config.judge, env)
            await compare(judge, render, "x", "y", votes=1)
            assert judge._own is not None
            await env.aclose()  # what the runners call when a run ends
            return judge

        judge = asyncio.run(main())
    assert judge._own is None


@pytest.mark.parametrize("name", ["math", "rlaif", "npc_arena"])
def test_judged_envs_close_the_judges_server_and_their_own(name):
    cls = registry.get(name)
    config, _ = cls.config_init()
    config.judge = JudgeConfig(base_url="http://127.0.0.1:9/v1")
    env = cls(config, [APIServerConfig(base_url="http://127.0.0.1:9/v1", model_name="m")])
    closed: list[str] = []

    async def main():
        own = env.judge._manager()  # the judge's own server manager, made on first use
        for label, manager in (("judge", own), ("policy", env.server)):
            manager.aclose = lambda label=label: closed.append(label) or asyncio.sleep(0)
        await env.aclose()

    asyncio.run(main())
    assert closed == ["judge", "policy"] and env.judge._own is None

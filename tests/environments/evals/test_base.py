"""The shared evaluation machinery: pass@k, the summary, the config, prompts, evaluation-only
hooks, and the registry."""

from __future__ import annotations

import asyncio
from math import comb

import pytest
from pydantic import ValidationError

from atropos.environments.evals import (
    AIMEEval,
    EvalConfig,
    EvaluationOnly,
    GPQAEval,
    GSM8KEval,
    IFEvalEval,
    Math500Eval,
    MMLUEval,
    summarize,
)
from atropos.environments.evals.base import THINKING_PROMPT, answer_text, boxed_contents
from atropos.environments.evals.mmlu import MMLUConfig
from atropos.envs import registry
from atropos.envs.cli import main as env_main
from atropos.envs.config import BaseEnvConfig
from atropos.rewards.passk import mean_pass_at_k, pass_at_k

from .helpers import make

ENVS = {
    "eval_gsm8k": GSM8KEval,
    "eval_math500": Math500Eval,
    "eval_aime": AIMEEval,
    "eval_mmlu": MMLUEval,
    "eval_gpqa": GPQAEval,
    "eval_ifeval": IFEvalEval,
}


# ----- pass@k ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (1, 0, 1, 0.0),
        (1, 1, 1, 1.0),
        (5, 0, 3, 0.0),
        (5, 5, 3, 1.0),
        (5, 2, 1, 0.4),  # pass@1 is c / n
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2)
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (4, 2, 3, 1.0),  # n - c < k: every draw of 3 holds a right one
        (4, 1, 4, 1.0),
    ],
)
def test_pass_at_k_matches_the_combinatorial_formula(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_summarize_averages_pass_at_k_over_problems_and_accuracy_over_samples():
    rows = [[True, False, False, False], [True, True, False, False], [False] * 4]
    metrics = summarize(rows, [1, 2, 4])
    assert metrics["eval/accuracy"] == 3 / 12
    assert metrics["eval/pass@1"] == pytest.approx((0.25 + 0.5 + 0) / 3)
    assert metrics["eval/pass@2"] == pytest.approx((0.5 + 5 / 6 + 0) / 3)
    assert metrics["eval/pass@4"] == pytest.approx(2 / 3)
    assert metrics["eval/pass@2"] == pytest.approx(mean_pass_at_k([(4, 1), (4, 2), (4, 0)], 2))


# ----- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "n", "expected"),
    [(1, 1, [1]), ("1,5", 5, [1, 5]), ("[5, 1, 1]", 5, [1, 5]), ([2], 4, [2]), ("3", 3, [3])],
)
def test_eval_k_takes_lists_numbers_and_comma_text(given, n, expected):
    assert EvalConfig(eval_n=n, eval_k=given).eval_k == expected


@pytest.mark.parametrize(("n", "k"), [(1, [5]), (4, [0]), (4, [])])
def test_eval_k_must_lie_within_eval_n(n, k):
    with pytest.raises(ValidationError, match="eval_k"):
        EvalConfig(eval_n=n, eval_k=k)


def test_defaults_sample_once_at_temperature_0_6_against_the_local_server():
    config, [server] = GSM8KEval.config_init()
    assert isinstance(config, EvalConfig)
    assert (config.eval_n, config.eval_k, config.eval_temperature) == (1, [1], 0.6)
    assert config.dataset_name is None and config.tokenizer_name == "tiny"
    assert (server.base_url, server.server_type) == ("http://127.0.0.1:9001/v1", "openai")


def test_a_plain_config_becomes_the_eval_config_and_a_non_eval_config_class_is_refused():
    _, servers = MMLUEval.config_init()
    env = MMLUEval(BaseEnvConfig(tokenizer_name="tiny", use_wandb=False), servers)
    assert isinstance(env.config, MMLUConfig) and env.config.tokenizer_name == "tiny"
    assert (env.config.eval_k, env.config.few_shot) == ([1], 0)  # the env's defaults

    class Misconfigured(GSM8KEval):
        env_config_cls = BaseEnvConfig

    with pytest.raises(TypeError, match="needs an EvalConfig, got BaseEnvConfig"):
        Misconfigured(BaseEnvConfig(), servers)


# ----- prompts ---------------------------------------------------------------------------------


def test_messages_follow_thinking_mode_and_custom_system_prompt():
    env = make(GSM8KEval)
    problem = env.load_problems()[0]
    plain = env.messages(problem)
    assert plain == [
        {"role": "system", "content": GSM8KEval.system_prompt},
        {"role": "user", "content": problem.prompt},
    ]
    thinking = make(GSM8KEval, thinking_mode=True).messages(problem)
    assert thinking[0]["content"] == f"{THINKING_PROMPT}\n\n{GSM8KEval.system_prompt}"
    custom = make(
        GSM8KEval, thinking_mode=True, custom_thinking_prompt="T.", custom_system_prompt="S."
    )
    assert custom.messages(problem)[0]["content"] == "T.\n\nS."
    bare = make(GSM8KEval, custom_system_prompt="")  # an empty custom prompt: no system turn
    assert bare.messages(problem) == [{"role": "user", "content": problem.prompt}]
    assert make(MMLUEval).messages(make(MMLUEval).load_problems()[0])[0]["role"] == "user"


def test_the_answer_is_read_after_the_think_block():
    assert answer_text("<think>\\boxed{1}</think> \\boxed{2}") == " \\boxed{2}"
    assert answer_text("<THINK>a</THINK>b") == "b"
    assert answer_text("<think>never closed \\boxed{2}") is None
    assert answer_text("no thinking at all") == "no thinking at all"
    env = make(GSM8KEval)
    problem = env.load_problems()[0]  # gold 7
    assert env.grade_completion(problem, "<think>\\boxed{8}</think> \\boxed{7}").correct
    unclosed = env.grade_completion(problem, "<think>it is \\boxed{7}")
    assert (unclosed.extracted, unclosed.correct) == (None, False)


def test_boxed_contents_match_nested_braces():
    text = "\\boxed{\\frac{1}{2}} and \\boxed { 3 } and \\boxed{unclosed"
    assert boxed_contents(text) == ["\\frac{1}{2}", "3"]


# ----- evaluation only, and the registry ---------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ENVS))
def test_training_hooks_say_to_use_evaluate(name):
    env = make(ENVS[name])
    asyncio.run(env.setup())
    assert env.problems
    with pytest.raises(EvaluationOnly, match=f"atropos env evaluate {name}"):
        asyncio.run(env.get_next_item())
    with pytest.raises(EvaluationOnly, match="evaluation-only"):
        asyncio.run(env.collect_trajectories({}))


@pytest.mark.parametrize("mode", ["serve", "process"])
def test_the_cli_refuses_training_modes_before_writing_anything(mode, tmp_path, capsys):
    out = tmp_path / "groups.jsonl"
    argv = [mode, "--env.data_path_to_save_groups", str(out), "--env.use_wandb", "false"]
    assert env_main(ENVS["eval_gsm8k"], argv) == 2
    assert "eval_gsm8k is an evaluation-only environment; use `atropos env evaluate" in (
        capsys.readouterr().err
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", sorted(ENVS))
def test_registry_resolves_every_name(name):
    assert name in registry.names(), "run `pip install -e .` to install entry points"
    assert registry.get(name) is ENVS[name]
    assert ENVS[name].name == name


def test_max_eval_items_keeps_the_first_problems():
    everything = make(Math500Eval).load_problems()
    assert len(everything) == 10
    assert make(Math500Eval, max_eval_items=3).load_problems() == everything[:3]

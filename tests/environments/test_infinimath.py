"""The `infinimath` environment: the levels and their generated problems, the one evaluator,
numeric answer checks, the curriculum and its checkpoints, and runs against the fake inference
server."""

from __future__ import annotations

import asyncio
import random
import re
from fractions import Fraction
from functools import partial

import pytest
from pydantic import ValidationError

from atropos.environments import infinimath
from atropos.environments.infinimath import (
    LEVELS,
    InfiniMath,
    InfiniMathConfig,
    stated_answer,
)
from atropos.environments.infinimath.problems import (
    Num,
    Op,
    generate,
    nesting,
    parse_number,
    render,
    same_value,
    value_of,
)

from .helpers import (
    env_defaults,
    evaluate_against,
    make_env,
    process_through_cli,
    rollout,
)

THINK = "<think>Inner parentheses first.</think>\n"

# make(url=OFFLINE, mode="process", **env): groups of 4, `env` settings on top
make = partial(make_env, InfiniMath)


def right(prompt: str) -> str:
    expression = prompt.split("power):\n\n")[1].split("\n")[0]
    value = value_of(expression)
    return f"{THINK}\\boxed{{{value.numerator}/{value.denominator}}}"


# ----- problems -------------------------------------------------------------------------------


def test_levels_grow_harder():
    assert sorted(LEVELS) == list(range(1, 9))
    ordered = [LEVELS[n] for n in range(1, 9)]
    for easier, harder in zip(ordered, ordered[1:], strict=False):
        assert harder.terms >= easier.terms and harder.depth >= easier.depth
        assert set(easier.ops) <= set(harder.ops)


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_problems_fit_their_level(level):
    spec, depths = LEVELS[level], []
    for seed in range(60):
        problem = generate(spec, random.Random(f"{level}:{seed}"))
        assert problem == generate(spec, random.Random(f"{level}:{seed}"))  # seeded
        value = value_of(problem.text)
        assert problem.answer == (str(value) if value.denominator != 1 else str(int(value)))
        ops = set(re.findall(r"(?<= )[-+*/](?= )", problem.text))
        assert ops <= set(spec.ops), problem.text
        numbers = [int(n) for n in re.findall(r"\d+", problem.text)]
        assert max(numbers) < 10**spec.digits
        assert ("(-" in problem.text) <= spec.negatives
        assert ("^" in problem.text) <= spec.powers
        if not spec.fractions:
            assert "/" not in problem.answer, problem
        depths.append(problem.depth)
    assert depths.count(spec.depth) >= 55  # nearly always the level's nesting


@pytest.mark.parametrize(
    ("tree", "text", "depth"),
    [
        (Op("-", Num(1), Op("-", Num(2), Num(3))), "1 - (2 - 3)", 1),
        (Op("-", Op("-", Num(1), Num(2)), Num(3)), "1 - 2 - 3", 0),
        (Op("*", Op("+", Num(1), Num(2)), Num(-3)), "(1 + 2) * (-3)", 1),
        (Op("/", Num(8), Op("*", Num(2), Num(2))), "8 / (2 * 2)", 1),
        (Op("+", Op("^", Num(-2), Num(3)), Num(1)), "(-2)^3 + 1", 0),
        (Op("*", Num(2), Op("-", Num(5), Op("+", Num(1), Num(1)))), "2 * (5 - (1 + 1))", 2),
    ],
)
def test_rendering_uses_the_parentheses_the_meaning_needs(tree, text, depth):
    assert (render(tree), nesting(tree)) == (text, depth)


def test_the_evaluator_reads_only_arithmetic():
    assert value_of("1 - (2 - 3)") == 2 and value_of("(-2)^3 + 1") == -7
    assert value_of("7 / 2 * 4") == 14 and value_of("1 / 3") == Fraction(1, 3)
    for text in ("__import__('os')", "2 ** 100", "1.5 + 1", "x + 1", "2^(1/2)"):
        with pytest.raises(ValueError):
            value_of(text)
    with pytest.raises(ZeroDivisionError):
        value_of("1 / (2 - 2)")


# ----- answers --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stated", "gold", "same"),
    [
        ("42", "42", True),
        ("-7", "-7", True),
        ("\u22127", "-7", True),  # a Unicode minus
        ("$-7$", "-7", True),
        ("1,771", "1771", True),
        ("3/4", "3/4", True),
        ("6/8", "3/4", True),
        ("\\frac{3}{4}", "3/4", True),
        ("-\\dfrac{3}{4}", "-3/4", True),
        ("0.75", "3/4", True),
        ("0.3333333", "1/3", True),
        ("0.33", "1/3", False),
        ("4/3", "3/4", False),
        ("42 apples", "42", False),
        ("x = 42", "42", False),
        ("1/0", "1", False),
        ("", "0", False),
    ],
)
def test_same_value(stated, gold, same):
    assert same_value(stated, gold) is same


def test_parse_number():
    assert parse_number(" 12 ") == 12 and parse_number("1e3") == 1000
    assert parse_number("\\frac{1}{0}") is None and parse_number("twelve") is None


def test_the_stated_answer_is_the_last_box_after_thinking():
    assert stated_answer(THINK + "\\boxed{3} no, \\boxed{4}", True) == "4"
    assert stated_answer("<think>\\boxed{3}</think> so 3", True) is None
    assert stated_answer("\\boxed{3}", True) is None and stated_answer("\\boxed{3}", False) == "3"


def test_scoring():
    env, item = make(), {"level": 7, "expression": "1 / 3", "answer": "1/3"}
    assert env.score(item, THINK + "\\boxed{\\frac{1}{3}}") == 1.0
    assert env.score(item, THINK + "\\boxed{0.333}") == 0.0
    assert make(tolerance=0.01).score(item, THINK + "\\boxed{0.333}") == 1.0
    assert env.score(item, THINK + "1/3") == 0.0  # not boxed


# ----- the curriculum -------------------------------------------------------------------------


def test_the_level_rises_with_the_rolling_accuracy():
    env = make(curriculum_window=20, ensure_scores_are_not_same=False)
    asyncio.run(env.setup())
    item = asyncio.run(env.get_next_item())
    assert item["level"] == 1
    for _ in range(2):  # 8 rollouts: under the 10 needed
        env.score_group(item, [rollout()] * 4, [1.0] * 4)
    assert env.curriculum.level == 1
    env.score_group(item, [rollout()] * 4, [1.0, 1.0, 0.0, 1.0])  # 11 of 12 right
    assert env.curriculum.level == 2 and env.curriculum.scores == []
    env.score_group(item, [rollout()] * 4, [1.0] * 4)  # made at level 1: not counted
    assert env.curriculum.scores == []
    harder = asyncio.run(env.get_next_item())
    assert harder["level"] == 2 and len(harder["expression"].split()) == 5  # three numbers
    asyncio.run(env.wandb_log())
    assert env.metrics["curriculum/level"] == 2
    assert env.metrics["train/accuracy/L1"] == 15 / 16


def test_the_level_falls_only_when_asked_and_never_without_the_curriculum():
    fixed = make(curriculum=False, starting_level=3, curriculum_window=10)
    falling = make(starting_level=3, curriculum_window=10, curriculum_lower_threshold=0.2)
    item = {"level": 3, "expression": "1", "answer": "1"}
    for env in (fixed, falling):
        for _ in range(3):
            env.score_group(item, [rollout()] * 4, [0.0, 0.0, 0.0, 0.0])
    assert fixed.curriculum.level == 3 and falling.curriculum.level == 2
    stays = make(starting_level=3, curriculum_window=10)  # lower threshold 0: never falls
    for _ in range(3):
        stays.score_group(item, [rollout()] * 4, [0.0] * 4)
    assert stays.curriculum.level == 3


def test_the_curriculum_and_the_item_counter_are_checkpointed(tmp_path):
    env = make(curriculum_window=20)
    env.checkpoint_dir = str(tmp_path)
    asyncio.run(env.setup())
    for _ in range(5):
        asyncio.run(env.get_next_item())
    env.curriculum.level, env.curriculum.scores = 4, [1.0, 0.0]
    assert env.save_checkpoint(10) is not None
    following = asyncio.run(env.get_next_item())
    fresh = make(curriculum_window=20)
    fresh.checkpoint_dir, fresh.curr_step = str(tmp_path), 10
    assert fresh.load_checkpoint() == {"level": 4, "scores": [1.0, 0.0], "drawn": 5}
    asyncio.run(fresh.setup())
    assert asyncio.run(fresh.get_next_item()) == following
    bounded = make(max_level=3)
    bounded.restore_state({"level": 8})
    assert bounded.curriculum.level == 3


def test_settings_are_checked():
    with pytest.raises(ValidationError, match="min_level <= starting_level <= max_level"):
        InfiniMathConfig(starting_level=5, max_level=4)
    with pytest.raises(ValidationError):
        InfiniMathConfig(starting_level=9)


# ----- evaluation and runs against a fake inference server ------------------------------------


def test_evaluate_reports_accuracy_per_level(tmp_path):
    run = evaluate_against(make, right, tmp_path, eval_per_level=2)
    metrics = run.metrics
    assert metrics["eval/accuracy"] == 1.0
    assert [metrics[f"eval/accuracy/L{n}"] for n in range(1, 9)] == [1.0] * 8
    assert len(run.samples) == 16 and run.temperature == 0.0
    assert make().load_eval() == make().load_eval() and len(make().load_eval()) == 80


def test_process_end_to_end(tmp_path):
    run = process_through_cli(InfiniMath, infinimath.demo_responder, tmp_path / "im.jsonl")
    assert len(run.groups) == 3 and all(sorted(g["scores"]) == [0.0, 1.0] for g in run.groups)
    env_metrics = run.metrics["env"]
    assert env_metrics["train/accuracy"] == 0.5 and env_metrics["curriculum/level"] == 1


def test_defaults():
    config, _ = env_defaults(InfiniMath)
    assert (config.starting_level, config.curriculum_window, config.curriculum) == (1, 64, True)

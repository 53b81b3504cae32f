"""The `mcqa` environment: answer extraction, think rules, group rules, data, and runs against
the fake inference server."""

from __future__ import annotations

import asyncio
import itertools
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from atropos.environments.mcqa import (
    INSTRUCTION,
    MCQA,
    THINKING_SYSTEM_PROMPT,
    MCQAConfig,
    demo_responder,
    extract_answers,
    load_split,
    score_text,
)
from atropos.envs import registry
from atropos.envs.simple import Rollout
from atropos.testing import FakeInferenceServer

from .helpers import (
    check_against,
    collect,
    env_defaults,
    evaluate_against,
    fake_hub,
    make_env,
    process_through_cli,
)

TRAIN, TEST = load_split("train"), load_split("test")
ITEM = {"prompt": "Capital of France?", "options": ["Rome", "Paris", "Berlin", "Madrid"],
        "answer": 1, "ground_truth": "B"}  # fmt: skip


# make(url=OFFLINE, mode="process", **env): groups of 4, `env` settings on top
make = partial(make_env, MCQA)


def rollout(trained: int = 20, finish: str = "stop") -> Rollout:
    return Rollout(
        "text", [7] * (10 + trained), [-100] * 10 + [7] * trained, None, finish, "server"
    )


def row_of(prompt: str) -> dict[str, Any]:
    return next(r for r in TRAIN + TEST if r["prompt"] in prompt)


def letter(prompt: str, right: bool) -> str:
    gold = row_of(prompt)["ground_truth"]
    return gold if right else "ABCD"[("ABCD".index(gold) + 1) % 4]


def alternating() -> Any:
    turn = itertools.count()
    return lambda p: f"<think>Hmm.</think> The best answer is: {letter(p, next(turn) % 2 == 0)}"


# ----- extraction and scoring -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "score"),
    [
        ("The best answer is: B", 1.0),
        ("The best answer is B.", 1.0),
        ("The correct answer is (B)", 1.0),
        ("The answer is: **B**", 1.0),
        ("**The best answer is B**", 1.0),  # bold: one answer, not two
        ("**The best answer is: B**", 1.0),
        ("the correct answer is b", -1.0),  # a lower-case letter after a phrase is no answer
        ("The answer is option B", 1.0),
        ("Thus, final answer: B)", 1.0),
        ("\\boxed{B}", 1.0),
        ("\\boxed{ b }", 1.0),
        ("The best answer is \\boxed{B}", 1.0),  # phrase and box together: one answer
        ("The answer is Paris", 1.0),  # the gold option's text
        ("The answer is: paris.", 1.0),
        ("The best answer is: A", -1.0),  # wrong
        ("The answer is Rome", -1.0),  # another option's text is not an answer: none found
        ("I would pick B", -1.0),  # no phrasing
        ("The answer is B. Thus, final answer: B", -1.0),  # several answers, even if equal
        ("The answer is B, or maybe \\boxed{C}", -1.0),
        ("The answer is a bit unclear; \\boxed{B}", 1.0),  # "a bit" states nothing
        ("The answer is Parisian cuisine", -1.0),  # the gold text must end there
    ],
)
def test_answer_formats_after_one_think_block(answer: str, score: float) -> None:
    assert score_text(ITEM, f"<think>Let me recall.</think> {answer}") == score


@pytest.mark.parametrize(
    "completion",
    [
        "The best answer is: B",  # no think block
        "<think>a</think><think>b</think> The best answer is: B",
        "<think>unclosed. The best answer is: B",
        "</think> The best answer is: B <think>",
        "<think>a</think> The best answer is: B </think>",
        "<think>a</think> The best answer is: B <think>more</think>",
    ],
)
def test_malformed_think_tags_score_minus_one(completion: str) -> None:
    assert score_text(ITEM, completion) == -1.0


def test_think_tags_match_in_any_case() -> None:
    assert score_text(ITEM, "<THINK>hm</Think> The best answer is: B") == 1.0


def test_extract_answers_lists_every_stated_answer() -> None:
    text = "The correct answer is A. The best answer is **C**. \\boxed{d} The answer is Paris."
    assert extract_answers(text, "B", "Paris") == ["A", "C", "D", "B"]
    assert extract_answers("The answer is Paris", "B") == []  # no gold text given


def test_group_rules_truncation_short_completions_and_equal_scores() -> None:
    env = make("http://127.0.0.1:9")
    mixed = [1.0, -1.0, 1.0, -1.0]
    assert env.score_group(ITEM, [rollout()] * 4, mixed) == mixed
    cut = [rollout(), rollout(finish="length"), rollout(), rollout()]
    assert env.score_group(ITEM, cut, [1.0, 1.0, 1.0, -1.0]) == [1.0, -1.0, 1.0, -1.0]
    assert env.score_group(ITEM, [rollout(), rollout(trained=9)] * 2, mixed) is None
    assert env.score_group(ITEM, [rollout()] * 4, [1.0] * 4) is None
    keep = make("http://127.0.0.1:9", ensure_scores_are_not_same=False)
    assert keep.score_group(ITEM, [rollout()] * 4, [-1.0] * 4) == [-1.0] * 4
    asyncio.run(env.wandb_log({}))
    assert env.metrics["train/percent_correct"] == 8 / 12  # dropped all-right groups count


# ----- data ---------------------------------------------------------------------------------------


def test_the_fixture_has_four_options_and_consistent_gold() -> None:
    assert (len(TRAIN), len(TEST)) == (40, 10)
    assert not {r["prompt"] for r in TRAIN} & {r["prompt"] for r in TEST}
    for row in TRAIN + TEST:
        assert len(row["options"]) == 4 and row["ground_truth"] == "ABCD"[row["answer"]]
        assert all(
            f"{k}. {o}" in row["prompt"] for k, o in zip("ABCD", row["options"], strict=True)
        )
        said = f"<think>.</think> The best answer is: {row['ground_truth']}"
        assert score_text(row, said) == 1.0
    assert {r["ground_truth"] for r in TRAIN} == set("ABCD")


def test_the_hub_dataset_gets_a_seeded_two_percent_test_split(monkeypatch: Any) -> None:
    rows = [{"prompt": f"q{i}", "options": ["a", "b"], "answer": 0, "ground_truth": "A"}
            for i in range(120)]  # fmt: skip
    calls = fake_hub(monkeypatch, rows)
    env = make("http://127.0.0.1:9", dataset_name="NousResearch/AcademicMCQA")
    train, test = env.load(), env.load_eval()
    assert (len(train), len(test)) == (117, 3)  # ceil(2% of 120)
    assert {r["prompt"] for r in train} | {r["prompt"] for r in test} == {r["prompt"] for r in rows}
    assert env.load_eval() == test  # the same split every time
    assert calls[0] == ("NousResearch/AcademicMCQA", "default", "train")
    with pytest.raises(ValueError, match="split must be"):
        load_split("validation")


def test_malformed_rows_are_errors_naming_the_row(monkeypatch: Any) -> None:
    fake_hub(monkeypatch, [{"prompt": None, "ground_truth": "A"}] * 60)
    with pytest.raises(ValueError, match="train row 0: expected a string 'prompt'"):
        load_split("train", "x/y")


# ----- against the fake server ----------------------------------------------------------------


def test_prompt_and_mixed_groups() -> None:
    with FakeInferenceServer(responder=alternating()) as fake:
        [(group, backlog)] = collect(make(fake.base_url), TRAIN[0])
    assert sorted(group["scores"]) == [-1.0, -1.0, 1.0, 1.0] and backlog == []
    system, user = group["messages"][0][:2]
    assert system == {"role": "system", "content": THINKING_SYSTEM_PROMPT}
    assert user["content"] == f"{TRAIN[0]['prompt']}\n\n{INSTRUCTION}"
    assert len(group["inference_logprobs"]) == 4


def test_evaluate_reports_percent_correct(tmp_path: Path) -> None:
    run = evaluate_against(make, alternating(), tmp_path)
    assert run.metrics == {"eval/percent_correct": 0.5}
    assert run.temperature == 0.5
    assert len(run.samples) == 10


def test_defaults_and_registration() -> None:
    config, [server] = env_defaults(MCQA)
    assert isinstance(config, MCQAConfig) and config.tokenizer_name == "tiny"
    assert (server.base_url, server.server_type) == ("http://127.0.0.1:9001/v1", "vllm")
    assert config.test_fraction == 0.02 and config.eval_temperature == 0.5
    assert registry.get("mcqa") is MCQA


def test_demo_responder_mixes_right_and_wrong_letters() -> None:
    prompt = f"<|im_start|>user\n{TRAIN[3]['prompt']}\n\n{INSTRUCTION}<|im_end|>"
    scores = sorted(score_text(TRAIN[3], demo_responder(prompt) or "") for _ in range(4))
    assert scores == [-1.0, -1.0, 1.0, 1.0]
    assert demo_responder("Name a colour.") is None


def test_check_env_passes() -> None:
    report = check_against(make, demo_responder)
    assert report.groups == 3 and report.token_sources == {"server"}


def test_process_end_to_end_writes_jsonl_and_html(tmp_path: Path) -> None:
    run = process_through_cli(MCQA, demo_responder, tmp_path / "mcqa.jsonl")
    assert len(run.groups) == 3 and all(sorted(g["scores"]) == [-1.0, 1.0] for g in run.groups)
    assert "The best answer is" in run.page
    assert run.metrics["env"]["train/percent_correct"] == 0.5

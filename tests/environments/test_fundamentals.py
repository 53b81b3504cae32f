"""The `fundamentals` environment: the final-sentence rule, magnitude bands, the length term,
binarisation, data, evaluation, and runs against the fake inference server."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from atropos.environments.fundamentals import (
    DIRECTIONS,
    SYSTEM_PROMPT,
    Fundamentals,
    FundamentalsConfig,
    demo_responder,
    length_term,
    load_split,
    magnitude_band,
    parse_prediction,
    raw_score,
    user_message,
)
from atropos.envs import registry
from atropos.envs.simple import Rollout

from .helpers import (
    check_against,
    env_defaults,
    evaluate_against,
    fake_hub,
    make_env,
    process_through_cli,
)

TRAIN, TEST = load_split("train"), load_split("test")
ITEM = {"context": "Revenue up 12%.", "fundamental_metric": "dividend per share",
        "answer": "raised", "magnitude": "10"}  # fmt: skip


def said(direction: str, magnitude: str, metric: str = "dividend per share") -> str:
    sentence = f"The {metric} will be: {direction} and the magnitude will be: {magnitude}%"
    return f"<think>Cash flow is strong.</think> {sentence}"


# make(url=OFFLINE, mode="process", **env): groups of 4, `env` settings on top
make = partial(make_env, Fundamentals)


def rollout(trained: int = 20) -> Rollout:
    return Rollout(
        "text", [7] * (10 + trained), [-100] * 10 + [7] * trained, None, "stop", "server"
    )


def row_of(prompt: str) -> dict[str, Any]:
    return next(r for r in TRAIN + TEST if r["context"] in prompt)


# ----- the rules ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("diff", "band"),
    [(0, 1.0), (0.5, 0.9), (1, 0.9), (1.01, 0.7), (5, 0.7), (7.5, 0.5), (10, 0.5), (15, 0.3),
     (20, 0.3), (20.5, 0.0), (-3, 0.7)],
)  # fmt: skip
def test_magnitude_bands(diff: float, band: float) -> None:
    assert magnitude_band(diff) == band


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        (said("raised", "10"), 2.0),
        (said("raised", "9.5"), 1.9),
        (said("raised", "+12"), 1.7),
        (said("Raised", "31"), 1.0),  # right direction, magnitude off by over 20: band 0
        (said("maintained", "0"), 0.0),  # wrong direction
        (said("raised", "10").replace("will be: raised", "will be:raised"), 2.0),  # \s*
        (said("raised", "10").replace("The dividend per", "the DIVIDEND PER"), 2.0),
        (said("raised", "10").replace("%", " percent"), 0.0),  # the % is part of the format
        (said("raised", "10", metric="revenue"), 0.0),  # another metric's sentence
        (said("raised", "10") + " " + said("raised", "10").split("</think>")[1], 0.0),  # twice
        (said("raised", "10").replace("<think>", ""), 0.0),  # no think pair
        ("<think>a</think><think>b</think>" + said("raised", "10").split("</think>")[1], 0.0),
        (f"<think>{said('raised', '10').split('</think> ')[1]}</think>", 0.0),  # inside thinking
    ],
)
def test_raw_scores(completion: str, score: float) -> None:
    assert raw_score(ITEM, completion) == pytest.approx(score)


def test_reduced_magnitudes_compare_without_sign() -> None:
    item = {**ITEM, "answer": "reduced", "magnitude": "-5"}
    assert raw_score(item, said("reduced", "5")) == raw_score(item, said("reduced", "-5")) == 2.0
    assert parse_prediction(said("reduced", "-5"), "dividend per share") == ("reduced", -5.0)
    assert raw_score({**ITEM, "magnitude": "n/a"}, said("raised", "5")) == 1.0  # no gold: no band


def test_length_term_and_binarised_training_reward() -> None:
    assert length_term(95, 100) == 0.0 and length_term(100, 100) == 0.5
    env = make("http://127.0.0.1:9", max_token_length=100)
    rollouts = [rollout(20), rollout(20), rollout(98), rollout(20)]
    assert env.score_group(ITEM, rollouts, [2.0, 0.0, 1.0, 1.3]) == [1.0, -1.0, 1.0, 1.0]
    # the term never flips a right direction (raw >= 1, term <= 0.5): binarised, it is inert
    raw = make("http://127.0.0.1:9", max_token_length=100, binary_reward=False)
    assert raw.score_group(ITEM, rollouts, [2.0, 0.0, 1.0, 1.3]) == pytest.approx(
        [2.0, 0.0, 1.0 - 0.49, 1.3]  # 0.5 * 98 / 100
    )
    asyncio.run(env.wandb_log({}))
    assert env.metrics["train/direction_accuracy"] == 0.75
    assert env.metrics["train/magnitude_accuracy"] == pytest.approx((1.0 + 0.0 + 0.3) / 3)


def test_group_drops() -> None:
    env = make("http://127.0.0.1:9")
    assert env.score_group(ITEM, [rollout(), rollout(9)] * 2, [2.0, 0.0, 2.0, 0.0]) is None
    assert env.score_group(ITEM, [rollout()] * 4, [2.0, 1.5, 1.0, 1.9]) is None  # all +1
    keep = make("http://127.0.0.1:9", ensure_scores_are_not_same=False)
    assert keep.score_group(ITEM, [rollout()] * 4, [0.0] * 4) == [-1.0] * 4


# ----- data and prompt --------------------------------------------------------------------------


def test_the_fixture_covers_every_direction_and_scores_perfectly_when_right() -> None:
    assert (len(TRAIN), len(TEST)) == (40, 10)
    assert {r["answer"] for r in TRAIN} == set(DIRECTIONS)
    assert len({r["fundamental_metric"] for r in TRAIN}) >= 5
    for row in TRAIN + TEST:
        assert (row["magnitude"] == "0") == (row["answer"] == "maintained")
        completion = said(row["answer"], row["magnitude"], row["fundamental_metric"])
        assert raw_score(row, completion) == 2.0


def test_the_prompt_ends_the_instructions_with_the_exact_sentence() -> None:
    env = make("http://127.0.0.1:9")
    system, user = env.prompt(ITEM)
    assert system["content"] == SYSTEM_PROMPT and "<think>" in system["content"]
    text = user["content"]
    exact = '"The dividend per share will be: {answer} and the magnitude will be: {percentage}%"'
    assert exact in text and text.endswith(ITEM["context"]) and text == user_message(ITEM)


def test_the_hub_dataset_gets_a_seeded_five_percent_test_split(monkeypatch: Any) -> None:
    calls = fake_hub(monkeypatch, [{**ITEM, "context": f"c{i}"} for i in range(50)])
    env = make(
        "http://127.0.0.1:9", dataset_name="NousResearch/company-fundamentals-prediction-lite"
    )
    train, test = env.load(), env.load_eval()
    assert (len(train), len(test)) == (47, 3) and env.load_eval() == test  # ceil(5% of 50)
    assert calls[0] == ("NousResearch/company-fundamentals-prediction-lite", "default", "train")


# ----- against the fake server ----------------------------------------------------------------


def test_evaluate_reports_direction_magnitude_and_combined(tmp_path: Path) -> None:
    def respond(prompt: str) -> str:
        row = row_of(prompt)
        if row["answer"] == "reduced":
            return said("raised", "5", row["fundamental_metric"])
        return said(row["answer"], str(float(row["magnitude"]) + 3), row["fundamental_metric"])

    run = evaluate_against(make, respond, tmp_path)
    right = sum(r["answer"] != "reduced" for r in TEST)
    assert run.metrics == pytest.approx({
        "eval/direction_accuracy": right / 10,
        "eval/magnitude_accuracy": 0.7,  # off by 3 points
        "eval/combined_score": right * 1.7 / 10,
    })  # fmt: skip
    assert run.temperature == 0.2


def test_defaults_and_registration() -> None:
    config, [server] = env_defaults(Fundamentals)
    assert isinstance(config, FundamentalsConfig) and config.tokenizer_name == "tiny"
    assert (server.base_url, server.server_type) == ("http://127.0.0.1:9001/v1", "vllm")
    assert config.test_fraction == 0.05 and config.binary_reward and Fundamentals.temperature == 0.8
    assert registry.get("fundamentals") is Fundamentals


def test_demo_responder_mixes_right_and_wrong_directions() -> None:
    prompt = user_message(TRAIN[5])
    scores = sorted(raw_score(TRAIN[5], demo_responder(prompt) or "") for _ in range(4))
    assert scores == [0.0, 0.0, 2.0, 2.0]
    assert demo_responder("Predict the weather.") is None


def test_check_env_passes() -> None:
    report = check_against(make, demo_responder)
    assert report.groups == 3 and report.token_sources == {"server"}


def test_process_end_to_end_writes_jsonl_and_html(tmp_path: Path) -> None:
    run = process_through_cli(Fundamentals, demo_responder, tmp_path / "fundamentals.jsonl")
    assert len(run.groups) == 3 and all(sorted(g["scores"]) == [-1.0, 1.0] for g in run.groups)
    assert "the magnitude will be" in run.page
    assert run.metrics["env"]["train/direction_accuracy"] == 0.5

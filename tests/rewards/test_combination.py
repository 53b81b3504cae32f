"""Weighted combinations: weights always count (upstream ignored them), and each normalization."""

from __future__ import annotations

import pytest

from atropos.rewards import RewardError, build, reward
from atropos.rewards.registry import unregister

TAGGED_RIGHT = "<think>6 * 7</think> \\boxed{42}"  # format 1, accuracy 1
UNTAGGED_RIGHT = "\\boxed{42}"  # format 0, accuracy 1
TAGGED_WRONG = "<think>6 * 7</think> \\boxed{41}"  # format 1, accuracy 0


def test_a_weight_2_reward_counts_twice_in_every_normalization():
    # upstream's "sum" gave 0.5 for a lone weight-2 format reward; here weights are honoured
    alone = {n: build([{"name": "format", "weight": 2.0}], n) for n in ("none", "sum", "minmax")}
    assert alone["none"](TAGGED_RIGHT) == 2.0
    assert alone["sum"](TAGGED_RIGHT) == 1.0  # the weighted mean of one reward is its value
    assert alone["minmax"](TAGGED_RIGHT) == 2.0  # one completion: the weighted sum

    entries = [{"name": "format", "weight": 2.0}, {"name": "accuracy", "weight": 1.0}]
    twice = [{"name": "format"}, {"name": "format"}, {"name": "accuracy"}]
    for normalization in ("none", "sum"):
        weighted, repeated = build(entries, normalization), build(twice, normalization)
        for text in (TAGGED_RIGHT, UNTAGGED_RIGHT, TAGGED_WRONG):
            assert weighted(text, answer="42") == pytest.approx(repeated(text, answer="42"))
    assert build(entries)(TAGGED_WRONG, answer="42") == 2.0
    assert build(entries)(UNTAGGED_RIGHT, answer="42") == 1.0
    assert build(entries, "sum")(TAGGED_WRONG, answer="42") == pytest.approx(2 / 3)
    assert build(entries, "sum")(UNTAGGED_RIGHT, answer="42") == pytest.approx(1 / 3)


def test_negative_weights_subtract_and_sum_divides_by_their_size():
    entries = [{"name": "accuracy", "weight": 1.0}, {"name": "format", "weight": -0.5}]
    assert build(entries)(TAGGED_RIGHT, answer="42") == 0.5
    assert build(entries, "sum")(TAGGED_RIGHT, answer="42") == pytest.approx(0.5 / 1.5)


def test_minmax_rescales_the_weighted_sums_across_a_group():
    entries = [{"name": "accuracy", "weight": 1.0}, {"name": "format", "weight": 2.0}]
    combo = build(entries, "minmax")
    group = [TAGGED_RIGHT, UNTAGGED_RIGHT, TAGGED_WRONG, "nothing"]
    # weighted sums 3, 1, 2, 0
    assert combo.score_group(group, answer="42") == [
        1.0,
        pytest.approx(1 / 3),
        pytest.approx(2 / 3),
        0.0,
    ]
    assert combo.score_group([TAGGED_RIGHT, TAGGED_RIGHT], answer="42") == [0.0, 0.0]
    assert combo.normalize_group([]) == []
    assert build(entries).normalize_group([3.0, 1.0]) == [3.0, 1.0]  # only minmax rescales


def test_components_show_each_unweighted_value():
    combo = build(["accuracy", {"name": "format", "weight": 5}, "format"])
    assert combo.components(UNTAGGED_RIGHT, answer="42") == {
        "accuracy": 1.0,
        "format": 0.0,
        "format#2": 0.0,
    }


def test_parameters_reach_their_reward():
    strict = build([{"name": "format", "params": {"require_all_tags": True}}])
    assert strict(TAGGED_RIGHT) == 0.0
    assert strict("<think>a</think><answer>42</answer>") == 1.0


def test_a_failing_reward_propagates_with_its_name():
    @reward("explodes")
    def explodes(completion: str, *, answer: object = None) -> float:
        raise ZeroDivisionError("boom")

    @reward("not_a_number")
    def not_a_number(completion: str, *, answer: object = None) -> float:
        return float("nan")

    try:
        with pytest.raises(RewardError, match="reward 'explodes' failed: ZeroDivisionError: boom"):
            build(["accuracy", "explodes"])("42", answer="42")
        with pytest.raises(RewardError, match="reward 'not_a_number' returned NaN"):
            build(["not_a_number"])("42")
    finally:
        unregister("explodes")
        unregister("not_a_number")

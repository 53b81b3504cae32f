"""`environments.common.turn_credit`: MT-GRPO's per-turn advantages against hand-worked groups
and as properties (normalisation, the outcome-only baseline, the paper's two-turn rule), and
their mapping onto each turn's own tokens."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from atropos.environments.common.turn_credit import (
    normalized,
    token_advantages_by_turn,
    turn_advantages,
)
from atropos.rewards.group import group_advantages

M = -100  # a masked position

# ----- hand-worked groups -------------------------------------------------------------------------


def test_the_papers_two_turn_rule():
    """A tool call (turn reward) then the answer (outcome): A1 = Â^O + λ·Â^T, A2 = Â^O."""
    turns = [[1.0, None], [0.0, None], [1.0, None], [0.0, None]]
    outcomes = [1.0, 1.0, 0.0, 0.0]
    a_t, a_o = [1.0, -1.0, 1.0, -1.0], [1.0, 1.0, -1.0, -1.0]
    assert turn_advantages(turns, outcomes) == [[o + t, o] for t, o in zip(a_t, a_o, strict=True)]
    half = turn_advantages(turns, outcomes, turn_coef=0.5)
    assert half == [[o + 0.5 * t, o] for t, o in zip(a_t, a_o, strict=True)]


def test_later_turns_add_up_discounted():
    turns = [[1.0, 1.0, None], [0.0, 0.0, None]]
    assert turn_advantages(turns, [0.0, 0.0]) == [[2.0, 1.0, 0.0], [-2.0, -1.0, 0.0]]
    assert turn_advantages(turns, [0.0, 0.0], discount=0.5) == [
        [1.5, 1.0, 0.0],
        [-1.5, -1.0, 0.0],
    ]


def test_turns_are_normalised_among_the_episodes_that_reached_them():
    # episode 2 stopped after one turn; episode 1's turn 1 has no reward (it answered there)
    turns = [[1.0, 1.0, 0.5], [0.0, None], [0.0]]
    rows = turn_advantages(turns, [1.0, 0.0, 0.0])
    a_o = group_advantages([1.0, 0.0, 0.0])
    a_t0 = group_advantages([1.0, 0.0, 0.0])
    assert rows[2] == [a_o[2] + a_t0[2]]
    assert rows[1] == [a_o[1] + a_t0[1], a_o[1]]  # turn 1: no reward, no term
    # turn 1 and turn 2 each have one rated episode: nothing to compare with, 0
    assert rows[0] == [a_o[0] + a_t0[0], a_o[0], a_o[0]]


def test_the_outcome_only_baseline_is_grpo():
    turns = [[1.0, 0.0], [0.0], [0.5, 0.5, 0.5]]
    outcomes = [1.0, 0.0, 0.5]
    rows = turn_advantages(turns, outcomes, rule="grpo")
    assert rows == [[a] * len(t) for a, t in zip(group_advantages(outcomes), turns, strict=True)]
    assert turn_advantages([[None]], [0.7], rule="grpo") == [[0.7]]  # a group of one, as GRPO


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="2 episodes of turn rewards but 1 outcomes"):
        turn_advantages([[1.0], [0.0]], [1.0])
    with pytest.raises(ValueError, match="unknown credit rule 'ppo'"):
        turn_advantages([[1.0]], [1.0], rule="ppo")  # type: ignore[arg-type]
    assert normalized([]) == [] and normalized([5.0]) == [0.0]


# ----- properties ---------------------------------------------------------------------------------

reward = st.one_of(st.none(), st.sampled_from([0.0, 0.25, 0.5, 1.0]))
groups = st.integers(2, 6).flatmap(
    lambda g: st.tuples(
        st.lists(st.lists(reward, min_size=1, max_size=5), min_size=g, max_size=g),
        st.lists(st.sampled_from([0.0, 1.0, 0.5]), min_size=g, max_size=g),
    )
)


def column(turns: list[list[float | None]], k: int) -> list[int]:
    """The episodes with a reward at turn k."""
    return [i for i, t in enumerate(turns) if k < len(t) and t[k] is not None]


@settings(max_examples=150, deadline=None)
@given(groups, st.sampled_from([0.5, 1.0, 2.0]))
def test_turn_advantages_are_normalised_per_turn(group, coef):
    turns, outcomes = group
    rows = turn_advantages(turns, outcomes, turn_coef=coef)
    a_o = group_advantages(outcomes)
    assert sum(a_o) == pytest.approx(0.0, abs=1e-9)
    assert [len(r) for r in rows] == [len(t) for t in turns]
    for i, row in enumerate(rows):
        # the last turn: the outcome plus its own turn term; each earlier one adds its own
        terms = [
            (row[k] - (row[k + 1] if k + 1 < len(row) else a_o[i])) / coef for k in range(len(row))
        ]
        for k, term in enumerate(terms):
            if turns[i][k] is None:
                assert term == pytest.approx(0.0, abs=1e-9)
    for k in range(max(len(t) for t in turns)):
        rated = column(turns, k)
        terms = []
        for i in rated:
            row = rows[i]
            nxt = row[k + 1] if k + 1 < len(row) else a_o[i]
            terms.append((row[k] - nxt) / coef)
        if len(rated) < 2 or len({turns[i][k] for i in rated}) == 1:
            assert terms == pytest.approx([0.0] * len(rated), abs=1e-9)
        else:
            assert sum(terms) == pytest.approx(0.0, abs=1e-9)  # mean 0
            variance = sum(t * t for t in terms) / len(terms)
            assert variance == pytest.approx(1.0, rel=1e-6)  # population std 1


@settings(max_examples=100, deadline=None)
@given(groups)
def test_without_turn_credit_every_turn_gets_grpos_advantage(group):
    turns, outcomes = group
    grpo = [[a] * len(t) for a, t in zip(group_advantages(outcomes), turns, strict=True)]
    assert turn_advantages(turns, outcomes, rule="grpo") == grpo
    assert turn_advantages(turns, outcomes, turn_coef=0.0) == grpo
    unrated = [[None] * len(t) for t in turns]
    assert turn_advantages(unrated, outcomes) == grpo


@st.composite
def sequences(draw):
    """(masks, spans, values): a prompt, then turns each of trained ids and masked filler."""
    masks: list[int] = [M] * draw(st.integers(0, 4))
    spans: list[tuple[int, int] | None] = []
    for _ in range(draw(st.integers(1, 5))):
        start = len(masks)
        masks += [draw(st.integers(3, 9)) for _ in range(draw(st.integers(0, 4)))]
        masks += [M] * draw(st.integers(0, 3))
        spans.append((start, len(masks)))
    values = [draw(st.floats(-3, 3, allow_nan=False)) for _ in spans]
    return masks, spans, values


@settings(max_examples=150, deadline=None)
@given(sequences())
def test_each_turns_advantage_lands_on_its_own_trained_tokens(seq):
    masks, spans, values = seq
    out = token_advantages_by_turn(masks, spans, values)
    assert len(out) == len(masks)
    for j, m in enumerate(masks):
        if m == M:
            assert out[j] == 0.0
    for (start, end), value in zip(spans, values, strict=True):  # type: ignore[misc]
        for j in range(start, end):
            assert out[j] == (0.0 if masks[j] == M else value)


def test_spans_that_do_not_fit_are_refused():
    masks = [M, 5, 6, M, 7]
    assert token_advantages_by_turn(masks, [None, (1, 5)], [9.0, 1.0]) == [0.0, 1.0, 1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match="trained position 4 lies in no turn's span"):
        token_advantages_by_turn(masks, [(1, 3)], [1.0])
    with pytest.raises(ValueError, match="turn 1's span"):
        token_advantages_by_turn(masks, [(1, 3), (2, 5)], [1.0, 2.0])  # overlapping
    with pytest.raises(ValueError, match="turn 0's span"):
        token_advantages_by_turn(masks, [(1, 9)], [1.0])  # past the end
    with pytest.raises(ValueError, match="2 turn spans but 1 turn advantages"):
        token_advantages_by_turn(masks, [(1, 3), (3, 5)], [1.0])


def test_normalisation_is_grpos_z_score():
    values = [0.0, 0.25, 1.0, 1.0]
    mean = sum(values) / 4
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / 4)
    assert normalized(values) == pytest.approx([(v - mean) / std for v in values])

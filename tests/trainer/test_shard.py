"""`balanced_split`: a batch across data-parallel ranks, balanced by tokens (property tests)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from atropos.trainer.shard import balanced_split

LENGTHS = st.lists(st.integers(min_value=0, max_value=4096), max_size=200)
RANKS = st.integers(min_value=1, max_value=16)


@given(LENGTHS, RANKS)
def test_every_sequence_goes_to_exactly_one_rank_in_batch_order(lengths, ranks):
    shares = balanced_split(lengths, ranks)
    assert len(shares) == ranks
    assert sorted(i for share in shares for i in share) == list(range(len(lengths)))
    assert all(share == sorted(share) for share in shares)


@given(LENGTHS, RANKS)
def test_the_busiest_rank_holds_at_most_the_longest_sequence_more(lengths, ranks):
    loads = [sum(lengths[i] for i in share) for share in balanced_split(lengths, ranks)]
    assert max(loads) - min(loads) <= max(lengths, default=0)


@given(LENGTHS, RANKS)
def test_no_rank_is_empty_when_there_are_enough_sequences(lengths, ranks):
    shares = balanced_split(lengths, ranks)
    if len(lengths) >= ranks:
        assert all(shares)


def test_one_rank_takes_everything_and_bad_input_is_refused():
    assert balanced_split([3, 1, 2], 1) == [[0, 1, 2]]
    with pytest.raises(ValueError, match="at least 1"):
        balanced_split([1], 0)
    with pytest.raises(ValueError, match="negative"):
        balanced_split([1, -1], 2)

"""The checks of /app/stats.py, run by /tests/test.sh from /app."""

import sys

import pytest

sys.path.insert(0, "/app")

from stats import mean, median  # noqa: E402


def test_odd_length():
    assert median([3, 1, 2]) == 2


def test_even_length():
    assert median([4, 1, 3, 2]) == 2.5


def test_input_unchanged():
    values = [3, 1, 2]
    median(values)
    assert values == [3, 1, 2]


def test_empty_raises_value_error():
    with pytest.raises(ValueError):
        median([])


def test_mean_still_works():
    assert mean([1, 2, 3]) == 2

"""`atropos.rewards.text`: the strict think block, with tags matched exactly or in any case."""

from __future__ import annotations

import pytest

from atropos.rewards.text import normalise_think, split_think


@pytest.mark.parametrize(
    ("completion", "exact", "any_case"),
    [
        ("<think>a</think> B", " B", " B"),
        ("<THINK>a</Think> B", None, " B"),
        ("<Think>a</think> B", None, " B"),  # one tag in another case: a pair only in any case
        ("B", None, None),  # no block
        ("<think>a</think><THINK>b</THINK> B", "<THINK>b</THINK> B", None),  # a second pair
        ("<THINK>unclosed B", None, None),
        ("</THINK> B <THINK>", None, None),  # out of order
        ("<think>a</think> B </THINK>", " B </THINK>", None),  # think-like text after it
        ("<think>a</think> <Thinking>B", " <Thinking>B", " <Thinking>B"),  # not a think tag
    ],
)
def test_split_think_exact_and_in_any_case(completion, exact, any_case):
    assert split_think(completion) == exact
    assert split_think(completion, ignore_case=True) == any_case
    assert split_think(completion, ignore_case=True) == split_think(normalise_think(completion))


def test_normalise_think_touches_only_think_tags():
    assert normalise_think("<THINK>x</Think> <Thinking> <b>") == "<think>x</think> <Thinking> <b>"

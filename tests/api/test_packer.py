"""Property tests of the pure packing functions against brute force."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from atropos.api.packer import Item, allocate_minimums, pick_batch, pick_exact


def subsets_in_preference_order(n: int):
    """All index subsets, earliest-preferred first (lexicographic on inclusion vectors)."""
    for bits in itertools.product((1, 0), repeat=n):
        yield [i for i, b in enumerate(bits) if b]


def brute_exact(sizes: list[int], target: int) -> list[int] | None:
    for subset in subsets_in_preference_order(len(sizes)):
        if sum(sizes[i] for i in subset) == target:
            return subset
    return None


small_sizes = st.lists(st.integers(1, 9), min_size=0, max_size=11)


@given(small_sizes, st.integers(1, 24))
@settings(max_examples=400, deadline=None)
def test_pick_exact_is_the_earliest_exact_subset(sizes, target):
    assert pick_exact(sizes, target) == brute_exact(sizes, target)


@given(st.lists(st.integers(1, 64), max_size=300), st.integers(1, 256))
@settings(max_examples=200, deadline=None)
def test_pick_exact_sums_exactly_and_never_repeats(sizes, target):
    picked = pick_exact(sizes, target)
    if picked is not None:
        assert sum(sizes[i] for i in picked) == target
        assert picked == sorted(set(picked))


def test_mixes_that_upstream_starved_or_deadlocked_pack():
    # sizes 3 and 5 with batch 8: upstream's pack-to-max-size rule starved the 3s
    assert pick_exact([3, 3, 5, 3, 5], 8) == [0, 2]
    # max group 16 with batch 24: upstream always returned None
    assert pick_exact([16, 16, 8], 24) == [0, 2]
    # oldest first: the head group is used whenever any exact batch can hold it
    assert pick_exact([5, 4, 4, 3], 8) == [0, 3]


def brute_batch(items: list[Item], batch: int, minimums: dict[int, int]) -> list[int] | None:
    for subset in subsets_in_preference_order(len(items)):
        if sum(items[i].size for i in subset) != batch:
            continue
        if all(
            sum(items[i].size for i in subset if items[i].env_id == env) >= need
            for env, need in minimums.items()
        ):
            return subset
    return None


items_strategy = st.lists(
    st.builds(Item, st.integers(1, 8), st.one_of(st.none(), st.integers(0, 2))),
    max_size=10,
)


@given(items_strategy, st.integers(1, 16), st.dictionaries(st.integers(0, 2), st.integers(0, 8)))
@settings(max_examples=400, deadline=None)
def test_pick_batch_meets_minimums_whenever_possible(items, batch, minimums):
    picked = pick_batch(items, batch, minimums)
    expected = brute_batch(items, batch, {e: m for e, m in minimums.items() if m > 0})
    if expected is None:
        assert picked is None
        return
    assert picked is not None, "a batch meeting every minimum exists but none was formed"
    assert sum(items[i].size for i in picked) == batch
    assert picked == sorted(set(picked))
    for env, need in minimums.items():
        assert sum(items[i].size for i in picked if items[i].env_id == env) >= need


@given(items_strategy, st.integers(1, 16))
@settings(max_examples=200, deadline=None)
def test_pick_batch_without_minimums_is_oldest_first(items, batch):
    assert pick_batch(items, batch) == brute_exact([it.size for it in items], batch)


def test_groups_without_env_id_fill_batches_under_minimums():
    # upstream could never batch env_id=None groups once any minimum was set
    items = [Item(4, None), Item(4, 0), Item(4, None)]
    assert pick_batch(items, 8, {0: 4}) == [0, 1]


@given(st.integers(1, 512), st.dictionaries(st.integers(0, 5), st.floats(0, 1), max_size=6))
def test_allocate_minimums_never_exceeds_the_batch(batch, fractions):
    mins = allocate_minimums(batch, fractions)
    assert sum(mins.values()) <= batch
    assert all(m >= 0 for m in mins.values())
    if sum(fractions.values()) <= 1:
        assert mins == {e: int(batch * a) for e, a in sorted(fractions.items()) if a > 0}


def test_a_huge_batch_size_neither_overflows_nor_loops():
    # a registration may carry any int (as upstream); found by schema fuzzing
    huge = 10**40
    assert pick_exact([2, 3], huge) is None
    assert pick_batch([Item(2, 0), Item(3, 1)], huge, {0: huge // 2}) is None

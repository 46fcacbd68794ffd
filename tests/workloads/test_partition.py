"""Partitions: disjoint, keyed, and with the promised label skew."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.workloads.partition import dirichlet, iid, partition, two_class_non_iid

FASHION_LABELS = np.repeat(np.arange(10), 6000)  # the class counts of the Fashion-MNIST training set
labels_st = st.lists(st.integers(0, 5), min_size=3, max_size=300).map(np.array)


def assert_disjoint(parts: list[np.ndarray]) -> np.ndarray:
    """Also checks the documented form: sorted int64 index arrays."""
    assert all(p.dtype == np.int64 and (np.diff(p) > 0).all() for p in parts)
    union = np.concatenate(parts)
    assert len(np.unique(union)) == len(union)
    return union


def assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def class_counts(part: np.ndarray, labels: np.ndarray = FASHION_LABELS) -> np.ndarray:
    return np.bincount(labels[part], minlength=10)


@given(n=st.integers(1, 400), data=st.data(), seed=st.integers(0, 2**32))
def test_iid_covers_every_sample_once_in_near_equal_parts(n, data, seed):
    parts = data.draw(st.integers(1, n))
    shards = iid(n, parts, seed)
    assert len(shards) == parts
    assert sorted(assert_disjoint(shards).tolist()) == list(range(n))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert_same(shards, iid(n, parts, seed))


def test_iid_with_sizes_gives_exactly_those_sizes():
    shards = iid(100, 3, seed=0, sizes=[5, 6, 7])
    assert [len(s) for s in shards] == [5, 6, 7]
    assert_disjoint(shards)


def test_another_seed_gives_another_partition():
    assert not np.array_equal(iid(1000, 4, 0)[0], iid(1000, 4, 1)[0])
    assert not np.array_equal(dirichlet(FASHION_LABELS, 10, 0.5, 0)[0], dirichlet(FASHION_LABELS, 10, 0.5, 1)[0])
    a, b = two_class_non_iid(FASHION_LABELS, 10, 0), two_class_non_iid(FASHION_LABELS, 10, 1)
    assert not all(np.array_equal(x, y) for x, y in zip(a, b))


@settings(max_examples=50)
@given(labels=labels_st, data=st.data(), alpha=st.floats(0.001, 1000), seed=st.integers(0, 2**32))
def test_dirichlet_covers_every_sample_once_in_near_equal_parts(labels, data, alpha, seed):
    parts = data.draw(st.integers(1, min(len(labels), 20)))
    shards = dirichlet(labels, parts, alpha, seed)
    assert sorted(assert_disjoint(shards).tolist()) == list(range(len(labels)))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    assert_same(shards, dirichlet(labels, parts, alpha, seed))


@settings(max_examples=50)
@given(labels=labels_st, data=st.data(), alpha=st.floats(0.001, 1000), seed=st.integers(0, 2**32))
def test_dirichlet_with_sizes_gives_exactly_those_sizes(labels, data, alpha, seed):
    sizes = data.draw(st.lists(st.integers(1, 20), min_size=1, max_size=len(labels))
                      .filter(lambda s: sum(s) <= len(labels)))
    shards = dirichlet(labels, len(sizes), alpha, seed, sizes=sizes)
    assert [len(s) for s in shards] == sizes
    assert_disjoint(shards)


def test_dirichlet_skews_the_labels_more_as_alpha_gets_small():
    def top_share(alpha: float) -> float:
        shards = dirichlet(FASHION_LABELS, 20, alpha, seed=0)
        return float(np.mean([class_counts(s).max() / len(s) for s in shards]))

    shares = [top_share(a) for a in (0.01, 0.1, 1.0, 10.0, 1000.0)]
    assert shares == sorted(shares, reverse=True)
    assert shares[0] > 0.7 and shares[-1] < 0.12  # one class dominates vs. near-uniform 0.1


def test_a_shortage_of_a_class_is_shared_not_dumped_on_the_last_part():
    # With near-uniform mixes every part, the last included, ends close to 600 per class.
    shards = dirichlet(FASHION_LABELS, 10, 1000.0, seed=0)
    assert all(np.abs(class_counts(s) - 600).max() < 120 for s in shards)


@pytest.mark.parametrize("parts, major, minor", [(5, 4800, 300), (10, 2400, 150), (100, 240, 15), (20, 1200, 75)])
def test_two_class_non_iid_gives_80_percent_from_two_classes_and_20_from_the_rest(parts, major, minor):
    shards = two_class_non_iid(FASHION_LABELS, parts, seed=0)
    assert len(assert_disjoint(shards)) == 60000  # balanced classes: nothing left over
    majors = []
    for s in shards:
        counts = class_counts(s)
        assert sorted(counts.tolist()) == [minor] * 8 + [major] * 2
        majors += np.flatnonzero(counts == major).tolist()
    assert np.bincount(majors, minlength=10).tolist() == [2 * parts // 10] * 10  # each class equally often
    assert_same(shards, two_class_non_iid(FASHION_LABELS, parts, seed=0))


def test_two_class_non_iid_with_sizes_and_another_major_share():
    shards = two_class_non_iid(FASHION_LABELS, 3, seed=4, major=0.5, sizes=[1000, 2000, 801])
    for s, m in zip(shards, [1000, 2000, 801]):
        counts = np.sort(class_counts(s))
        assert len(s) == m and counts[-2:].sum() == round(0.5 * m) and counts[:8].max() - counts[:8].min() <= 1
    assert_disjoint(shards)


@settings(max_examples=50)
@given(labels=st.lists(st.integers(0, 4), min_size=30, max_size=300).map(np.array), data=st.data(),
       seed=st.integers(0, 2**32))
def test_two_class_non_iid_parts_are_disjoint_equal_and_80_percent_major(labels, data, seed):
    parts = data.draw(st.integers(1, 5))
    labels = np.concatenate([labels, np.arange(5)])  # every one of the 5 classes present
    try:
        shards = two_class_non_iid(labels, parts, seed)
    except ValueError as e:  # skewed labels may not give every part even one sample
        assert "cannot give" in str(e)
        return
    assert_disjoint(shards)
    m = len(shards[0])
    for s in shards:
        counts = np.sort(np.bincount(labels[s], minlength=5))
        assert len(s) == m and counts[-2:].sum() >= round(0.8 * m)


def test_two_class_non_iid_rejects_sizes_the_classes_cannot_supply():
    with pytest.raises(ValueError, match=r"sizes need \d+ samples of class \d, which has 6000"):
        two_class_non_iid(FASHION_LABELS, 2, seed=0, sizes=[20000, 20000])


@pytest.mark.parametrize("scheme", [lambda s: dirichlet(FASHION_LABELS, 10, 1000.0, s),
                                    lambda s: two_class_non_iid(FASHION_LABELS, 20, s)], ids=["dirichlet", "non_iid"])
def test_the_samples_taken_from_a_class_are_a_random_subset_of_it(scheme):
    ranks = scheme(0)[0] % 6000  # position of each sample within its class
    assert ranks.min() < 600 and ranks.max() > 5400  # not the first (or last) samples of each class


def test_the_dispatcher_passes_through_and_names_the_accepted_schemes():
    assert_same(partition("iid", FASHION_LABELS, 4, 3), iid(60000, 4, 3))
    assert_same(partition("dirichlet", FASHION_LABELS, 4, 3, alpha=0.3), dirichlet(FASHION_LABELS, 4, 0.3, 3))
    for name in ("two_class_non_iid", "non_iid"):
        assert_same(partition(name, FASHION_LABELS, 5, 3, major=0.6), two_class_non_iid(FASHION_LABELS, 5, 3, major=0.6))
    with pytest.raises(ValueError, match="data.partition='shards' is not a partition scheme; "
                                         "accepted: iid, dirichlet, two_class_non_iid, non_iid"):
        partition("shards", FASHION_LABELS, 4, 0)


@pytest.mark.parametrize("call, message", [
    (lambda: iid(10, 0, 0), r"parts must lie in \[1, 10\]"),
    (lambda: iid(10, 11, 0), r"parts must lie in \[1, 10\]"),
    (lambda: dirichlet(FASHION_LABELS, 4, 0.0, 0), "alpha must be a finite number > 0"),
    (lambda: dirichlet(FASHION_LABELS, 4, float("nan"), 0), "alpha must be a finite number > 0"),
    (lambda: dirichlet(FASHION_LABELS, 4, float("inf"), 0), "alpha must be a finite number > 0"),
    (lambda: dirichlet(FASHION_LABELS, 4, -1, 0), "alpha must be a finite number > 0"),
    (lambda: iid(10, 2, 0, sizes=[5, 6]), "sizes must be 2 integers >= 1 summing to at most 10"),
    (lambda: iid(10, 2, 0, sizes=[0, 6]), "sizes must be 2 integers >= 1"),
    (lambda: iid(10, 2, 0, sizes=[6]), "sizes must be 2 integers"),
    (lambda: two_class_non_iid(FASHION_LABELS, 4, 0, major=1.5), r"major must lie in \[0, 1\]"),
    (lambda: two_class_non_iid(np.array([0, 1, 0, 1]), 2, 0), "needs at least 3 classes"),
    (lambda: dirichlet(np.array([0.5, 1.0]), 1, 1.0, 0), "labels must be a 1-D array of non-negative integers"),
])
def test_bad_arguments_get_a_clear_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_sampled_shards_give_any_number_of_clients_their_own_keyed_draw():
    shards = partition("iid", FASHION_LABELS, 100_000, 3, per_client=16)
    assert len(shards) == 100_000 and shards.sizes[99_999] == 16
    a, b = shards[7], shards[99_999]
    assert len(a) == 16 == len(np.unique(a)) and a.dtype == np.int64 and (np.diff(a) > 0).all()
    assert 0 <= a.min() and a.max() < 60_000
    assert_same([shards[7]], [partition("iid", FASHION_LABELS, 100_000, 3, per_client=16)[7]])  # keyed
    assert not np.array_equal(a, b)
    assert not np.array_equal(a, partition("iid", FASHION_LABELS, 100_000, 4, per_client=16)[7])  # seeded
    with pytest.raises(ValueError, match=r"per_client must lie in \[1, 60000\]"):
        partition("iid", FASHION_LABELS, 10, 0, per_client=60_001)

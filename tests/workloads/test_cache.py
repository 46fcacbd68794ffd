"""sim4DistrDL's LRU cache: hits, misses and evictions on hand-made access patterns."""
from __future__ import annotations

import pytest

from agents.workloads.cache import LRUCache


def access(cache, batch):
    got = cache.lookup(batch)
    cache.insert(got.misses)
    return "".join("h" if s in got.hits else "m" for s in batch)


def test_lru_hit_miss_sequence_of_a_hand_made_pattern():
    c = LRUCache(3)
    pattern = [[1], [2], [3], [1], [4], [2], [1], [3], [4], [1]]
    # 1 2 3 miss; 1 hit (order 2 3 1); 4 evicts 2 (3 1 4); 2 misses, evicts 3 (1 4 2); 1 hit (4 2 1);
    # 3 misses, evicts 4 (2 1 3); 4 misses, evicts 2 (1 3 4); 1 hit
    assert "".join(access(c, b) for b in pattern) == "mmmhmmhmmh"
    assert (c.hits, c.misses, c.evictions) == (3, 7, 4)
    assert c.order() == [3, 4, 1]


def test_a_batch_is_looked_up_before_its_misses_are_cached():
    c = LRUCache(2)
    assert access(c, [5, 5, 6]) == "mmm"  # the repeated 5 is not cached yet inside its own batch
    assert c.order() == [5, 6]
    assert access(c, [6, 7]) == "hm"  # 6 becomes most recent, 7 evicts 5
    assert c.order() == [6, 7]


def test_a_cyclic_scan_larger_than_the_cache_never_hits():
    c = LRUCache(4)
    seq = "".join(access(c, [s]) for s in list(range(5)) * 3)
    assert seq == "m" * 15  # LRU's known worst case: the next sample needed is always the one just evicted


def test_capacity_zero_caches_nothing_and_a_negative_one_is_refused():
    c = LRUCache(0)
    assert access(c, [1, 1]) == "mm" and access(c, [1]) == "m"
    assert len(c) == 0
    with pytest.raises(ValueError, match="capacity must be >= 0"):
        LRUCache(-1)

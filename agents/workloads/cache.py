"""sim4DistrDL's LRU cache of training samples, one per node (§III.B.2 and §IV.A of the paper).

The paper keeps cached samples in a linked list: a hit moves the sample to the head, a
new sample goes in at the head, and when the list is full the tail — the least recently
used sample — is removed first. ``collections.OrderedDict`` is that list (``move_to_end``
is the move to the head, ``popitem(last=False)`` removes the tail), in the standard library.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import NamedTuple

__all__ = ["LRUCache", "Lookup"]


class Lookup(NamedTuple):
    """The outcome of one batch: which samples were cached (hits) and which must be fetched (misses)."""

    hits: tuple[int, ...]
    misses: tuple[int, ...]


class LRUCache:
    """Sample ids, most recently used last; ``capacity`` 0 caches nothing."""

    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError(f"cache capacity must be >= 0, got {capacity}")
        self.capacity = capacity
        self._items: OrderedDict[int, None] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, sample: int) -> bool:
        return sample in self._items

    def order(self) -> list[int]:
        """The cached ids from least to most recently used."""
        return list(self._items)

    def lookup(self, samples: Iterable[int]) -> Lookup:
        """Look every sample up, in order: a hit becomes the most recently used; misses are only reported."""
        hits, misses = [], []
        for s in samples:
            s = int(s)
            if s in self._items:
                self._items.move_to_end(s)
                hits.append(s)
            else:
                misses.append(s)
        self.hits += len(hits)
        self.misses += len(misses)
        return Lookup(tuple(hits), tuple(misses))

    def insert(self, samples: Iterable[int]) -> None:
        """Cache fetched samples as the most recently used, evicting the least recently used beyond capacity."""
        if self.capacity == 0:
            return
        for s in samples:
            s = int(s)
            self._items[s] = None
            self._items.move_to_end(s)
            if len(self._items) > self.capacity:
                self._items.popitem(last=False)
                self.evictions += 1

"""Split a training set among vworkers — DESIGN §7.

Every partitioner returns one sorted int64 array of sample indices per part; the
parts are disjoint and a pure function of ``(seed, arguments)`` through keyed
draws ``(seed, "partition", <scheme>, ...)``.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np

from agents.sim.keyed import generator

__all__ = ["iid", "sampled", "SampledShards", "dirichlet", "two_class_non_iid", "partition", "PARTITIONERS"]


def iid(n: int, parts: int, seed: int, sizes: Sequence[int] | None = None) -> list[np.ndarray]:
    """A keyed permutation of ``range(n)`` cut into ``parts`` consecutive chunks.

    Without ``sizes`` the chunks cover all ``n`` samples and differ in size by at
    most one; with ``sizes`` part ``i`` gets ``sizes[i]`` samples and the rest is unused.
    """
    _check_parts(n, parts)
    sizes = _check_sizes(sizes, n, parts)
    order = generator(seed, "partition", "iid").permutation(n)
    return [np.sort(chunk) for chunk in np.split(order[:sizes.sum()], np.cumsum(sizes)[:-1])]


class SampledShards(Sequence[np.ndarray]):
    """``parts`` shards of ``per_part`` distinct samples each, drawn independently for every part.

    Shard ``i`` is the sorted keyed draw ``(seed, "partition", "sampled", i)`` of ``per_part`` of
    the ``n`` samples without replacement; different parts may share samples. It is computed when
    asked for, so a run with 100 000 federated clients keeps no shard of a client it never samples.
    """

    def __init__(self, n: int, parts: int, seed: int, per_part: int):
        if not 1 <= per_part <= n:
            raise ValueError(f"sampled partition: per_client must lie in [1, {n}], got {per_part}.")
        if parts < 1:
            raise ValueError(f"sampled partition: parts must be >= 1, got {parts}.")
        self.n, self.parts, self.seed, self.per_part = n, parts, seed, per_part
        self.sizes = [per_part] * parts if parts <= 1 else _Repeat(per_part, parts)

    def __len__(self) -> int:
        return self.parts

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self.parts))]
        if not -self.parts <= i < self.parts:
            raise IndexError(f"shard {i} of {self.parts}")
        i %= self.parts
        g = generator(self.seed, "partition", "sampled", i)
        return np.sort(g.choice(self.n, self.per_part, replace=False)).astype(np.int64)


class _Repeat(Sequence[int]):
    def __init__(self, value: int, n: int):
        self.value, self.n = value, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self.value] * len(range(*i.indices(self.n)))
        return self.value


def sampled(n: int, parts: int, seed: int, per_part: int) -> SampledShards:
    """Any number of parts, each ``per_part`` samples drawn independently (see :class:`SampledShards`)."""
    return SampledShards(n, parts, seed, per_part)


def dirichlet(labels: Sequence[int] | np.ndarray, parts: int, alpha: float, seed: int,
              sizes: Sequence[int] | None = None) -> list[np.ndarray]:
    """Label skew: part ``i`` draws a class mix ``q_i ~ Dir(alpha, ..., alpha)`` and ``sizes[i]`` samples from it.

    The client-wise scheme of Hsu, Qi & Brown, "Measuring the Effects of
    Non-Identical Data Distribution for Federated Visual Classification" (2019),
    with a symmetric concentration ``alpha`` per class: small ``alpha`` gives each
    part few classes, large ``alpha`` approaches IID. Every part gets exactly its
    size; without ``sizes`` the parts cover all samples, sizes differing by at most one.
    """
    labels = _check_labels(labels)
    _check_parts(len(labels), parts)
    if not alpha > 0 or not np.isfinite(alpha):
        raise ValueError(f"dirichlet partition: alpha must be a finite number > 0, got {alpha!r}.")
    need = _check_sizes(sizes, len(labels), parts).copy()
    pools = _class_pools(labels, seed, "dirichlet")
    left = np.array([len(p) for p in pools])
    mix = np.stack([generator(seed, "partition", "dirichlet", i).dirichlet(np.full(len(pools), float(alpha)))
                    for i in range(parts)])
    counts = np.zeros((parts, len(pools)), dtype=np.int64)
    # In rounds, every part requests its remaining count from its mix restricted to
    # the classes left; a class asked for more than it has grants a uniformly random
    # subset of the requests, so a shortage hits all parts alike, not the last ones.
    # Each round either completes every part or empties a class: at most C + 1 rounds.
    for round_ in itertools.count():
        if not need.any():
            break
        rng = generator(seed, "partition", "dirichlet", "round", round_)
        p = mix * (left > 0)
        dead = p.sum(axis=1) == 0  # a tiny alpha can put all the mass on emptied classes
        p[dead] = left > 0
        requests = np.stack([rng.multinomial(k, row / row.sum()) for k, row in zip(need, p)])
        grants = requests.copy()
        for k in np.flatnonzero(requests.sum(axis=0) > left):
            grants[:, k] = rng.multivariate_hypergeometric(requests[:, k], int(left[k]))
        counts += grants
        left -= grants.sum(axis=0)
        need -= grants.sum(axis=1)
    starts = np.cumsum(counts, axis=0) - counts
    return [np.sort(np.concatenate([pools[k][starts[i, k]:starts[i, k] + counts[i, k]]
                                    for k in range(len(pools))]))
            for i in range(parts)]


def two_class_non_iid(labels: Sequence[int] | np.ndarray, parts: int, seed: int, major: float = 0.8,
                      sizes: Sequence[int] | None = None) -> list[np.ndarray]:
    """The FL-timing thesis split (§6, "Sampling Strategy", Fig. 2): each part takes
    ``major`` of its samples from two classes and the rest evenly from all others.

    Part ``i`` of size ``m`` takes ``round(major*m)`` samples split evenly between its
    two major classes, and ``m - round(major*m)`` split evenly (remainder to the first
    in a keyed order) over the other ``C - 2`` classes. Major pairs are dealt round
    robin from a keyed class permutation ``pi``: part ``i`` gets ``pi[2i mod C]`` and
    ``pi[(2i+1) mod C]``, so every class is major for the same number of parts when
    ``2*parts`` is a multiple of ``C``. Without ``sizes``, every part gets the largest
    common size ``m <= n // parts`` that the class counts can supply (all 60 000 Fashion-MNIST
    samples for 5, 10, 15, ... parts); a ``sizes`` the classes cannot supply is an error.
    """
    labels = _check_labels(labels)
    n = len(labels)
    _check_parts(n, parts)
    if not 0 <= major <= 1:
        raise ValueError(f"two_class_non_iid partition: major must lie in [0, 1], got {major!r}.")
    pools = _class_pools(labels, seed, "two_class")
    num_classes = len(pools)
    if num_classes < 3:
        raise ValueError(f"two_class_non_iid partition: needs at least 3 classes, labels have {num_classes}.")
    available = np.array([len(p) for p in pools])
    order = generator(seed, "partition", "two_class", "classes").permutation(num_classes)
    majors = [(order[2 * i % num_classes], order[(2 * i + 1) % num_classes]) for i in range(parts)]
    minor_orders = [generator(seed, "partition", "two_class", "minor", i).permutation(
        [k for k in order if k not in pair]) for i, pair in enumerate(majors)]

    def plan(part_sizes: Sequence[int]) -> np.ndarray:
        """Per-part class counts ``[parts, C]`` for the given sizes."""
        counts = np.zeros((parts, num_classes), dtype=np.int64)
        for i, m in enumerate(part_sizes):
            top = int(round(major * m))
            counts[i, majors[i][0]] = top // 2
            counts[i, majors[i][1]] = top - top // 2
            rest, extra = divmod(m - top, num_classes - 2)
            counts[i, minor_orders[i]] = rest
            counts[i, minor_orders[i][:extra]] += 1
        return counts

    if sizes is None:
        # Each class's demand is non-decreasing in m, so bisect for the largest m that fits.
        lo, hi = 0, n // parts
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if (plan([mid] * parts).sum(axis=0) <= available).all():
                lo = mid
            else:
                hi = mid - 1
        if lo == 0:
            raise ValueError(f"two_class_non_iid partition: the class counts {available.tolist()} "
                             f"cannot give {parts} parts even one sample each.")
        sizes = [lo] * parts
    else:
        sizes = _check_sizes(sizes, n, parts)
    counts = plan(sizes)
    short = np.flatnonzero(counts.sum(axis=0) > available)
    if len(short):
        k = int(short[0])
        raise ValueError(f"two_class_non_iid partition: sizes need {int(counts[:, k].sum())} samples of "
                         f"class {k}, which has {int(available[k])}; use smaller sizes or fewer parts.")
    starts = np.cumsum(counts, axis=0) - counts
    return [np.sort(np.concatenate([pools[k][starts[i, k]:starts[i, k] + counts[i, k]]
                                    for k in range(num_classes)]))
            for i in range(parts)]


PARTITIONERS: dict[str, Callable[..., list[np.ndarray]]] = {
    "iid": lambda labels, parts, seed, per_client=None, **kw: (
        iid(len(labels), parts, seed, **kw) if per_client is None else sampled(len(labels), parts, seed, per_client)),
    "dirichlet": dirichlet,
    "two_class_non_iid": two_class_non_iid,
    "non_iid": two_class_non_iid,  # the name conf/config.yaml uses
}


def partition(name: str, labels: Sequence[int] | np.ndarray, parts: int, seed: int, **kw) -> list[np.ndarray]:
    """Dispatch on the scheme name (``data.partition`` in the config), passing ``kw`` through."""
    try:
        fn = PARTITIONERS[name]
    except KeyError:
        raise ValueError(f"data.partition={name!r} is not a partition scheme; accepted: "
                         f"{', '.join(PARTITIONERS)}.") from None
    return fn(labels, parts, seed=seed, **kw)


def _check_parts(n: int, parts: int) -> None:
    if not 1 <= parts <= n:
        raise ValueError(f"partition: parts must lie in [1, {n}] (the number of samples), got {parts}.")


def _check_labels(labels: Sequence[int] | np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer) or (len(labels) and labels.min() < 0):
        raise ValueError(f"partition: labels must be a 1-D array of non-negative integers, "
                         f"got dtype {labels.dtype} and shape {labels.shape}.")
    return labels


def _check_sizes(sizes: Sequence[int] | None, n: int, parts: int) -> np.ndarray:
    """Per-part sample counts; the default is an even split of all ``n``."""
    if sizes is None:
        return np.full(parts, n // parts) + (np.arange(parts) < n % parts)
    arr = np.asarray(sizes)
    if (arr.shape != (parts,) or not np.issubdtype(arr.dtype, np.integer)
            or (arr < 1).any() or arr.sum() > n):
        raise ValueError(f"partition: sizes must be {parts} integers >= 1 summing to at most {n}, "
                         f"got {list(sizes)}.")
    return arr.astype(np.int64)


def _class_pools(labels: np.ndarray, seed: int, scheme: str) -> list[np.ndarray]:
    """The indices of each class 0..max(label), each in its own keyed random order."""
    return [generator(seed, "partition", scheme, "pool", k).permutation(np.flatnonzero(labels == k))
            for k in range(int(labels.max()) + 1)]

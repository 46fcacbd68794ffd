"""The coarse-grained model of asynchronous PS SGD: a closed queueing network solved by mean value analysis.

"Predicting Throughput of Distributed SGD" (Li et al.), §2.1 and Fig. 5: every worker
has one task that circulates through its own computation station (a delay: it serves
only that worker), the uplink U, the parameter server's update station S and the
downlink D (queueing stations shared by all workers). lockstep adds one more delay:
the two one-way latencies a round trip pays.

Workers with the same service demands form one *class* of ``count`` customers, so the
exact recursion runs over population vectors ``n <= counts`` (one state per worker
count when all workers are alike: 10 000 workers are 10 001 states). Queueing stations
are solved with

* processor sharing (PS), exact MVA, Eq. (1): ``T_c(n) = S_c (1 + Σ_j N_j(n − e_c))``;
* FCFS with class-dependent service times, Reiser's approximation, Eq. (2):
  ``T_c(n) = S_c + Σ_j S_j (N_j(n − e_c) − ρ_j(n − e_c)/2)``;

and Little's law gives ``X_c(n) = n_c / Σ_l T_c^l(n)``, ``N_c^l = X_c T_c^l``,
``ρ_c^l = X_c S_c^l``. When the state space is too large (many distinct classes) the
recursion is replaced by the Bard–Schweitzer fixed point (``N_j(n − e_c) ≈ N_j(n) (n_j −
[j = c]) / n_j``), and the result says so.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

__all__ = ["WorkerClass", "MVAResult", "solve", "MAX_STATES"]

MAX_STATES = 20_000
"""Above this many population vectors the exact recursion gives way to Bard–Schweitzer."""


@dataclass(frozen=True)
class WorkerClass:
    """Identical workers: how many, and their mean service demands in seconds per SGD step."""

    count: int
    compute_s: float  # the worker's own station (a delay): S^W, plus any other pure delay
    uplink_s: float  # S^U: the gradient through the PS's ingress, uncontended
    update_s: float  # S^S: the PS applies it
    downlink_s: float  # S^D: the parameters through the PS's egress, uncontended


@dataclass(frozen=True)
class MVAResult:
    """Per class: throughput, response time per station; the network's utilisation."""

    throughput: tuple[float, ...]  # X_c: steps per second of all the workers of class c
    uplink_s: tuple[float, ...]  # T_c^U
    update_s: tuple[float, ...]  # T_c^S
    downlink_s: tuple[float, ...]  # T_c^D
    utilisation: float  # the busier of the uplink and downlink: Σ_c X_c S_c
    method: str  # "exact MVA (S states)" or "Bard-Schweitzer"

    @property
    def job_throughput(self) -> float:
        """Steps per second of all workers together (Eq. 3 / Eq. 4)."""
        return sum(self.throughput)


_STATIONS = ("uplink", "update", "downlink")


def _demands(c: WorkerClass) -> tuple[float, float, float]:
    return c.uplink_s, c.update_s, c.downlink_s


def solve(classes: list[WorkerClass], link: str, update: str = "ps", downlink: str | None = None) -> MVAResult:
    """Solve the network with ``link`` (``fcfs`` | ``ps`` | ``delay``) at U, ``downlink`` (default: ``link``)
    at D and ``update`` at S.

    The paper models the update station as PS always; lockstep's PS applies one gradient
    at a time, which is FCFS — both are offered. ``delay`` is a link without contention
    (``network.discipline=unlimited``): each transfer takes its own demand, however many share it.
    """
    downlink = link if downlink is None else downlink
    if {link, downlink} - {"fcfs", "ps", "delay"} or update not in ("fcfs", "ps"):
        raise ValueError(f"disciplines must be fcfs | ps | delay (links) and fcfs | ps (update), got "
                         f"{link!r}, {downlink!r}, {update!r}")
    disc = (link, update, downlink)
    if len(classes) == 1:
        return _one_class(classes[0], disc)
    counts = [c.count for c in classes]
    states = math.prod(n + 1 for n in counts)
    if states <= MAX_STATES:
        return _exact(classes, disc, states)
    return _schweitzer(classes, disc)


def _response(s: float, disc: str, n_tot: float, sn: float, srho: float) -> float:
    """Eq. (1) for PS, Eq. (2) for FCFS, given the queue seen at arrival (the system less one customer)."""
    if disc == "ps":
        return s * (1.0 + n_tot)
    if disc == "delay":
        return s
    return s + (sn - 0.5 * srho)


def _one_class(c: WorkerClass, disc: tuple[str, ...]) -> MVAResult:
    """The exact recursion for identical workers: one state per population, O(count)."""
    dem = _demands(c)
    q = [0.0, 0.0, 0.0]  # N^l(n − 1)
    x, t = 0.0, [0.0, 0.0, 0.0]
    for n in range(1, c.count + 1):
        t = [_response(dem[l], disc[l], q[l], dem[l] * q[l], dem[l] * dem[l] * x) for l in range(3)]
        x = n / (c.compute_s + t[0] + t[1] + t[2])
        q = [x * tl for tl in t]
    return _result([c], [(x, t)], f"exact MVA ({c.count + 1} states)")


def _exact(classes: list[WorkerClass], disc: tuple[str, ...], states: int) -> MVAResult:
    counts = [c.count for c in classes]
    dem = [_demands(c) for c in classes]
    C = len(classes)
    # per state and station: (Σ_j N_j, Σ_j S_j N_j, Σ_j S_j ρ_j); a state is indexed in mixed radix
    radix = [1] * C
    for i in range(1, C):
        radix[i] = radix[i - 1] * (counts[i - 1] + 1)
    table: list[tuple[float, ...] | None] = [None] * states
    table[0] = (0.0,) * 9
    last = None
    # visit vectors in order of total population, so every n − e_c is known before n
    order = sorted(product(*(range(n + 1) for n in counts)), key=sum)
    for n in order:
        idx = sum(k * r for k, r in zip(n, radix))
        if idx == 0:
            continue
        acc = [0.0] * 9
        per_class = []
        for c in range(C):
            if n[c] == 0:
                per_class.append(None)
                continue
            prev = table[idx - radix[c]]
            t = [_response(dem[c][l], disc[l], prev[3 * l], prev[3 * l + 1], prev[3 * l + 2]) for l in range(3)]
            x = n[c] / (classes[c].compute_s + sum(t))
            per_class.append((x, t))
            for l in range(3):
                q = x * t[l]
                acc[3 * l] += q
                acc[3 * l + 1] += dem[c][l] * q
                acc[3 * l + 2] += dem[c][l] * x * dem[c][l]
        table[idx] = tuple(acc)
        last = per_class
    return _result(classes, last, f"exact MVA ({states} states)")


def _schweitzer(classes: list[WorkerClass], disc: tuple[str, ...], tol: float = 1e-10,
                max_iter: int = 100_000) -> MVAResult:
    dem = [_demands(c) for c in classes]
    C = len(classes)
    q = [[c.count / 4.0 for _ in range(3)] for c in classes]  # N_c^l, any positive start
    per_x = [0.0] * C  # X_j of the previous iteration (for the FCFS residual term)
    per_class: list = []
    for _ in range(max_iter):
        new, per_class = [], []
        for c in range(C):
            t = []
            for l in range(3):
                n_tot = sn = srho = 0.0
                for j in range(C):
                    nj = q[j][l] * ((classes[j].count - (j == c)) / classes[j].count)
                    n_tot += nj
                    sn += dem[j][l] * nj
                    # ρ_j(n − e_c) from the current throughputs, scaled the same way
                    srho += dem[j][l] * dem[j][l] * per_x[j] * ((classes[j].count - (j == c)) / classes[j].count)
                t.append(_response(dem[c][l], disc[l], n_tot, sn, srho))
            x = classes[c].count / (classes[c].compute_s + sum(t))
            per_class.append((x, t))
            new.append([x * tl for tl in t])
        per_x = [x for x, _ in per_class]
        delta = max(abs(a - b) for qa, qb in zip(new, q) for a, b in zip(qa, qb))
        q = new
        if delta < tol:
            break
    return _result(classes, per_class, "Bard-Schweitzer approximate MVA")


def _result(classes: list[WorkerClass], per_class: list, method: str) -> MVAResult:
    xs = [x for x, _ in per_class]
    util_u = sum(x * c.uplink_s for x, c in zip(xs, classes))
    util_d = sum(x * c.downlink_s for x, c in zip(xs, classes))
    return MVAResult(throughput=tuple(x for x in xs),
                     uplink_s=tuple(t[0] for _, t in per_class), update_s=tuple(t[1] for _, t in per_class),
                     downlink_s=tuple(t[2] for _, t in per_class), utilisation=max(util_u, util_d),
                     method=method)

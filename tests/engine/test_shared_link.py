"""The fair-shared NIC link (``agents.sim.network._SharedLink``) against a flow-by-flow reference.

The link keeps its flows as columns and vectorises the per-event arithmetic from ``VECTOR_FROM`` flows on.
A run's virtual times must not move by a nanosecond for that (the golden outputs pin whole runs), so every
completion time here is compared exactly with ``Reference``: the link as it was written before, one
``_Flow`` object at a time, sorted by cap at every event (with today's sharing rule: the flows no cap holds back
share what is left as one float).
"""
from __future__ import annotations

import heapq
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.sim import network
from agents.sim.network import SharedFlows, _SharedLink, transfer_ns


class _Flow:
    __slots__ = ("remaining", "cap", "rate", "item")

    def __init__(self, remaining, cap, item):
        self.remaining, self.cap, self.rate, self.item = remaining, cap, 0.0, item

    def left_ns(self):
        return transfer_ns(max(self.remaining, 0.0), self.rate)


class Reference(SharedFlows):
    """The shared link before columns: per-flow objects, a stable sort by cap and a water-fill per event;
    bringing flows up to now and dropping the finished ones is ``SharedFlows``, as it was."""

    def __init__(self, kernel, owner, capacity, on_done):
        self.kernel, self.owner, self.capacity, self.on_done = kernel, owner, capacity, on_done
        self.flows, self.last, self.timer = [], 0, None

    def add(self, nbytes, cap, item):
        self._advance()
        self.flows.append(_Flow(float(nbytes), cap, item))
        self._reschedule()

    def _reschedule(self):
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.flows:
            return
        left, n = self.capacity, len(self.flows)
        order = sorted(self.flows, key=lambda f: f.cap)
        for j, f in enumerate(order):
            if not f.cap < left / n:  # the rest share what is left equally: one float for all of them
                for g in order[j:]:
                    g.rate = left / n
                break
            f.rate = f.cap
            left -= f.cap
            n -= 1
        dt = min(f.left_ns() for f in self.flows)
        self.timer = self.kernel.timer(self.kernel.now + dt, 0, self.owner, self._tick)

    def _tick(self):
        for f in self._finish():
            self.on_done(f.item)


class _Timer:
    def __init__(self, t, fn):
        self.t, self.fn, self.cancelled = t, fn, False

    def cancel(self):
        self.cancelled = True


class Clock:
    """Just enough of a kernel for one link: ``now`` and cancellable timers, earliest first."""

    def __init__(self):
        self.now, self.heap, self.seq = 0, [], 0

    def timer(self, t, prio, owner, fn):
        tm = _Timer(t, fn)
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, tm))
        return tm


def completions(cls, capacity, arrivals, rescale=None):
    """Feed ``arrivals`` ((time, nbytes, cap), time-ordered) to one link of ``cls``; return [(time, index)].

    An arrival at the same time as a completion comes first. ``rescale`` = (time, factor): the link's
    capacity changes then, as ``Network.rescale`` does for a slow-NIC fault."""
    clock, out = Clock(), []
    link = cls(clock, None, capacity, lambda i: out.append((clock.now, i)))
    pending = [(t, 0, i, b, c) for i, (t, b, c) in enumerate(arrivals)]
    if rescale is not None:
        pending.append((rescale[0], 1, -1, rescale[1], None))
    pending.sort()
    while pending or clock.heap:
        while clock.heap and clock.heap[0][2].cancelled:
            heapq.heappop(clock.heap)
        if pending and (not clock.heap or pending[0][0] <= clock.heap[0][0]):
            t, kind, i, b, c = pending.pop(0)
            clock.now = t
            if kind == 0:
                link.add(b, c, i)
            else:
                link._advance()
                link.capacity = capacity * b
                link._reschedule()
        elif clock.heap:
            t, _, tm = heapq.heappop(clock.heap)
            clock.now = t
            tm.fn()
    return out


@st.composite
def traffic(draw):
    n = draw(st.integers(1, 70))
    caps = draw(st.sampled_from(["inf", "even", "mixed"]))
    cap_of = {"inf": lambda: math.inf, "even": lambda: 1.25e8,
              "mixed": lambda: draw(st.sampled_from([math.inf, 1.25e8, 3e7, 1e6]))}[caps]
    t, arrivals = 0, []
    for _ in range(n):
        t += draw(st.sampled_from([0, 0, 1, draw(st.integers(0, 2_000_000))]))
        arrivals.append((t, draw(st.sampled_from([0, 1, 177_000, draw(st.integers(1, 10_000_000))])), cap_of()))
    return draw(st.sampled_from([1.25e8, 1e9 / 7, 12_500_000.0])), arrivals


@pytest.mark.parametrize("vector_from", [2, 40, 10**9], ids=["vectors", "default", "lists"])
@settings(max_examples=60, deadline=None)
@given(case=traffic(), rescale=st.none() | st.tuples(st.integers(0, 5_000_000), st.sampled_from([0.5, 3.0])))
def test_every_completion_is_the_references_to_the_nanosecond(vector_from, case, rescale):
    capacity, arrivals = case
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(network, "VECTOR_FROM", vector_from)
        got = completions(_SharedLink, capacity, arrivals, rescale)
    assert got == completions(Reference, capacity, arrivals, rescale)
    assert sorted(i for _, i in got) == list(range(len(arrivals)))


def test_a_burst_of_a_thousand_flows_crosses_to_vectors_and_back():
    # 1 000 senders of 177 kB into one 1 Gbit/s NIC (a PS's ingress), in three waves; each with its own cap
    # in the last wave, so the uneven water-fill runs vectorised too.
    arrivals = ([(0, 177_000, 1.25e8)] * 400 + [(1_000_000 + i, 177_000 + i, 1.25e8) for i in range(400)]
                + [(50_000_000 + 7 * i, 1000 * (i % 13) + 1, 1.25e8 / (1 + i % 3)) for i in range(200)])
    got = completions(_SharedLink, 1.25e8, arrivals)
    assert got == completions(Reference, 1.25e8, arrivals)
    # the first wave alone: 400 equal flows sharing 125 MB/s finish together at 400 · 177 kB / 125 MB/s
    assert {t for t, _ in completions(_SharedLink, 1.25e8, arrivals[:400])} == {566_400_000}


@pytest.mark.parametrize("flows", [1, 30], ids=["lists", "vectors"])
def test_half_a_nanosecond_rounds_to_even_as_transfer_ns_does(flows):
    # each flow moves 1 byte at 12 GB/s / flows = 400 MB/s: 2.5 ns, which rounds to 2 (half to even); at 2 ns
    # 0.2 bytes are left, 0.5 ns more, which rounds to 0: done at 2 ns, not 3.
    got = completions(_SharedLink, 4e8 * flows, [(0, 1, math.inf)] * flows)
    assert got == [(2, i) for i in range(flows)] == completions(Reference, 4e8 * flows, [(0, 1, math.inf)] * flows)

"""The fair-shared NIC link alone: columns (vectorised from ``VECTOR_FROM`` flows) against the per-flow link it
replaced (``tests/engine/test_shared_link.py::Reference``), on the same traffic, in this process.

Traffic: N senders into one 1 Gbit/s NIC (a parameter server's ingress), each sending 177 kB (the thesis CNN's
parameters) again as soon as its last message finished, plus a compute gap of 2 ms, until 20 000 messages
completed — so about N flows share the link at every event. Both links give the same completion times (checked
here, and to the nanosecond by the test); the benchmark prints events per second and the ratio.
usage: python benchmarks/bench_shared_link.py [N,N,...] [REPEATS]
"""
from __future__ import annotations

import heapq
import sys
import time

from _common import load_average  # also puts the repository on sys.path

from agents.sim import network
from agents.sim.network import _SharedLink
from tests.engine.test_shared_link import Clock, Reference

MESSAGES = 20_000


def closed_loop(cls, senders: int) -> tuple[float, list]:
    """Each sender resends 2 ms after its message is in; returns (wall seconds, completions)."""
    clock, out = Clock(), []
    sent = [0]

    def done(i):
        out.append((clock.now, i))
        if sent[0] < MESSAGES:
            sent[0] += 1
            heapq.heappush(arrivals, (clock.now + 2_000_000, i))

    link = cls(clock, None, 1.25e8, done)
    arrivals = [(i * 1000, i) for i in range(senders)]
    sent[0] = senders
    t0 = time.perf_counter()
    while arrivals or clock.heap:
        while clock.heap and clock.heap[0][2].cancelled:
            heapq.heappop(clock.heap)
        if arrivals and (not clock.heap or arrivals[0][0] <= clock.heap[0][0]):
            clock.now, i = heapq.heappop(arrivals)
            link.add(177_000, 1.25e8, i)
        elif clock.heap:
            t, _, tm = heapq.heappop(clock.heap)
            clock.now = t
            tm.fn()
    return time.perf_counter() - t0, out


def main() -> None:
    sizes = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 4, 16, 64, 256, 1024]
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    print(f"bench_shared_link: {MESSAGES} messages of 177 kB into one 1 Gbit/s NIC, best of {repeats}; "
          f"VECTOR_FROM = {network.VECTOR_FROM}; load average {load_average()}")
    print(f"{'senders':>8} {'per-flow (µs/msg)':>18} {'columns (µs/msg)':>17} {'speed-up':>9}")
    for n in sizes:
        best = {}
        for _ in range(repeats):
            for name, cls in (("reference", Reference), ("columns", _SharedLink)):
                s, out = closed_loop(cls, n)
                if name not in best or s < best[name][0]:
                    best[name] = (s, out)
        assert best["reference"][1] == best["columns"][1], f"{n} senders: completion times differ"
        ref, col = best["reference"][0], best["columns"][0]
        print(f"{n:8d} {1e6 * ref / MESSAGES:18.1f} {1e6 * col / MESSAGES:17.1f} {ref / col:8.1f}x", flush=True)


if __name__ == "__main__":
    main()

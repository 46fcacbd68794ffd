"""What fault injection costs the engine (docs/faults.md): a message ping-pong ring without faults, with
faults that are configured but never fire (every delivery and send asks), and with keyed duplication.

Prints hops/s of each and the ratios to the run without faults, interleaved ``--repeat`` times.
Run: .venv/bin/python benchmarks/bench_faults.py [--laps 2000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import time

from agents.sim.compute import ComputeSpec
from agents.sim.env import Environment
from agents.sim.faults import Fault, FaultSpec
from agents.sim.kernel import Kernel
from agents.sim.network import ConstantLatency, NetworkSpec
from agents.sim.types import INFINITY
from agents.sim.worker import Worker

N = 100


class Hop(Worker):
    def __init__(self, name, vid, env, laps):
        super().__init__(name, vid, env)
        self.laps = laps

    async def run(self):
        nxt = (self.id + 1) % N
        if self.id == 0:
            self.send(nxt, None, nbytes=0, tag="t")
        for _ in range(self.laps):
            await self.recv(tag="t")
            self.send(nxt, None, nbytes=0, tag="t")


def ring(laps: int, faults: FaultSpec) -> float:
    k = Kernel()
    env = Environment(k, [f"p{i}" for i in range(N)],
                      NetworkSpec(ConstantLatency(1), (1e9,) * N, (1e9,) * N, "unlimited", "unlimited"),
                      ComputeSpec(model="constant"), faults=faults)
    for i in range(N):
        k.add_worker(Hop(f"p{i}", i, env, laps))
    t0 = time.perf_counter()
    k.run_until()
    return laps * N / (time.perf_counter() - t0)


CASES = {
    "no faults": FaultSpec(),
    "inert faults (a partition of others, loss that never fires)": FaultSpec((
        Fault(0, "partition", INFINITY - 2, INFINITY - 1, groups=((0,), (1,))),
        Fault(1, "loss", INFINITY - 2, INFINITY - 1))),
    "keyed duplication, probability 1e-9 (a keyed draw per message)":
        FaultSpec((Fault(0, "duplicate", 0, INFINITY, probability=1e-9),)),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--laps", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    best = {name: 0.0 for name in CASES}
    for _ in range(a.repeat):
        for name, spec in CASES.items():
            best[name] = max(best[name], ring(a.laps, spec))
    base = best["no faults"]
    for name, rate in best.items():
        print(f"{name}: {rate:,.0f} hops/s, ratio {rate / base:.3f}")


if __name__ == "__main__":
    main()

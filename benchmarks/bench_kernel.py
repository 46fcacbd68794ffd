"""Kernel event rate against SimPy on the same pure discrete-event workloads (issue 2).

1. 1 000 000 timeouts over 1 000 processes (each sleeps 1 000 times).
2. A message ping-pong ring: 100 processes pass a token around 2 000 times.

Prints events/s of each and the ratio lockstep / SimPy (target >= 1, aim 2).
Run: .venv/bin/python benchmarks/bench_kernel.py [--scale 1.0]
"""
from __future__ import annotations

import argparse
import time

import simpy

from agents.sim.compute import ComputeSpec
from agents.sim.env import Environment
from agents.sim.kernel import Kernel
from agents.sim.network import ConstantLatency, NetworkSpec
from agents.sim.worker import Worker


def lockstep_env(n: int):
    k = Kernel()
    env = Environment(k, [f"p{i}" for i in range(n)],
                      NetworkSpec(ConstantLatency(1), (1e9,) * n, (1e9,) * n, "unlimited", "unlimited"),
                      ComputeSpec(model="constant"))
    return k, env


class Sleeper(Worker):
    def __init__(self, name, vid, env, steps):
        super().__init__(name, vid, env)
        self.steps = steps

    async def run(self):
        for _ in range(self.steps):
            await self.sleep(1)


class RingNode(Worker):
    def __init__(self, name, vid, env, n, laps):
        super().__init__(name, vid, env)
        self.n, self.laps = n, laps

    async def run(self):
        nxt = f"p{(self.id + 1) % self.n}"
        if self.id == 0:
            self.send(nxt, None, nbytes=0)
        for _ in range(self.laps):
            await self.recv()
            self.send(nxt, None, nbytes=0)


def ours_timeouts(procs: int, steps: int) -> tuple[float, int]:
    k, env = lockstep_env(procs)
    for i in range(procs):
        k.add_worker(Sleeper(f"p{i}", i, env, steps))
    t = time.perf_counter()
    k.run_until()
    return time.perf_counter() - t, procs * steps


def simpy_timeouts(procs: int, steps: int) -> tuple[float, int]:
    env = simpy.Environment()

    def p(env):
        for _ in range(steps):
            yield env.timeout(1)

    for _ in range(procs):
        env.process(p(env))
    t = time.perf_counter()
    env.run()
    return time.perf_counter() - t, procs * steps


def ours_ring(n: int, laps: int) -> tuple[float, int]:
    k, env = lockstep_env(n)
    for i in range(n):
        k.add_worker(RingNode(f"p{i}", i, env, n, laps))
    t = time.perf_counter()
    k.run_until()
    return time.perf_counter() - t, n * laps


def simpy_ring(n: int, laps: int) -> tuple[float, int]:
    env = simpy.Environment()
    boxes = [simpy.Store(env) for _ in range(n)]

    def node(env, i):
        nxt = boxes[(i + 1) % n]
        if i == 0:
            env.process(deliver(env, nxt))
        for _ in range(laps):
            yield boxes[i].get()
            env.process(deliver(env, nxt))

    def deliver(env, box):  # a message that takes 1 ns of latency, like ours
        yield env.timeout(1)
        yield box.put(None)

    for i in range(n):
        env.process(node(env, i))
    t = time.perf_counter()
    env.run()
    return time.perf_counter() - t, n * laps


def best(fn, *args, repeat=3):
    runs = [fn(*args) for _ in range(repeat)]
    secs = min(r[0] for r in runs)
    return secs, runs[0][1] / secs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=float, default=1.0, help="multiply the workload sizes")
    a = ap.parse_args()
    steps = int(1000 * a.scale)
    laps = int(2000 * a.scale)
    print(f"{'workload':<34}{'lockstep ev/s':>15}{'SimPy ev/s':>13}{'ratio':>8}")
    for name, ours, theirs, args in [
        (f"timeouts: 1000 procs x {steps}", ours_timeouts, simpy_timeouts, (1000, steps)),
        (f"ping-pong ring: 100 procs x {laps}", ours_ring, simpy_ring, (100, laps)),
    ]:
        _, r_ours = best(ours, *args)
        _, r_simpy = best(theirs, *args)
        print(f"{name:<34}{r_ours:>15,.0f}{r_simpy:>13,.0f}{r_ours / r_simpy:>8.2f}")


if __name__ == "__main__":
    main()

"""Helpers that build a one-agent kernel with an explicit network, no workload."""
from __future__ import annotations

import pytest

from agents.sim.compute import ComputeSpec
from agents.sim.env import Environment
from agents.sim.kernel import Kernel
from agents.sim.network import ConstantLatency, NetworkSpec


def build(workers: dict, *, latency_ns: int = 0, bw=1e9, bw_in=None, egress="fifo", ingress="fifo",
          constant=None, speed=(), tcp=None, seed=0):
    """Build a kernel hosting ``workers`` ({name: (cls, kwargs)}) in dict order; return (kernel, env, objs)."""
    names = list(workers)
    n = len(names)
    out = tuple(bw) if isinstance(bw, (list, tuple)) else (float(bw),) * n
    inn = out if bw_in is None else (tuple(bw_in) if isinstance(bw_in, (list, tuple)) else (float(bw_in),) * n)
    k = Kernel()
    env = Environment(
        k, names,
        NetworkSpec(ConstantLatency(latency_ns), out, inn, egress, ingress, tcp),
        ComputeSpec(model="constant", constant_s=constant or {"gradient": 0.0, "update": 0.0, "aggregate": 0.0},
                    speed=tuple(speed)),
        seed=seed,
    )
    objs = {}
    for vid, name in enumerate(names):
        cls, kwargs = workers[name]
        w = cls(name, vid, env, **kwargs)
        objs[name] = w
        k.add_worker(w)
    return k, env, objs


@pytest.fixture
def build_kernel():
    return build

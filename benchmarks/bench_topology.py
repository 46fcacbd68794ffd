"""A fat tree of N workers (ps_async, the MLP): routes on demand against a route per pair of nodes, and flows
shared as columns against the per-flow loop — both baselines run here, in this process, on the same plan.

*Plan*: composing and checking the config (``load``, which validates the topology) and building the plan
(``make_plan``), and the topology's size in JSON, against building the table the plan stored before 2026-11-30
(a breadth-first search from every node that holds a vworker, every pair kept; validation and the plan each
built it).
*Run*: the agent's core run to ``stop.updates`` (the PS's broadcast to every worker, their gradients back), with
the columns (``COLUMNS_FROM`` flows on) against the loop alone (``COLUMNS_FROM`` set beyond any crowd); the
two must end at the same nanosecond with the same parameters (checked here; to the bit by
tests/engine/test_topology.py). The table's size grows with N², so the baseline's plan is built only up to
``--table-max`` workers.
usage: python benchmarks/bench_topology.py [N,N,...] [UPDATES] [--table-max N]
"""
from __future__ import annotations

import json
import sys
import time

from _common import load_average  # also puts the repository on sys.path

import torch

import agents.sim.topology as topology
from agents.core import AgentCore
from agents.sim.types import INFINITY
from controller.config import load
from controller.plan import make_plan
from tests.engine.test_topology import every_route


def table_json_bytes(topo) -> int:
    """The size in JSON of the table the plan used to store: a route for every ordered pair of vworker nodes."""
    table = every_route(topo.links, list(dict.fromkeys(topo.node_of)))
    return len(json.dumps([[a, b, list(p)] for (a, b), p in table.items()]))


def run_core(plan, columns_from: int) -> tuple[float, int, torch.Tensor]:
    topology.COLUMNS_FROM = columns_from
    core = AgentCore(plan, 0)
    t0 = time.perf_counter()
    core.advance(INFINITY)
    wall = time.perf_counter() - t0
    out = core.kernel.now, core.result_params().clone()
    core.close()
    return wall, *out


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    table_max = int(sys.argv[sys.argv.index("--table-max") + 1]) if "--table-max" in sys.argv else 2000
    if "--table-max" in sys.argv:
        args.remove(str(table_max))
    sizes = [int(x) for x in args[0].split(",")] if args else [250, 1000, 2000, 4000]
    updates = int(args[1]) if len(args) > 1 else 100
    default = topology.COLUMNS_FROM
    print(f"bench_topology: fat_tree (4 hosts a leaf, 2 spines), ps_async, MLP, batch 4, {updates} updates, "
          f"in-process; COLUMNS_FROM = {default}; load average {load_average()}")
    print(f"{'workers':>7} {'config+plan (s)':>15} {'plan JSON':>10} {'table (s)':>9} {'table JSON':>11} "
          f"{'loop (s)':>9} {'columns (s)':>11} {'speed-up':>8}")
    for n in sizes:
        t0 = time.perf_counter()
        cfg = load(["model=mlp", "compute=constant", "batch_size=4", "network=ideal", "network.topology=fat_tree",
                    "eval.every=0", "trace.mode=off", "statelog.enabled=false", f"workers={n}",
                    f"stop.updates={updates}", "launcher=inprocess"])
        plan = make_plan(cfg, run_id="bench")
        plan_s = time.perf_counter() - t0
        plan_bytes = len(json.dumps(plan.network.topology.to_dict()))
        if n <= table_max:
            t0 = time.perf_counter()
            table_bytes = table_json_bytes(plan.network.topology) + plan_bytes
            table = f"{time.perf_counter() - t0:9.2f} {table_bytes / 1e6:9.1f}MB"
        else:
            table = f"{'-':>9} {'-':>11}"
        loop_s, loop_t, loop_p = run_core(plan, 10 ** 9)
        cols_s, cols_t, cols_p = run_core(plan, default)
        assert loop_t == cols_t and torch.equal(loop_p, cols_p), "the columns and the loop disagree"
        print(f"{n:>7} {plan_s:15.2f} {plan_bytes / 1e6:8.2f}MB {table} {loop_s:9.2f} {cols_s:11.2f} "
              f"{loop_s / cols_s:7.2f}x")
    topology.COLUMNS_FROM = default


if __name__ == "__main__":
    main()

"""Fuzzing at volume (issue 13 item 4): hypothesis-generated configs and protocol frames, counted.

Configs: one to four Hydra overrides (keys of conf/config.yaml set to valid and invalid values, group
choices, added and deleted keys) must give a plan or one clear sentence per problem. Frames: streams of
chunks, envelopes and Reached frames (random values, events, rows; some bytes mangled) must be accepted or
refused by the controller within the plan's limits; controller events must decode or raise WireError in an
agent; what a peer sends on a direct-window stream (agents/mesh.py) must run or fail with MeshError, within
the limits. Anything else is a crash; the first few are printed. The strategies and properties are those of
tests/security/test_fuzz.py (tests/security/fuzzing.py).

usage: python benchmarks/bench_fuzz.py [CONFIGS] [FRAMES] [--jobs J]     (defaults 10000 10000 1)

FRAMES examples of each kind of frame; the configs are split over J processes.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures
import multiprocessing
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def _count(name: str, n: int, strategy, outcome) -> tuple[collections.Counter, list[str]]:
    counts: collections.Counter = collections.Counter()
    crashes: list[str] = []

    @settings(max_examples=n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def one(example) -> None:
        try:
            counts[outcome(example)] += 1
        except Exception as e:  # noqa: BLE001 - a crash: counted and shown, the run goes on
            counts["CRASH"] += 1
            print(f"{name}: CRASH on {example!r:.300}: {type(e).__name__}: {e!s:.200}", flush=True)
            if len(crashes) < 5:
                crashes.append(f"{example!r:.300}\n{''.join(traceback.format_exception(e))[-1500:]}")
        done = sum(counts.values())
        if done % 500 == 0:  # progress, so a run cut short still says how far it came
            print(f"{name}: {done} so far in {time.perf_counter() - t0:.0f} s: {dict(counts)}", flush=True)

    t0 = time.perf_counter()
    one()
    print(f"{name}: {sum(counts.values())} tried in {time.perf_counter() - t0:.0f} s: {dict(counts)}", flush=True)
    return counts, crashes


CONFIG_MEMORY_LIMIT = 6 << 30
"""Address space of a config-fuzzing process: an input that makes validation hoard memory fails there with a
MemoryError (a crash, printed with its overrides) instead of taking the machine down (one did, at 21 GB)."""


def _configs(n: int) -> tuple[collections.Counter, list[str]]:
    import resource

    from tests.security import fuzzing

    resource.setrlimit(resource.RLIMIT_AS, (CONFIG_MEMORY_LIMIT, resource.getrlimit(resource.RLIMIT_AS)[1]))

    return _count(f"configs ({n})", n, fuzzing.overrides(fuzzing.config_leaves()), fuzzing.config_outcome)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configs", type=int, nargs="?", default=10_000)
    ap.add_argument("frames", type=int, nargs="?", default=10_000)
    ap.add_argument("--jobs", type=int, default=1, help="processes for the configs (each draws its own examples)")
    a = ap.parse_args()
    from agents.common.plan import Plan  # noqa: F401 - imports torch once, before timing
    from controller.config import validate
    from controller.plan import make_plan
    from protos.lockstep.v1 import agent_pb2 as pb
    from tests.helpers import compose_cfg
    from tests.security import fuzzing

    t0 = time.perf_counter()
    pool = concurrent.futures.ProcessPoolExecutor(a.jobs, mp_context=multiprocessing.get_context("fork")) \
        if a.configs else None
    parts = [a.configs // a.jobs + (i < a.configs % a.jobs) for i in range(a.jobs)] if a.configs else []
    futures = [pool.submit(_configs, n) for n in parts if n]  # configs in the background, frames here
    results = []
    if a.frames:
        plan = make_plan(validate(compose_cfg(["model=mlp", "compute=constant", "eval.every=0", "progress=false",
                                               "launcher=inprocess", "workers=2", "agents=2", "stop.updates=2"]),
                                  check_data=False), run_id="fuzz")
        results += [
            _count("frames", a.frames, fuzzing.frame_streams(), lambda s: fuzzing.controller_takes(plan, s)),
            _count("agent events", a.frames,
                   st.builds(pb.Event).flatmap(lambda e: fuzzing.events(e).map(lambda _: e)), fuzzing.agent_takes),
            _count("direct-window streams", a.frames, fuzzing.mesh_streams(), fuzzing.mesh_takes),
        ]
    if futures:
        parts_done = [f.result() for f in futures]
        total: collections.Counter = sum((c for c, _ in parts_done), collections.Counter())
        print(f"configs: {sum(total.values())} tried: {dict(total)}", flush=True)
        results.append((total, [x for _, cr in parts_done for x in cr]))
        pool.shutdown()
    crashed = 0
    for counts, crashes in results:
        crashed += counts["CRASH"]
        for c in crashes:
            print("--- crash ---\n" + c)
    print(f"crashes: {crashed}; {time.perf_counter() - t0:.0f} s in all", flush=True)
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())

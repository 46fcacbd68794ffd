"""Fuzzing at volume (issue 13 item 4): hypothesis-generated configs and protocol frames, counted.

Configs: one to four Hydra overrides (keys of conf/config.yaml set to valid and invalid values, group
choices, added and deleted keys) must give a plan or one clear sentence per problem. Frames: streams of
chunks, envelopes and Reached frames (random values, events, rows; some bytes mangled) must be accepted or
refused by the controller within the plan's limits; controller events must decode or raise WireError in an
agent. Anything else is a crash; the first few are printed. The strategies and properties are those of
tests/security/test_fuzz.py (tests/security/fuzzing.py).

usage: python benchmarks/bench_fuzz.py [CONFIGS] [FRAMES]      (defaults 10000 10000)
"""
from __future__ import annotations

import collections
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
            if len(crashes) < 5:
                crashes.append(f"{example!r:.300}\n{''.join(traceback.format_exception(e))[-1500:]}")

    t0 = time.perf_counter()
    one()
    print(f"{name}: {sum(counts.values())} tried in {time.perf_counter() - t0:.0f} s: {dict(counts)}", flush=True)
    return counts, crashes


def main() -> int:
    n_configs = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    n_frames = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    from agents.common.plan import Plan  # noqa: F401 - imports torch once, before timing
    from controller.config import validate
    from controller.plan import make_plan
    from protos.lockstep.v1 import agent_pb2 as pb
    from tests.helpers import compose_cfg
    from tests.security import fuzzing

    plan = make_plan(validate(compose_cfg(["model=mlp", "compute=constant", "eval.every=0", "progress=false",
                                           "launcher=inprocess", "workers=2", "agents=2", "stop.updates=2"]),
                              check_data=False), run_id="fuzz")
    results = [
        _count("frames", n_frames, fuzzing.frame_streams(), lambda s: fuzzing.controller_takes(plan, s)),
        _count("agent events", n_frames, st.builds(pb.Event).flatmap(lambda e: fuzzing.events(e).map(lambda _: e)),
               fuzzing.agent_takes),
        _count("configs", n_configs, fuzzing.overrides(fuzzing.config_leaves()), fuzzing.config_outcome),
    ]
    crashed = 0
    for counts, crashes in results:
        crashed += counts["CRASH"]
        for c in crashes:
            print("--- crash ---\n" + c)
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())

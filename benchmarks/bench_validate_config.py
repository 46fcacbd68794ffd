"""The config of each ``lockstep validate`` emulation: composed once per point and validated once per seed
(controller.validate.point_config) against three compositions and two validations per emulation, as before
2026-12-02 (:func:`before`) — the same RunConfig, in how much time.

For the hold-out file's ring and PS points, SEEDS seeds each (the seeds differ only in ``seed=`` and the start
offsets it keys), it builds every emulation's RunConfig both ways in this process, interleaved per point, checks
they are equal and prints both wall times and their ratio. One emulation itself takes 0.5-5 s on 2 cores
(docs/benchmarks.md, "Validating in parallel"); the config was 1-1.5 s of it.
usage: python benchmarks/bench_validate_config.py [SEEDS]
"""
from __future__ import annotations

import sys
import time

from _common import ROOT, load_average


def before(p, overrides: list[str]):
    """point_config as it was: Hydra composed three times and the config validated twice, per emulation."""
    from controller.config import compose_config, load
    from controller.validate import _overrides_for, testbed_starts

    base = compose_config(_overrides_for(p))
    mine = [o for o in overrides if not (o.split("=", 1)[0].lstrip("+~").startswith("strategy.")
                                         and o.split("=", 1)[0].lstrip("+~").split(".")[1] not in base.strategy)]
    rc = load(_overrides_for(p, mine) + mine)
    names = ([] if p.scenario == "ring" else ["ps0"]) + [f"w{i}" for i in range(p.K)]
    starts = testbed_starts(p, rc.network.latency.ns + (rc.network.tcp.host_latency_ns if rc.network.tcp else 0),
                            rc.seed)
    offsets = ["compute.start_offsets={" + ", ".join(f"{n}: {t}ns" for n, t in zip(names, starts)) + "}"]
    return load(_overrides_for(p, mine) + offsets + mine)


def main() -> None:
    from controller.config import load
    from controller.results import group_repeats, load_results
    from controller.validate import point_config

    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    points = [p for p in group_repeats(load_results(ROOT / "benchmarks" / "data" / "realrun-holdout.jsonl"))
              if p.scenario in ("ring", "ps_sync", "ps_async")]
    user = ["network=tcp", "strategy.collective=gloo"]
    load(["model=flat"])  # imports and the first composition, outside both timings
    print(f"load average before: {load_average()}")
    cached = plain = 0.0
    same = True
    for p in points:
        for s in range(seeds):
            ov = [*user, f"seed={s}"]
            t = time.perf_counter()
            a = point_config(p, ov)
            cached += time.perf_counter() - t
            t = time.perf_counter()
            b = before(p, ov)
            plain += time.perf_counter() - t
            same = same and a == b
    n = len(points) * seeds
    print(f"{len(points)} points x {seeds} seeds: once per point {cached:.1f} s ({1e3 * cached / n:.0f} ms "
          f"an emulation), before {plain:.1f} s ({1e3 * plain / n:.0f} ms), ratio {plain / cached:.2f}x; "
          f"the same RunConfig every time: {same}")
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()

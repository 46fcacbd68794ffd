"""Memory at scale (issue 11): peak resident memory of two large in-process runs against their targets.

* 10 000 vworkers, ps_async, model=mlp, batch 4 (6 samples per worker), compute=constant — the command of
  docs/engine.md "Scale" (target: peak <= 8 GiB);
* FedAvg with 100 000 clients, 100 sampled per round (``strategy.fraction=0.001``), each holding 32
  samples drawn for it (``data.per_client=32``; the 60 000 Fashion-MNIST samples cannot give 100 000
  disjoint shards), the thesis CNN (target: peak <= 4 GiB).

Each runs once in a fresh process; the peak is the process's maximum resident set (summary.json
``peak_memory``). usage: python benchmarks/bench_scale.py [UPDATES_PS] [ROUNDS_FEDAVG] [--only ps|fedavg]
"""
from __future__ import annotations

import sys

from _common import fresh_runs, load_average

GIB = 2**30


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    ps_updates = int(args[0]) if args else 3000
    rounds = int(args[1]) if len(args) > 1 else 10
    points = {
        "ps_async 10 000 workers mlp": (["launcher=inprocess", "strategy=ps_async", "workers=10000", "model=mlp",
                                         "batch_size=4", "compute=constant", f"stop.updates={ps_updates}",
                                         "trace.mode=off", "statelog.enabled=false", "eval.every=0"], 8),
        "fedavg 100 000 clients, 100 a round": (["launcher=inprocess", "strategy=fedavg", "workers=100000",
                                                 "strategy.fraction=0.001", "data.per_client=32",
                                                 f"stop.updates={rounds}", "trace.mode=off", "eval.every=0"], 4),
    }
    if "--only" in sys.argv:
        want = sys.argv[sys.argv.index("--only") + 1]
        points = {k: v for k, v in points.items() if k.startswith(want)}
    for name, (over, target) in points.items():
        (s,) = fresh_runs({name: over}, 1)[name]
        peak = s["peak_memory"]["max_rss_bytes"]
        print(f"bench_scale {name}: peak resident memory {peak / GIB:.2f} GiB (target <= {target} GiB: "
              f"{'met' if peak <= target * GIB else 'missed'}), wall {s['wall_time_s']:.1f} s; "
              f"load average {load_average()}")


if __name__ == "__main__":
    main()

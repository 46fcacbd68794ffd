"""Deferred, batched compute (DESIGN §4.2, agents/sim/executor.py): compute.batch=auto against off.

Two points, each a fresh process per run, interleaved (off, loop, auto, off, ...), best of REPEATS (``loop``:
deferred without vmap, to tell the two gains apart; in one process ``compute.overlap=auto`` runs no
background thread, so neither side overlaps):

* 64 workers, model=mlp, ps_async, UPDATES updates, in-process (target: auto >= 1.5x faster than off);
* the default experiment (the thesis CNN), the same updates (target: auto no slower than off).

It prints each side's best wall time and window-loop time, their ratios, each side's least CPU time, how the gradients were batched
(mean and largest batch, share of tasks run by vmap) and the load average. ``auto`` probes loop against
vmap at start-up and keeps the figures in the profile database; the script warms that database first,
so both sides measure the run, not the probe.
``--thread`` adds ``loop`` with ``compute.overlap=true`` (a background thread in one process, which
``compute.overlap=auto`` no longer starts there: docs/benchmarks.md, issue 11).
usage: python benchmarks/bench_batching.py [UPDATES] [REPEATS] [--point mlp|cnn] [--thread]
"""
from __future__ import annotations

import sys

from _common import fresh_runs, load_average


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    updates = int(args[0]) if args else 3000
    repeats = int(args[1]) if len(args) > 1 else 3
    points = {"mlp": ["model=mlp"], "cnn": []}
    if "--point" in sys.argv:
        name = sys.argv[sys.argv.index("--point") + 1]
        points = {name: points[name]}
    common = ["launcher=inprocess", "agents=1", f"stop.updates={updates}", "trace.mode=off"]
    for name, over in points.items():
        fresh_runs({"warm": common + over + ["compute.batch=auto", "stop.updates=2"]}, 1)  # the probe, once
        variants = {"off": common + over + ["compute.batch=off"],
                    "loop": common + over + ["compute.batch=loop"],
                    "auto": common + over + ["compute.batch=auto"]}
        if "--thread" in sys.argv:
            variants["loop+thread"] = common + over + ["compute.batch=loop", "compute.overlap=true"]
        res = fresh_runs(variants, repeats)
        off = min(res["off"], key=lambda s: s["wall_time_s"])
        loop = min(res["loop"], key=lambda s: s["wall_time_s"])
        auto = min(res["auto"], key=lambda s: s["wall_time_s"])
        cb = auto["compute_batch"]
        share = cb["vmap_tasks"] / cb["tasks"] if cb["tasks"] else 0.0
        print(f"bench_batching {name}: 64 workers ps_async, {updates} updates, in-process, best of {repeats}: "
              f"off {off['wall_time_s']:.2f} s (loop {off['wall_barrier_s']:.2f} s), auto "
              f"{auto['wall_time_s']:.2f} s (loop {auto['wall_barrier_s']:.2f} s): auto is "
              f"{off['wall_time_s'] / auto['wall_time_s']:.2f}x faster (window loop "
              f"{off['wall_barrier_s'] / auto['wall_barrier_s']:.2f}x); loop (deferred, no vmap) "
              f"{loop['wall_time_s']:.2f} s: {off['wall_time_s'] / loop['wall_time_s']:.2f}x; least CPU: off "
              f"{min(s['cpu_s'] for s in res['off']):.1f} s, loop {min(s['cpu_s'] for s in res['loop']):.1f} s, "
              f"auto {min(s['cpu_s'] for s in res['auto']):.1f} s; auto's batches: mean "
              f"{cb['mean_batch']:.2f}, "
              f"largest {cb['largest_batch']}, {share:.0%} of tasks by vmap, overlap {cb['overlap']}; "
              f"load average {load_average()}")
        if "loop+thread" in res:
            th = min(res["loop+thread"], key=lambda s: s["wall_time_s"])
            print(f"  loop with a background thread (compute.overlap=true) {th['wall_time_s']:.2f} s: "
                  f"{off['wall_time_s'] / th['wall_time_s']:.2f}x off, {loop['wall_time_s'] / th['wall_time_s']:.2f}x "
                  f"loop without it; least CPU {min(s['cpu_s'] for s in res['loop+thread']):.1f} s")


if __name__ == "__main__":
    main()

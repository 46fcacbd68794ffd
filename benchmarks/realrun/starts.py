#!/usr/bin/env python3
"""When each testbed rank leaves torch.distributed's start-up, and when it first sends or receives.

  chrt -r 5 python benchmarks/realrun/starts.py --scenario ps_sync --workers 4 --latency-ms 1 \
      --rate-mbit 100 --model-bytes 1MB --steps 4 --runs 3 --out starts.jsonl

Runs realrun's own worker code, unchanged, with a ``sitecustomize`` module on the workers' PYTHONPATH that
wraps ``torch.distributed``'s ``init_process_group``, ``barrier``, ``send``, ``recv``, ``isend``, ``irecv``
and ``all_reduce`` and notes CLOCK_MONOTONIC (one clock for every namespace of the machine) as each of the
first calls enters and returns. Each run appends one JSON line: the point, realrun's median step, and per
rank its events ``[name, enter_ns, return_ns]`` relative to the moment the last rank entered the start-up
barrier, in call order. A wrapper costs a few microseconds per call, and only the first calls are noted.

  python benchmarks/realrun/starts.py --compare benchmarks/data/lab/starts.jsonl [more files]

compares those records with the model ``lockstep validate`` starts the ranks with: per record the largest
error of a rank's first operation (ms, after the first rank's), for the barrier alone (``barrier_exits``) and
for the barrier and the setup on the testbed's two cores (``controller.validate.testbed_starts``, the mean over
five keyed orders), then the mean of each over the records (docs/benchmarks.md, "The start-up on two cores").
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from capture import add_point_arguments, realrun, realrun_args  # noqa: E402  (capture finds ../shared/realrun)

SITECUSTOMIZE = r'''
import atexit, json, os, time
_dir = os.environ.get("LOCKSTEP_STARTS_DIR")
if _dir:
    import torch.distributed as _dist
    _events, _limit = [], int(os.environ.get("LOCKSTEP_STARTS_CALLS", "24"))

    def _wrap(name):
        inner = getattr(_dist, name)

        def wrapped(*args, **kwargs):
            if len(_events) >= _limit:
                return inner(*args, **kwargs)
            t0 = time.monotonic_ns()
            out = inner(*args, **kwargs)
            peer = kwargs.get("dst", kwargs.get("src"))
            _events.append([name, t0, time.monotonic_ns(), peer])
            return out
        setattr(_dist, name, wrapped)

    for _name in ("init_process_group", "barrier", "send", "recv", "isend", "irecv", "all_reduce"):
        _wrap(_name)

    @atexit.register
    def _dump():
        with open(os.path.join(_dir, "rank%s.json" % os.environ.get("RANK", "x")), "w") as f:
            json.dump(_events, f)
'''


def compare(paths: list[str], seeds: int = 5) -> None:
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
    from agents.sim.tcp import TcpSpec
    from agents.strategies.collective import barrier_exits
    from controller.results import Point
    from controller.validate import testbed_ps_start, testbed_starts

    def rel(v: list[float]) -> list[float]:
        return [x - min(v) for x in v]

    def err(measured: list[float], v: list[float]) -> float:
        """The largest error of a rank's first operation, each after the first rank's."""
        return max(abs(a - b) for a, b in zip(rel(measured), rel(v)))

    alone, model = [], []
    for path in paths:
        for text in open(path):
            r = json.loads(text)
            p = Point(r["scenario"], r["K"], r["L_ms"] / 1e3, r["B_mbit"] * 1e6, r["M_bytes"],
                      r.get("C_ms", 20.0) / 1e3, r["median_s"])
            measured = []
            for ev in r["ranks"]:
                barrier = next(e for e in ev if e[0] == "barrier")
                first = next(e for e in ev if e[1] > barrier[2] and e[0] != "barrier")[1]
                measured.append((first - (p.C_s * 1e9 if p.scenario == "ring" else 0)) / 1e6)
            one_way = round(p.L_s * 1e9) + TcpSpec().host_latency_ns
            ps_late = testbed_ps_start(p) * 1e3 if p.scenario == "ps_async" else 0.0  # the PS's start_after
            base = [t / 1e6 for t in barrier_exits(len(measured), one_way)]
            base[0] += ps_late
            errs = []
            for seed in range(seeds):
                starts = [t / 1e6 for t in testbed_starts(p, one_way, seed)]
                starts[0] += ps_late
                errs.append(err(measured, starts))
            alone.append(err(measured, base))
            model.append(sum(errs) / len(errs))
            print(f"{p.scenario:8} K={p.K} L={r['L_ms']:g} ms M={p.M_bytes / 1e6:g} MB {r.get('priority', '')}: "
                  f"measured {' '.join(f'{x:.1f}' for x in rel(measured))}; largest error: barrier alone "
                  f"{alone[-1]:.1f} ms, on two cores {model[-1]:.1f} ms")
    print(f"{len(alone)} records: mean largest error, barrier alone {sum(alone) / len(alone):.1f} ms, "
          f"on two cores {sum(model) / len(model):.1f} ms")


def main() -> int:
    if sys.argv[1:2] == ["--compare"]:
        compare(sys.argv[2:])
        return 0
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_point_arguments(p, warmup=1)
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--out", required=True, help="JSON-lines file to append to")
    a = p.parse_args()
    rr_args = realrun_args(a)
    pythonpath = os.environ.get("PYTHONPATH", "")
    for run in range(a.runs):
        tmp = tempfile.mkdtemp(prefix="lockstep-starts-")
        try:
            with open(os.path.join(tmp, "sitecustomize.py"), "w") as f:
                f.write(SITECUSTOMIZE)
            os.environ["LOCKSTEP_STARTS_DIR"] = tmp
            os.environ["PYTHONPATH"] = tmp + os.pathsep + pythonpath
            rec = realrun.run_one(rr_args, verbose=False)
            world = rec["K"] if a.scenario == "ring" else rec["K"] + 1
            ranks = [json.load(open(os.path.join(tmp, f"rank{r}.json"))) for r in range(world)]
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        entered = [next(e[1] for e in ev if e[0] == "barrier") for ev in ranks]
        t0 = max(entered)
        out = {"scenario": a.scenario, "K": rec["K"], "L_ms": rec["L_ms"], "B_mbit": rec["B_mbit"],
               "M_bytes": rec["M_bytes"], "median_s": rec["median_s"],
               "ranks": [[[n, e0 - t0, e1 - t0, peer] for n, e0, e1, peer in ev] for ev in ranks]}
        with open(a.out, "a") as f:
            f.write(json.dumps(out) + "\n")
        exits = [next(e[2] for e in ev if e[0] == "barrier") - t0 for ev in ranks]
        last = [ev.index(next(e for e in ev if e[0] == "barrier")) for ev in ranks]
        print(f"run {run}: median {rec['median_s'] * 1e3:.1f} ms; barrier entered (ms) "
              + " ".join(f"{(e - t0) / 1e6:+.2f}" for e in entered)
              + "; left " + " ".join(f"{x / 1e6:+.2f}" for x in exits)
              + "; first call after it " + " ".join(
                  f"{ranks[r][last[r] + 1][0]}@{(ranks[r][last[r] + 1][1] - t0) / 1e6:+.2f}"
                  if last[r] + 1 < len(ranks[r]) else "-" for r in range(world)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

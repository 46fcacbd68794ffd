"""`lockstep predict` (issue 14): how fast it answers, and how close it comes to the emulation.

1. Time of `predict()` (every coarse model and Algorithm 2.1 where its event budget allows) for
   1 to 10 000 workers of the default CNN (target: under 1 s at 10 000 workers).
2. --table: the async-PS sweep of 1-64 workers (MLP, compute=constant, batch 16, 1 Gbit/s, 100 us,
   the network=ideal disciplines fifo and fair): the emulated updates/s and each model's error
   (the paper reports 2.5-5.8 % mean errors for its models against real clusters).
   --jitter S gives every compute call a keyed log-normal factor (sigma S): random service times.
Run: .venv/bin/python benchmarks/bench_predict.py [--table [--jitter S]] [--no-speed]
"""
from __future__ import annotations

import argparse
import csv
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from controller.config import load  # noqa: E402
from controller.predict import inputs_of, predict  # noqa: E402
from controller.run import execute  # noqa: E402

QUIET = ["progress=false", "launcher=inprocess", "trace.mode=off", "statelog.enabled=false", "eval.every=0"]


def speed() -> None:
    for strategy in ("ps_async", "ps_sync", "ring_allreduce"):
        for k in (1, 64, 1000, 10000):
            rc = load(["compute=constant", f"strategy={strategy}", f"workers={k}", *QUIET], check_data=False)
            inp = inputs_of(rc)
            t0 = time.perf_counter()
            out = predict(inp)
            dt = time.perf_counter() - t0
            fine = [m for m in out["models"] if m["model"].startswith("finegrained")]
            note = ", ".join(f"{m['model']}: " + ("skipped" if "skipped" in m else f"{m.get('events', '-')} events")
                             for m in fine)
            print(f"predict {strategy:15} K={k:6}: {dt * 1e3:8.1f} ms (coarse {out['coarse_s'] * 1e3:.1f} ms; {note})",
                  flush=True)


def table(jitter: float = 0.0) -> None:
    models = ("async_ps_mva_fcfs", "async_ps_mva_ps", "async_ps_hybrid", "finegrained_fcfs", "finegrained_ps")
    print("| discipline | K | emulated updates/s | " + " | ".join(models) + " |")
    print("|---|---|---|" + "---|" * len(models))
    errors: dict[tuple[str, str], list[float]] = {}
    for disc in ("fifo", "fair"):
        for k in (1, 2, 4, 8, 16, 32, 64):
            ov = ["model=mlp", "compute=constant", "network=ideal", "strategy=ps_async", f"workers={k}",
                  f"network.discipline={disc}", f"stop.updates={20 * k + 40}", f"compute.jitter={jitter}", *QUIET]
            rc = load(ov, check_data=False)
            with tempfile.TemporaryDirectory() as d:
                execute(rc, Path(d))
                with open(Path(d) / "metrics.csv", newline="") as f:
                    t = [int(r["virtual_time_ns"]) for r in csv.DictReader(f)]
            s = len(t) // 4  # a quarter of the updates is warm-up
            emu = (len(t) - s) / ((t[-1] - t[s - 1]) / 1e9)
            pred = {m["model"]: m.get("updates_per_s") for m in predict(inputs_of(rc))["models"]}
            cells = []
            for m in models:
                e = (pred[m] - emu) / emu * 100
                errors.setdefault((disc, m), []).append(abs(e))
                cells.append(f"{pred[m]:.1f} ({e:+.1f} %)")
            print(f"| {disc} | {k} | {emu:.1f} | " + " | ".join(cells) + " |", flush=True)
    for disc in ("fifo", "fair"):
        print(f"| {disc} | mean abs. error | | " + " | ".join(
            f"{sum(errors[(disc, m)]) / len(errors[(disc, m)]):.1f} %" for m in models) + " |")


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--table", action="store_true")
    p.add_argument("--jitter", type=float, default=0.0, help="compute.jitter of the table's runs (sigma of a "
                   "keyed log-normal factor per call): random service times, as the MVA assumes")
    p.add_argument("--no-speed", action="store_true")
    a = p.parse_args()
    if not a.no_speed:
        speed()
    if a.table:
        table(a.jitter)

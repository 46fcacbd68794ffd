"""``lockstep validate --jobs J`` against one process: the same points and seeds, wall time and identical rows.

Emulates the calibration file's PS points (``../shared/realrun/calibration.jsonl``, or the copy in
benchmarks/data) with SEEDS seeds, once with ``--jobs 1`` and once with ``--jobs J``, each in a fresh
``lockstep validate`` process, and prints both wall times, their ratio and whether the rows are identical.
See docs/benchmarks.md ("Validating in parallel").
usage: python benchmarks/bench_validate_jobs.py [SEEDS] [J]
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time

from _common import ROOT, load_average


def validate(results: str, seeds: int, jobs: int, out: str) -> tuple[float, list]:
    cmd = [sys.executable, "-m", "controller.cli", "validate", results, "network=tcp", "strategy.collective=gloo",
           "--only", "ps_sync,ps_async", "--seeds", str(seeds), "--jobs", str(jobs), "--json", "--out", out]
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    return time.perf_counter() - t, json.loads(r.stdout)["rows"]


def main() -> None:
    seeds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    jobs = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    shared = ROOT.parent / "shared" / "realrun" / "calibration.jsonl"
    results = str(shared if shared.is_file() else ROOT / "benchmarks" / "data" / "realrun-calibration.jsonl")
    print(f"load average before: {load_average()}")
    with tempfile.TemporaryDirectory() as out:
        one_s, one = validate(results, seeds, 1, out)
        par_s, par = validate(results, seeds, jobs, out)
    print(f"{len(one)} points x {seeds} seeds: --jobs 1 {one_s:.1f} s, --jobs {jobs} {par_s:.1f} s, "
          f"ratio {one_s / par_s:.2f}x; rows identical: {one == par}")
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()

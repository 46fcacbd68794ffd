"""Loading Fashion-MNIST in a fresh process: decoding the IDX files against mapping the decoded cache.

Each side runs in a fresh process (interleaved, best and median of REPEATS): ``decode`` with
``LOCKSTEP_DATA_CACHE=off`` (gunzip, parse, normalise: what every process paid before the cache),
``cached`` with a private cache directory that the first, untimed, load fills. Times are of
``load_fashion_mnist()`` alone, torch already imported. See docs/workloads.md ("Across processes").
usage: python benchmarks/bench_data.py [REPEATS]
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile

from _common import ROOT, load_average

CODE = ("import time, torch; from agents.workloads.data import load_fashion_mnist; "
        "t = time.perf_counter(); load_fashion_mnist(); print(time.perf_counter() - t)")


def load_s(cache: str) -> float:
    env = {**os.environ, "LOCKSTEP_DATA_CACHE": cache, "PYTHONPATH": str(ROOT)}
    return float(subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True,
                                check=True).stdout)


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    with tempfile.TemporaryDirectory() as d:
        load_s(d)  # fills the cache
        times: dict[str, list[float]] = {"decode": [], "cached": []}
        for _ in range(repeats):
            times["decode"].append(load_s("off"))
            times["cached"].append(load_s(d))
    dec, cac = times["decode"], times["cached"]
    print(f"bench_data: load_fashion_mnist() in a fresh process, {repeats} each: decode best {min(dec):.3f} s "
          f"(median {statistics.median(dec):.3f}), cached best {min(cac):.3f} s (median "
          f"{statistics.median(cac):.3f}): {statistics.median(dec) / statistics.median(cac):.0f}x; "
          f"load average {load_average()}")


if __name__ == "__main__":
    main()

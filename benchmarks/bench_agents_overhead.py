"""Overhead of the 64-worker default experiment (ps_async, cnn) with agents=2 local vs launcher=inprocess.

Prints both wall times (whole run, including agent start-up) and the window-loop time, and their ratios
(target <= 1.15). usage: python benchmarks/bench_agents_overhead.py [UPDATES]
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path


def main() -> None:
    from _common import run

    updates = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    over = [f"stop.updates={updates}"]
    with tempfile.TemporaryDirectory() as d:
        base = run(Path(d) / "inprocess", over + ["agents=1"], local=False).summary
        two = run(Path(d) / "local", over + ["agents=2"], local=True).summary
    print(f"bench_agents_overhead: 64 workers ps_async cnn, {updates} updates: inprocess {base['wall_time_s']:.2f} s "
          f"(loop {base['barrier_wall_s']:.2f} s); agents=2 local {two['wall_time_s']:.2f} s "
          f"(loop {two['barrier_wall_s']:.2f} s); ratio whole run {two['wall_time_s'] / base['wall_time_s']:.2f}, "
          f"window loop {two['barrier_wall_s'] / base['barrier_wall_s']:.2f} (target <= 1.15)")


if __name__ == "__main__":
    main()

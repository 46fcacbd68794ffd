"""Kernel.first_output (the output bound every agent computes once per window) against a scan of the whole
queue, its code before it walked the heap as a tree (docs/distributed.md, "Output bound").

It runs ``lockstep run`` in this process with the given overrides (``launcher=inprocess agents=N``: the same
kernels and windows as agent processes); every call of ``first_output`` runs both, checks they agree (bound and
event), and adds up the time of each. It prints the calls, the mean queue length, the mean time per call of
each, and their ratio.
usage: python benchmarks/bench_output_bound.py run launcher=inprocess agents=4 stop.updates=3000 [k=v ...]
"""
from __future__ import annotations

import sys
import time

import agents.sim.kernel as kernel_mod

_walk = kernel_mod.Kernel.first_output
_totals = {"scan_s": 0.0, "walk_s": 0.0, "calls": 0, "queued": 0}


def _scan(k: kernel_mod.Kernel) -> tuple:
    """The scan of every queued event, as ``first_output`` computed it before (the baseline)."""
    best, first = kernel_mod.INFINITY, (None, None)
    effects = k._effects
    for t, _, fn, arg in k._heap:
        if t >= best or (fn is kernel_mod._fire and arg.cancelled):
            continue
        f = effects.get(fn) if effects and fn is not None else None
        b = t if f is None else f(arg, t)
        if b < best:
            best, first = b, (fn, arg)
    if k._stop_at is not None and best > k._stop_at:
        return kernel_mod.INFINITY, None, None
    return best, *first


def _both(k: kernel_mod.Kernel) -> tuple:
    clock = time.perf_counter
    t0 = clock()
    old = _scan(k)
    t1 = clock()
    new = _walk(k)
    t2 = clock()
    if old[0] != new[0] or old[1] is not new[1] or old[2] is not new[2]:
        raise AssertionError(f"the walk found {new}, the scan {old}")
    _totals["scan_s"] += t1 - t0
    _totals["walk_s"] += t2 - t1
    _totals["calls"] += 1
    _totals["queued"] += len(k._heap)
    return new


def main() -> int:
    kernel_mod.Kernel.first_output = _both
    from controller.cli import main as lockstep

    rc = lockstep(sys.argv[1:])
    n = max(1, _totals["calls"])
    scan_us, walk_us = 1e6 * _totals["scan_s"] / n, 1e6 * _totals["walk_s"] / n
    print(f"bench_output_bound: {_totals['calls']} calls, {_totals['queued'] / n:.1f} queued events on average; "
          f"scan {scan_us:.2f} us a call, walk {walk_us:.2f} us ({scan_us / max(walk_us, 1e-9):.2f}x faster); "
          f"in all {_totals['scan_s']:.3f} s against {_totals['walk_s']:.3f} s")
    return rc


if __name__ == "__main__":
    sys.exit(main())

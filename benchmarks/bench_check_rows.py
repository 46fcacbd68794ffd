"""The controller's check of the rows an agent sends (controller/checks.py), against the run's size.

Every ``Reached`` an agent sends carries its rows since the last one: metrics rows, state-log records,
trace records. The controller checks each against the plan before it writes anything (docs/security.md).
Until 2026-11-30 ``Plan.names`` built the list of every vworker's name on each access, and the check
took it (and a set of it, for a state-log record naming a worker) once per row, so a row cost O(vworkers).
This prints the time per row of ``check_rows`` for a plan of 64 and of 10 000 vworkers, the plan's names
built once (``Plan.names`` now) and on every access (the code before, the baseline), and the ratios.

usage: python benchmarks/bench_check_rows.py [rows] [repeats]
"""
from __future__ import annotations

import sys
import time

from _common import ROOT  # noqa: F401  (puts the repository first on sys.path)

from agents.common.plan import Plan
from controller.checks import check_rows
from controller.config import load
from controller.plan import make_plan


class _Rebuilt(Plan):
    """The plan as it was: its names built on every access (the baseline)."""

    @property
    def names(self) -> list[str]:  # type: ignore[override]
        return [v.name for v in self.vworkers]

    @property
    def name_set(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset(self.names)


def _rows(plan: Plan, agent: int, n: int) -> tuple[list, list, list]:
    """``n`` update rows and 2n state-log records of the default experiment's shapes, for ``agent``'s vworkers."""
    server = plan.result  # the PS
    hosted = [v for v, a in enumerate(plan.placement) if a == agent and plan.names[v] != server]
    updates, events = [], []
    for i in range(n):
        v, t = hosted[i % len(hosted)], 1_000_000 * (i + 1)
        name = plan.names[v]
        updates.append(((t, v, i), (t, 2.3, name, i, 1.0, 1, 32, 177_000, 0.5)))
        events.append(((t, v, 2 * i), "state.model", name, {"server": server, "version": i}))
        events.append(((t, v, 2 * i + 1), "state.result", name,
                       {"worker": name, "version": i, "sent_ns": t - 10, "delivered_ns": t, "loss": 2.3,
                        "staleness": 1, "applied_version": i + 1}))
    return updates, [], events


def _per_row_us(plan: Plan, rows: tuple, repeats: int) -> float:
    best = float("inf")
    n = len(rows[0]) + len(rows[2])
    for _ in range(repeats):
        t0 = time.perf_counter()
        check_rows(plan, 1, *rows, 1 << 30)
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def main(argv: list[str]) -> None:
    n = int(argv[0]) if argv else 300
    repeats = int(argv[1]) if len(argv) > 1 else 5
    print(f"bench_check_rows: {n} update rows and {2 * n} state-log records per check, best of {repeats}")
    got = {}
    for workers in (64, 10_000):
        plan = make_plan(load([f"workers={workers}", "batch_size=4", "agents=2", "launcher=local"]), run_id="bench")
        old = _Rebuilt(**{f: getattr(plan, f) for f in plan.__dataclass_fields__})
        rows = _rows(plan, 1, n)
        new_us, old_us = _per_row_us(plan, rows, repeats), _per_row_us(old, rows, repeats)
        got[workers] = new_us
        print(f"  {workers:>6} vworkers: names built once {new_us:7.2f} us a row; "
              f"on every access (before) {old_us:8.2f} us a row; ratio {old_us / new_us:6.1f}x")
    print(f"  a row at 10 000 vworkers against one at 64, names built once: {got[10_000] / got[64]:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Run a composed config in this process and keep the agent objects, to look inside vworkers afterwards.

Shared by tests/strategies and tests/experiments (their conftest re-exports the ``run`` fixture).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from controller.config import load
from controller.plan import make_plan
from controller.run import build_inprocess, execute
from tests import helpers

# the one base list (tests/helpers.py), plus what strategy tests want: a small test set for the final
# evaluation and a latency every message pays, so exchanges interleave as on a real network
FAST = [*helpers.FAST, "eval.samples=200", "network.latency=1ms"]


class Ran:
    def __init__(self, result, handles):
        self.result, self.handles = result, handles
        self.summary = result.summary
        self.params = result.params

    def worker(self, name: str):
        for h in self.handles:
            w = h.core.workers.get(name)
            if w is not None:
                return w
        raise KeyError(name)

    def rows(self, name: str = "metrics.csv") -> list[dict[str, str]]:
        import csv

        with open(self.result.run_dir / name, newline="") as f:
            return list(csv.DictReader(f))


def run_config(tmp: Path, overrides: list[str], fast: bool = True) -> Ran:
    rc = load((FAST if fast else []) + overrides)
    handles = build_inprocess(make_plan(rc))
    return Ran(execute(rc, Path(tmp), handles=handles), handles)


@pytest.fixture
def run(tmp_path):
    n = iter(range(1000))
    return lambda overrides, fast=True: run_config(tmp_path / f"run{next(n)}", overrides, fast)

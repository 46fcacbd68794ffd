"""A resumed run stopped (SIGINT, SIGTERM) before its replay caught up keeps every row on disk, and its
summary.json counts them: it said where the replay had got to (updates 437, metrics.csv 677 rows).

In process, launcher=inprocess: the stop is the signal module's request, raised at the window it is checked
in (controller.signals.check), as a real SIGINT is."""
from __future__ import annotations

import json
import signal

import pytest

from controller import signals
from controller.outputs import read_csv
from controller.config import load
from controller.run import execute
from tests.helpers import run

RUN = ["workers=3", "agents=2", "stop.updates=90", "eval.every=30"]  # 343 windows (one agent: one)


def _stop_at_check(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    calls = {"n": 0}

    def check() -> None:
        calls["n"] += 1
        if calls["n"] >= n:
            raise signals.Stopped(signal.SIGINT)

    monkeypatch.setattr(signals, "check", check)


def test_a_resume_stopped_mid_replay_keeps_the_rows_and_its_summary_counts_them(tmp_path, monkeypatch):
    d = tmp_path / "run"
    run(d, RUN)
    whole = json.loads((d / "summary.json").read_text())
    (d / "summary.json").unlink()  # as if the controller had died at the end
    rows, evals = read_csv(d / "metrics.csv"), read_csv(d / "eval.csv")
    assert len(rows) == 90

    _stop_at_check(monkeypatch, 100)  # some windows into the replay
    rc = load(["model=mlp", "compute=constant", "network=ideal", "eval.every=0", "progress=false",
               "launcher=inprocess", *RUN])
    with pytest.raises(signals.Stopped):  # raised again once the outputs are final (the CLI exits 130)
        execute(rc, d, resume=True)
    s = json.loads((d / "summary.json").read_text())
    assert (s["complete"], s["signal"]) == (False, "SIGINT")
    assert read_csv(d / "metrics.csv") == rows and read_csv(d / "eval.csv") == evals  # nothing lost
    assert s["updates"] == len(rows) == whole["updates"]  # it said where the replay had got to
    assert s["samples"] == sum(int(r["samples"]) for r in rows) == whole["samples"]
    assert s["final_loss"] == float(rows[-1]["loss"]) == whole["final_loss"]
    assert s["test_accuracy"] == float(evals[-1]["test_accuracy"])
    assert s["virtual_time_ns"] >= int(rows[-1]["virtual_time_ns"])

"""What a run with agent processes leaves in ``metrics.prom`` and ``metrics-agent-N.prom``: the final values
equal the run's outputs (no Prometheus needed: the files are the expositions the endpoints served last).

Found by running the CLI as a user does: with direct windows (the default with agent processes) the last
report starts at INFINITY, which set the controller's clock to 9.2e9 s; ``metrics.per_worker=true`` exposed
no per-vworker sample at all; the speed ratio stayed 0 until the end.
"""
from __future__ import annotations

import csv
import json
import math
import signal
import time
import urllib.request
from collections import Counter, defaultdict

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from agents.observe.metrics import Metrics
from controller.clock import Window
from controller.observe import TARGETS_DIR_ENV
from controller.run import _Collector

from . import runs

pytestmark = [pytest.mark.integration]


def samples(path) -> list:
    return [s for fam in text_string_to_metric_families(path.read_text()) for s in fam.samples]


def one(ss: list, name: str, **labels: str) -> float:
    got = [s.value for s in ss if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(got) == 1, (name, labels, got)
    return got[0]


def test_an_agents_run_writes_its_final_clock_per_worker_series_and_run_info(tmp_path):
    d = runs.run(tmp_path / "run", "launcher=local", "agents=2", "workers=4", "stop.updates=200", "eval.every=100",
                 "metrics.port=0", "metrics.per_worker=true", "trace.mode=off", timeout_s=300)
    summary = json.loads((d / "summary.json").read_text())
    ctl = samples(d / "metrics.prom")
    assert one(ctl, "lockstep_virtual_time_seconds") == summary["virtual_time_ns"] / 1e9
    assert one(ctl, "lockstep_speed_ratio") == summary["speed_ratio"]
    info = next(s.labels for s in ctl if s.name == "lockstep_run_info")
    assert (info["launcher"], info["windows"], info["agents"], info["workers"]) == ("local", "direct", "2", "4")

    rows = list(csv.DictReader((d / "metrics.csv").open()))
    assert len(rows) == summary["updates"] == 200
    by_worker = Counter(r["vworker"] for r in rows)
    last_loss = {r["vworker"]: float(r["loss"]) for r in rows}  # metrics.csv is in the order updates count
    assert {s.labels["vworker"]: s.value for s in ctl if s.name == "lockstep_worker_updates_total"} == by_worker
    assert {s.labels["vworker"]: s.value for s in ctl if s.name == "lockstep_worker_training_loss"} == \
        pytest.approx(last_loss, rel=1e-6)  # the CSV prints the loss rounded

    plan = json.loads((d / "plan.json").read_text())
    hosts = defaultdict(set)
    for v, a in zip(plan["vworkers"], plan["placement"]):
        hosts[a].add(v["name"])
    for a in (0, 1):
        ss = samples(d / f"metrics-agent-{a}.prom")
        per = defaultdict(float)
        for s in ss:
            if s.name == "lockstep_worker_compute_seconds_total":
                assert s.labels["vworker"] in hosts[a], s
                per[s.labels["kind"]] += s.value
        trainers = {n for n in hosts[a] if n.startswith("w")}
        assert {s.labels["vworker"] for s in ss if s.name == "lockstep_worker_compute_seconds_total"
                and s.labels["kind"] == "gradient"} == trainers
        for kind, total in per.items():  # the per-vworker series add up to the agent's totals by kind
            assert total == pytest.approx(one(ss, "lockstep_compute_seconds_total", kind=kind), rel=1e-9, abs=1e-12)


def test_the_speed_ratio_is_live_and_a_last_report_at_infinity_leaves_the_clock_alone():
    reg = CollectorRegistry()
    m = Metrics(reg, role="controller")
    col = _Collector(None, None, m, wall0=time.perf_counter() - 2.0)  # the run started 2 wall s ago
    col.on_window(Window(start=3 * 10**9, reached=[], stop_time=None, barrier_wall_s=0.01, next_start=3 * 10**9,
                         count=40))
    ratio = reg.get_sample_value("lockstep_speed_ratio", {})
    assert 1.0 < ratio <= 1.5  # 3 virtual s in a little more than 2 wall s
    col.on_window(Window(start=2**63 - 1, reached=[], stop_time=None, barrier_wall_s=0.0, next_start=2**63 - 1,
                         count=1))  # direct windows: no agent has an event left
    assert reg.get_sample_value("lockstep_virtual_time_seconds", {}) == 3.0
    assert math.isfinite(reg.get_sample_value("lockstep_speed_ratio", {}))


def test_a_window_reported_past_the_stop_moves_the_clock_only_to_the_stop():
    """Direct windows run past the stop: an agent learns it from a peer's report, so the slowest agent's
    frontier (the window's start) may already be later; the clock stops where summary.json does."""
    reg = CollectorRegistry()
    m = Metrics(reg, role="controller")
    col = _Collector(None, None, m)
    col.on_window(Window(start=2_000_000_000, reached=[], stop_time=None, barrier_wall_s=0.0,
                         next_start=2_000_000_000, count=1))
    col.on_window(Window(start=2_221_953_554, reached=[], stop_time=2_221_922_178, barrier_wall_s=0.0,
                         next_start=2_221_953_554, count=1))
    assert reg.get_sample_value("lockstep_virtual_time_seconds", {}) == 2.221922178


@pytest.mark.slow
@pytest.mark.parametrize("strategy,workers,updates", [("ps_async", 16, 100), ("ring_allreduce", 4, 40)])
def test_the_final_clock_of_an_agents_run_with_direct_windows_is_summary_virtual_time(tmp_path, monkeypatch, strategy,
                                                                                       workers, updates):
    """Found by a user: 8.577733602 s in metrics.prom for a run whose summary.json said 8.568262362 s (these
    smaller runs, a few wall s each, ended at 0.673200843 s for 0.673004011 s and 0.859443013 s for 0.859086701 s)."""
    d = tmp_path / "run"
    monkeypatch.setenv(TARGETS_DIR_ENV, str(tmp_path / "targets"))  # not the home directory's
    proc = runs.start(d, "launcher=local", "agents=2", f"strategy={strategy}", f"workers={workers}",
                      f"stop.updates={updates}", "eval.every=0",
                      "metrics.port=0", "metrics.linger_s=300", "trace.mode=off")
    try:
        runs.poll("the run finished", (d / "metrics.prom").exists, 300, proc)  # written before the linger
        summary = json.loads((d / "summary.json").read_text())
        assert (summary["stopped_by"], summary["updates"]) == ("updates", updates)
        address = json.loads((d / "endpoints.json").read_text())["controller"]
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
            served = [s for fam in text_string_to_metric_families(r.read().decode()) for s in fam.samples]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # ends the linger; the run has written everything
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    info = next(s.labels for s in samples(d / "metrics.prom") if s.name == "lockstep_run_info")
    assert (info["launcher"], info["windows"]) == ("local", "direct")
    assert one(samples(d / "metrics.prom"), "lockstep_virtual_time_seconds") == summary["virtual_time_s"]
    assert one(served, "lockstep_virtual_time_seconds") == summary["virtual_time_s"]


def test_a_ring_records_every_update_by_w0_and_its_evaluations_are_no_compute_kind(tmp_path):
    """docs/observability.md said the per-vworker updates came from each worker of a ring, and listed ``eval``
    among the compute kinds: one vworker records every update (docs/strategies.md), and an evaluation is an
    observer outside virtual time, charged nothing and run outside the compute model."""
    d = runs.run(tmp_path / "run", "strategy=ring_allreduce", "workers=4", "stop.updates=10", "eval.every=5",
                 "metrics.per_worker=true", "trace.mode=off")
    ctl = samples(d / "metrics.prom")
    assert {s.labels["vworker"]: s.value for s in ctl if s.name == "lockstep_worker_updates_total"} == {"w0": 10}
    assert [r["iteration"] for r in csv.DictReader((d / "eval.csv").open())] == ["5", "10"]  # evaluations ran
    agent = samples(d / "metrics-agent-0.prom")
    for name in ("lockstep_compute_seconds_total", "lockstep_compute_virtual_seconds_total"):
        assert {s.labels["kind"] for s in agent if s.name == name} == {"gradient", "aggregate", "update"}
    assert {s.labels["kind"] for s in agent if s.name == "lockstep_worker_compute_seconds_total"} == \
        {"gradient", "aggregate", "update"}

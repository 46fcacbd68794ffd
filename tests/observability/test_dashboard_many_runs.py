"""Two runs at once on one real Prometheus: the dashboard's run variable keeps each panel to one run.

Each run is a controller and two agents serving their own registries, listed in the run's
``prometheus-targets.json`` (labels job and run_id, as a real run writes it). They move differently
(run A one update per step, run B three), so a panel that mixed them up would show B's numbers.
"""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from agents.observe.metrics import Metrics, serve, write_scrape_targets

from . import dashboard
from .prom import has_finite_value, value

pytestmark = [pytest.mark.integration, pytest.mark.slow]

S = 1_000_000_000
TIMEOUT_S = 30.0
RUNS = {"run-a": 1, "run-b": 3}  # run id -> updates per step


@pytest.fixture
def two_runs(tmp_path):
    """Per run: (controller Metrics, [agent Metrics]), and the file_sd files listing them."""
    servers, runs, files = [], {}, []
    for run_id in RUNS:
        made = []
        for role in ("controller", "agent", "agent"):
            reg = CollectorRegistry()
            server, port = serve(reg)
            servers.append(server)
            made.append((Metrics(reg, role=role), f"127.0.0.1:{port}"))
        (ctl, ctl_addr), agents = made[0], made[1:]
        ctl.set_run_info(run_id=run_id, config_hash="h", strategy="ps_async", workers=4, agents=2)
        ctl.set_agents({"running": 2})
        runs[run_id] = (ctl, [a for a, _ in agents])
        files.append(write_scrape_targets(tmp_path / f"{run_id}.json",
                                          {"controller": [ctl_addr], "agent": [addr for _, addr in agents]},
                                          run_id=run_id))
    yield runs, files
    for server in servers:
        server.shutdown()
        server.server_close()


def _step(runs, step: int) -> None:
    for run_id, (ctl, agents) in runs.items():
        k = RUNS[run_id]
        ctl.observe_window((step + 1) * S, 0.001 * k)
        for u in range(k):
            ctl.record_update(step * S + u, loss=1.0 / (k + step), staleness=u)
        ctl.set_speed_ratio(float(k))
        ctl.set_accuracy(0.1 * k)
        for a in agents:
            a.set_virtual_time((step + 1) * S)
            a.add_events(10 * k)
            a.add_message(100 * k, remote=True)
            a.add_message(10 * k, remote=False)
            a.add_compute("gradient", 0.01 * k, 5_000_000)


def test_every_dashboard_expression_returns_only_the_chosen_runs_data_with_two_runs_going(prom_server, two_runs):
    runs, files = two_runs
    for step in range(3):
        _step(runs, step)
    prom = prom_server(file_sd=files)
    assert sorted({t["labels"]["run_id"] for t in prom.targets()}) == sorted(RUNS)
    for run_id, k in RUNS.items():
        prom.wait_for(f'lockstep_updates_total{{run_id="{run_id}"}}', TIMEOUT_S, lambda r, k=k: r and value(r) == 3 * k)
    for step in range(3, 6):  # a second scrape with moved counters: every rate() has two samples
        _step(runs, step)
    for run_id, k in RUNS.items():
        prom.wait_for(f'lockstep_updates_total{{run_id="{run_id}"}}', TIMEOUT_S, lambda r, k=k: r and value(r) == 6 * k)
        prom.wait_for(f'sum(lockstep_events_total{{run_id="{run_id}"}})', TIMEOUT_S,
                      lambda r, k=k: r and value(r) == 2 * 6 * 10 * k)

    exprs = dashboard.expressions(dashboard.load())
    for title, expr in exprs:
        everything = prom.query(dashboard.runnable(expr))
        assert has_finite_value(everything), f"panel {title!r} shows nothing for All: {expr}"
        per_run = {s["metric"]["run_id"] for s in everything if "run_id" in s["metric"]}
        assert per_run in (set(), set(RUNS)), f"panel {title!r} with All: {per_run}"
        for run_id in RUNS:
            result = prom.query(dashboard.runnable(expr, run=run_id))
            assert has_finite_value(result), f"panel {title!r} shows nothing for run {run_id}: {expr}"
            assert {s["metric"].get("run_id", run_id) for s in result} == {run_id}, (title, run_id, result)

    # the numbers are the chosen run's own, not a sum over both
    for run_id, k in RUNS.items():
        def one(title: str) -> float:
            [expr] = [e for t, e in exprs if t == title][:1]
            return value(prom.query(dashboard.runnable(expr, run=run_id)))
        assert one("Speed ratio") == float(k)
        assert one("Test accuracy") == pytest.approx(0.1 * k)
        assert one("Training loss") == 1.0 / (k + 5)
        [info] = prom.query(dashboard.runnable(dict(exprs)["Run"], run=run_id))
        assert info["metric"]["run_id"] == run_id
        agents = {s["metric"]["state"]: float(s["value"][1])
                  for s in prom.query(dashboard.runnable(dict(exprs)["Agents"], run=run_id))}
        assert agents == {"registered": 0.0, "running": 2.0, "done": 0.0, "failed": 0.0, "stopped": 0.0}
    # a run that does not exist shows nothing at all
    assert all(not prom.query(dashboard.runnable(e, run="run-c")) for _, e in exprs)

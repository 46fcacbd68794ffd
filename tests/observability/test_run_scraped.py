"""A real Prometheus scrapes a real `lockstep run`: values equal summary.json, the exposition passes
promtool, and every dashboard expression returns data.

Prometheus starts first, watching the run's ``prometheus-targets.json`` (file
service discovery), so it scrapes the run from its first second; the run keeps
serving after it ends (``metrics.linger_s``) until the test has read the final
values, then the test ends it with SIGTERM.
"""
from __future__ import annotations

import json
import signal

import pytest

from . import dashboard, runs
from .prom import has_finite_value, value
from .test_promtool import promtool_check

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TIMEOUT_S = 60.0
UPDATES = 10000


def test_prometheus_scrapes_a_real_run_and_its_final_values_equal_the_summary(prom_server, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    targets = run_dir / "prometheus-targets.json"
    prom = prom_server(file_sd=[targets])
    # long enough (about 12 wall s) that Prometheus, whose file discovery takes about 5 s, scrapes the
    # counters while they still move: the dashboard's rate() panels need two different samples
    proc = runs.start(run_dir, "workers=4", f"stop.updates={UPDATES}", "eval.every=2000", "metrics.port=0",
                      "metrics.linger_s=300", "trace.mode=off")
    try:
        def jobs() -> list[str]:
            return sorted(g["labels"]["job"] for g in json.loads(targets.read_text())) if targets.exists() else []
        runs.poll("the run lists the controller's and the agent's endpoints",
                  lambda: jobs() == ["agent", "controller"], TIMEOUT_S, proc)
        prom.wait_until_up(2, TIMEOUT_S)
        # metrics.prom is written once the final values are set, before lingering
        runs.poll("the run finished", (run_dir / "metrics.prom").exists, 180, proc)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["updates"] == UPDATES

        prom.wait_for('lockstep_updates_total{job="controller"}', TIMEOUT_S,
                      lambda r: bool(r) and value(r) == summary["updates"])
        # the last values are set together with "done", so a scrape that has "done" has them all
        prom.wait_for('lockstep_agents{state="done"}', TIMEOUT_S, lambda r: bool(r) and value(r) == 1)
        assert prom.value("lockstep_speed_ratio") == summary["speed_ratio"]
        assert prom.value('lockstep_virtual_time_seconds{job="controller"}') == summary["virtual_time_s"]
        assert prom.value("lockstep_training_loss") == summary["final_loss"]
        assert prom.value("lockstep_test_accuracy_ratio") == summary["test_accuracy"]
        assert prom.value('lockstep_run_info{job="controller"}') == 1
        assert prom.query('lockstep_run_info')[0]["metric"]["run_id"] == summary["run_id"]
        # the agent's counters add up to the run's (the agent is its own target: "done" on the controller
        # says nothing about when the agent was last scraped, so wait for its final scrape too)
        prom.wait_for('sum(lockstep_events_total{job="agent"})', TIMEOUT_S,
                      lambda r: bool(r) and value(r) == summary["events"])
        prom.wait_for('sum(lockstep_messages_total{job="agent"})', TIMEOUT_S,
                      lambda r: bool(r) and value(r) == summary["messages_local"] + summary["messages_remote"])
        assert prom.value('lockstep_agents{state="running"}') == 0

        for title, expr in dashboard.expressions(dashboard.load()):
            result = prom.wait_for(dashboard.runnable(expr), TIMEOUT_S, has_finite_value)
            assert result, f"panel {title!r}: {expr}"

        for name in ("metrics.prom", "metrics-agent-0.prom"):
            check = promtool_check((run_dir / name).read_bytes())
            assert (check.returncode, check.stdout + check.stderr) == (0, b""), name
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # ends the linger; the run has written everything
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "metrics on http://127.0.0.1:" in out

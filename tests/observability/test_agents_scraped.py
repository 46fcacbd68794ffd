"""Agent processes (``launcher=local``) serve their own /metrics: a real Prometheus finds them in the
run's ``prometheus-targets.json`` and their counters add up to ``summary.json``.

The run lingers (``metrics.linger_s``) with its agents still serving, so the final values are
scraped from the agents themselves; the test ends the linger with SIGTERM once it has read them.
"""
from __future__ import annotations

import json
import signal

import pytest

from . import runs
from .prom import value

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TIMEOUT_S = 60.0


def test_prometheus_scrapes_every_agent_process_and_their_counters_add_up_to_the_summary(prom_server, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    targets = run_dir / "prometheus-targets.json"
    prom = prom_server(file_sd=[targets])
    proc = runs.start(run_dir, "launcher=local", "agents=2", "workers=4", "stop.updates=300", "eval.every=100",
                      "metrics.port=0", "metrics.linger_s=300", "trace.mode=off")
    try:
        def agent_targets() -> list[str]:
            if not targets.exists():
                return []
            return [t for g in json.loads(targets.read_text()) if g["labels"]["job"] == "agent"
                    for t in g["targets"]]
        runs.poll("the run lists both agents' endpoints", lambda: len(agent_targets()) == 2, TIMEOUT_S, proc)
        endpoints = json.loads((run_dir / "endpoints.json").read_text())
        assert sorted(endpoints["agents"]) == ["0", "1"]
        assert sorted(endpoints["agents"].values()) == sorted(agent_targets())
        prom.wait_until_up(3, TIMEOUT_S)
        runs.poll("the run finished", (run_dir / "metrics.prom").exists, 180, proc)
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["updates"] == 300 and summary["messages_remote"] > 0

        # the agents keep serving while the run lingers: their final values reach Prometheus
        prom.wait_for('sum(lockstep_events_total{job="agent"})', TIMEOUT_S,
                      lambda r: bool(r) and value(r) == summary["events"])
        prom.wait_for('sum(lockstep_messages_total{job="agent",scope="remote"})', TIMEOUT_S,
                      lambda r: bool(r) and value(r) == summary["messages_remote"])
        per_agent = prom.query('lockstep_events_total{job="agent"}')
        assert sorted(s["metric"]["instance"] for s in per_agent) == sorted(agent_targets())
        assert all(float(s["value"][1]) > 0 for s in per_agent)
        prom.wait_for('sum(lockstep_messages_total{job="agent",scope="local"})', TIMEOUT_S,
                      lambda r: bool(r) and value(r) == summary["messages_local"])

        # each agent's final exposition came back to the controller, which wrote it into the run directory
        for a in (0, 1):
            text = (run_dir / f"metrics-agent-{a}.prom").read_text()
            events = next(float(line.split()[1]) for line in text.splitlines()
                          if line.startswith("lockstep_events_total "))
            addr = endpoints["agents"][str(a)]
            assert events == prom.value(f'lockstep_events_total{{job="agent",instance="{addr}"}}')
        assert (run_dir / "agents" / "agent-0.log").exists()
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # ends the linger; then the agents are shut down
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out

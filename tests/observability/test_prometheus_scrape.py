"""A real Prometheus scrapes served Metrics; every dashboard expression returns data.

The engine is not wired yet, so the Metrics are populated by hand here; a run's
test points ``prom_server`` at the run's endpoints instead.
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


@pytest.fixture
def endpoints():
    """A controller and two agents, each serving its own registry on a free port."""
    made = {}
    servers = []
    for name, role in (("controller", "controller"), ("agent0", "agent"), ("agent1", "agent")):
        reg = CollectorRegistry()
        server, port = serve(reg)
        servers.append(server)
        made[name] = (Metrics(reg, role=role), f"127.0.0.1:{port}")
    yield made
    for server in servers:
        server.shutdown()
        server.server_close()


def _step(ctl: Metrics, agents: list[Metrics], window: int) -> None:
    """What one window of a run would record: every family moves."""
    ctl.observe_window((window + 1) * S, 0.002 * (window + 1))
    ctl.record_update(window * S + S // 2, loss=1.0 / (window + 2), staleness=window % 3)
    ctl.set_speed_ratio(10.0 + window)
    for i, a in enumerate(agents):
        a.set_virtual_time((window + 1) * S)
        a.add_events(10 + i)
        a.add_message(4096, remote=True)
        a.add_message(512, remote=False)
        a.add_compute("gradient", 0.01, 5_000_000)
        a.add_compute("update", 0.001, 100_000)


def test_prometheus_scrapes_metrics_and_every_dashboard_expression_returns_data(
        prom_server, endpoints, tmp_path):
    ctl, ctl_addr = endpoints["controller"]
    agents = [endpoints[a][0] for a in ("agent0", "agent1")]
    ctl.set_run_info(run_id="test-run", config_hash="abc123", strategy="ps_async", workers=8, agents=2)
    ctl.set_agents({"running": 2})
    ctl.set_accuracy(0.8125)
    for w in range(3):
        _step(ctl, agents, w)

    # The controller as a static target, the agents through a file_sd file as a run writes it.
    sd = write_scrape_targets(tmp_path / "prometheus-targets.json",
                              {"agent": [endpoints["agent0"][1], endpoints["agent1"][1]]},
                              run_id="test-run")
    prom = prom_server(targets={"controller": [ctl_addr]}, file_sd=[sd])
    assert {(t["labels"]["job"], t["labels"].get("run_id")) for t in prom.targets()} == {
        ("controller", None), ("agent", "test-run")}

    # What we set is what Prometheus stored, exactly (floats travel as shortest repr).
    prom.wait_for('lockstep_updates_total{job="controller"}', TIMEOUT_S,
                  lambda r: r and value(r) == 3)
    assert prom.value('lockstep_virtual_time_seconds{job="controller"}') == 3.0
    assert prom.value("lockstep_training_loss") == 0.25
    assert prom.value("lockstep_test_accuracy_ratio") == 0.8125
    assert prom.value('sum(lockstep_events_total{job="agent", run_id="test-run"})') == 3 * (10 + 11)

    # A second scrape with moved counters gives every rate() something to work with.
    for w in range(3, 6):
        _step(ctl, agents, w)
    prom.wait_for('lockstep_updates_total{job="controller"}', TIMEOUT_S,
                  lambda r: r and value(r) == 6)
    assert prom.value('lockstep_virtual_time_seconds{job="controller"}') == 6.0
    assert prom.value("lockstep_training_loss") == 1.0 / 7

    exprs = dashboard.expressions(dashboard.load())
    assert len(exprs) >= 15
    for title, expr in exprs:
        result = prom.wait_for(dashboard.runnable(expr), TIMEOUT_S, has_finite_value)
        assert result, f"panel {title!r}: {expr}"

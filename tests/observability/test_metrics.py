"""agents.observe.metrics.Metrics: exact values, roles, cardinality, serving and writing."""
from __future__ import annotations

import json
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from agents.observe.metrics import (AGENT_STATES, STALENESS_BUCKETS, Metrics, serve, write_exposition,
                            write_scrape_targets)

S = 1_000_000_000  # ns per second


def sample(reg: CollectorRegistry, name: str, **labels: str) -> float | None:
    return reg.get_sample_value(name, labels)


def all_samples(reg: CollectorRegistry):
    return [s for fam in reg.collect() for s in fam.samples]


@pytest.fixture
def controller() -> tuple[CollectorRegistry, Metrics]:
    reg = CollectorRegistry()
    return reg, Metrics(reg, role="controller")


@pytest.fixture
def agent() -> tuple[CollectorRegistry, Metrics]:
    reg = CollectorRegistry()
    return reg, Metrics(reg, role="agent")


def test_window_sets_virtual_time_in_seconds_counts_windows_and_barrier_wait(controller):
    reg, m = controller
    m.observe_window(2_500_000_000, 0.003)
    m.observe_window(4_000_000_001, 0.2)
    assert sample(reg, "lockstep_virtual_time_seconds") == 4.000000001
    assert sample(reg, "lockstep_windows_total") == 2
    assert sample(reg, "lockstep_barrier_wait_seconds_count") == 2
    assert sample(reg, "lockstep_barrier_wait_seconds_sum") == pytest.approx(0.203)
    assert sample(reg, "lockstep_barrier_wait_seconds_bucket", le="0.0025") == 0
    assert sample(reg, "lockstep_barrier_wait_seconds_bucket", le="0.005") == 1
    assert sample(reg, "lockstep_barrier_wait_seconds_bucket", le="0.25") == 2


def test_windows_reported_together_count_each_and_observe_their_mean_wait(controller):
    reg, m = controller
    m.observe_window(S, 0.3, windows=3)  # direct windows: the agents report several windows at once
    m.observe_window(2 * S, 0.0, windows=0)  # a report with no new window: nothing to count
    assert sample(reg, "lockstep_windows_total") == 3
    assert sample(reg, "lockstep_barrier_wait_seconds_count") == 1
    assert sample(reg, "lockstep_barrier_wait_seconds_sum") == pytest.approx(0.1)
    assert sample(reg, "lockstep_virtual_time_seconds") == 2.0


def test_virtual_time_never_moves_backwards(controller):
    reg, m = controller
    m.set_virtual_time(3 * S)
    m.record_update(1 * S, loss=0.5, staleness=0)
    m.observe_window(2 * S, 0.0)
    assert sample(reg, "lockstep_virtual_time_seconds") == 3.0


def test_updates_count_and_loss_is_that_of_the_latest_update_in_virtual_time(controller):
    reg, m = controller
    m.record_update(2 * S, loss=0.75, staleness=0)
    m.record_update(1 * S, loss=2.0, staleness=3)  # arrives late from another agent
    m.record_update(2 * S + 1, loss=0.625, staleness=5)
    assert sample(reg, "lockstep_updates_total") == 3
    assert sample(reg, "lockstep_training_loss") == 0.625
    assert sample(reg, "lockstep_virtual_time_seconds") == 2.000000001


def test_staleness_histogram_has_the_documented_buckets(controller):
    reg, m = controller
    for s in (0, 0, 1, 3, 200):
        m.record_update(S, loss=1.0, staleness=s)
    les = [s.labels["le"] for s in all_samples(reg) if s.name == "lockstep_staleness_updates_bucket"]
    assert les == [str(float(b)) for b in STALENESS_BUCKETS] + ["+Inf"]
    assert sample(reg, "lockstep_staleness_updates_bucket", le="0.0") == 2
    assert sample(reg, "lockstep_staleness_updates_bucket", le="2.0") == 3
    assert sample(reg, "lockstep_staleness_updates_bucket", le="4.0") == 4
    assert sample(reg, "lockstep_staleness_updates_bucket", le="128.0") == 4
    assert sample(reg, "lockstep_staleness_updates_bucket", le="+Inf") == 5
    assert sample(reg, "lockstep_staleness_updates_sum") == 204


def test_accuracy_speed_ratio_agents_and_run_info(controller):
    reg, m = controller
    m.set_accuracy(0.875)
    m.set_speed_ratio(42.5)
    m.set_agents({"running": 3, "failed": 1})
    m.set_run_info(run_id="r-7", config_hash="c0ffee", strategy="ps_async", workers=64, agents=4)
    assert sample(reg, "lockstep_test_accuracy_ratio") == 0.875
    assert sample(reg, "lockstep_speed_ratio") == 42.5
    assert {st: sample(reg, "lockstep_agents", state=st) for st in AGENT_STATES} == {
        "registered": 0, "running": 3, "done": 0, "failed": 1, "stopped": 0}
    assert sample(reg, "lockstep_run_info", run_id="r-7", config_hash="c0ffee",
                  strategy="ps_async", workers="64", agents="4") == 1
    m.set_agents({"done": 4})  # states left out go back to 0
    assert sample(reg, "lockstep_agents", state="running") == 0
    assert sample(reg, "lockstep_agents", state="done") == 4


def test_agent_counts_events_messages_by_scope_and_compute_by_kind(agent):
    reg, m = agent
    m.add_events(7)
    m.add_events(3)
    m.add_message(1000, remote=True)
    m.add_message(24, remote=False)
    m.add_message(1, remote=True)
    m.add_compute("gradient", 0.25, 12_000_000)
    m.add_compute("gradient", 0.5, 3_000_000)
    m.add_compute("update", 0.125, 500)
    m.set_virtual_time(1_500_000)
    assert sample(reg, "lockstep_events_total") == 10
    assert sample(reg, "lockstep_messages_total", scope="remote") == 2
    assert sample(reg, "lockstep_messages_total", scope="local") == 1
    assert sample(reg, "lockstep_message_bytes_total", scope="remote") == 1001
    assert sample(reg, "lockstep_message_bytes_total", scope="local") == 24
    assert sample(reg, "lockstep_compute_seconds_total", kind="gradient") == 0.75
    assert sample(reg, "lockstep_compute_seconds_total", kind="update") == 0.125
    assert sample(reg, "lockstep_compute_virtual_seconds_total", kind="gradient") == 0.015
    assert sample(reg, "lockstep_compute_virtual_seconds_total", kind="update") == 5e-7
    assert sample(reg, "lockstep_virtual_time_seconds") == 0.0015


def test_no_vworker_label_unless_per_worker_is_on():
    for role in ("controller", "agent"):
        reg = CollectorRegistry()
        _populate(Metrics(reg, role=role))
        assert [s for s in all_samples(reg) if "vworker" in s.labels] == []
        assert [f.name for f in reg.collect() if "worker_" in f.name] == []

    reg = CollectorRegistry()
    _populate(Metrics(reg, role="controller", per_worker=True))
    assert sample(reg, "lockstep_worker_updates_total", vworker="w3") == 2
    assert sample(reg, "lockstep_worker_training_loss", vworker="w3") == 0.25
    reg = CollectorRegistry()
    _populate(Metrics(reg, role="agent", per_worker=True))
    assert sample(reg, "lockstep_worker_compute_seconds_total", vworker="w3", kind="gradient") == 0.5


def test_role_decides_which_families_exist():
    names = {}
    for role in ("controller", "agent"):
        reg = CollectorRegistry()
        Metrics(reg, role=role)
        names[role] = {f.name for f in reg.collect()}
    assert names["controller"] & names["agent"] == {"lockstep_virtual_time_seconds"}
    assert {"lockstep_updates", "lockstep_training_loss", "lockstep_windows",
            "lockstep_run"} <= names["controller"]
    assert {"lockstep_events", "lockstep_messages", "lockstep_message_bytes",
            "lockstep_compute_seconds"} <= names["agent"]


def test_registering_twice_on_one_registry_raises():
    reg = CollectorRegistry()
    Metrics(reg, role="controller")
    with pytest.raises(ValueError, match="Duplicated"):
        Metrics(reg, role="controller")
    with pytest.raises(ValueError, match="Duplicated"):
        Metrics(reg, role="agent")  # lockstep_virtual_time_seconds again


def test_calling_the_other_roles_method_raises(controller, agent):
    with pytest.raises(ValueError, match="role='controller'"):
        controller[1].add_events(1)
    with pytest.raises(ValueError, match="role='agent'"):
        agent[1].record_update(0, 1.0, 0)


@pytest.mark.parametrize("call, message", [
    (lambda m: m.set_accuracy(87.5), "ratio in \\[0, 1\\]"),
    (lambda m: m.record_update(0, 1.0, -1), "staleness"),
    (lambda m: m.set_virtual_time(-1), "virtual time"),
    (lambda m: m.set_agents({"crashed": 1}), "accepted: registered, running, done, failed"),
    (lambda m: m.set_speed_ratio(float("inf")), "speed ratio"),
    (lambda m: m.observe_window(0, -0.1), "barrier wait"),
])
def test_bad_values_are_refused_with_a_sentence(controller, call, message):
    with pytest.raises(ValueError, match=message):
        call(controller[1])


def test_unknown_role_is_refused():
    with pytest.raises(ValueError, match="controller, agent"):
        Metrics(CollectorRegistry(), role="worker")  # type: ignore[arg-type]


def test_serve_picks_a_free_port_and_exposes_the_registry(controller):
    reg, m = controller
    m.record_update(12_500_000_000, loss=0.4375, staleness=1)
    server, port = serve(reg)
    server2, port2 = serve(reg)
    try:
        assert port > 0 and port2 > 0 and port != port2
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        got = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        assert got["lockstep_virtual_time_seconds"] == 12.5
        assert got["lockstep_training_loss"] == 0.4375
        assert got["lockstep_updates_total"] == 1
    finally:
        for s in (server, server2):
            s.shutdown()
            s.server_close()


def test_write_exposition_writes_the_text_format(tmp_path, agent):
    reg, m = agent
    m.add_events(5)
    path = write_exposition(reg, tmp_path / "metrics.prom")
    assert path == tmp_path / "metrics.prom"
    assert path.read_bytes() == generate_latest(reg)
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


# what Prometheus 2.42 sends: OpenMetrics first, the plain text format as a fallback
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


@pytest.mark.parametrize("role", ["controller", "agent"])
@pytest.mark.parametrize("per_worker", [False, True])
def test_no_exposition_has_a_created_series(role, per_worker):
    """prometheus_client adds ``<name>_created`` to counters and histograms; Prometheus 2 stores it as a
    series of its own (``lockstep_updates_created``), in either format. Nothing reads it: none is exposed."""
    reg = CollectorRegistry()
    _populate(Metrics(reg, role=role, per_worker=per_worker))
    server, port = serve(reg)
    try:
        req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
        with urllib.request.urlopen(req, timeout=5) as resp:
            served = resp.read().decode()
            assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
    finally:
        server.shutdown()
        server.server_close()
    # the plain text is what write_exposition writes and what an agent process sends back (agents/agent.py)
    for text in (generate_latest(reg).decode(), generate_openmetrics(reg).decode(), served):
        assert "lockstep_virtual_time_seconds" in text
        assert [line for line in text.splitlines() if "_created" in line] == []


def test_another_registry_in_the_process_keeps_its_created_series():
    """Per registry, not prometheus_client's process-wide disable_created_metrics(): an application that
    embeds lockstep keeps its own metrics as they were."""
    other = CollectorRegistry()
    Counter("requests", "Requests.", registry=other).inc()
    _populate(Metrics(CollectorRegistry(), role="controller"))
    assert other.get_sample_value("requests_created") is not None


def test_write_scrape_targets_writes_prometheus_file_sd_groups(tmp_path):
    path = write_scrape_targets(tmp_path / "prometheus-targets.json",
                                {"controller": ["127.0.0.1:9100"],
                                 "agent": ["127.0.0.1:9101", "127.0.0.1:9102"]}, run_id="r-1")
    assert json.loads(path.read_text()) == [
        {"targets": ["127.0.0.1:9100"], "labels": {"job": "controller", "run_id": "r-1"}},
        {"targets": ["127.0.0.1:9101", "127.0.0.1:9102"], "labels": {"job": "agent", "run_id": "r-1"}},
    ]
    assert path.stat().st_mode & 0o777 == 0o644


def _populate(m: Metrics) -> None:
    """Call every method of ``m``'s role, passing a vworker wherever one is accepted."""
    if m.role == "controller":
        m.set_run_info(run_id="r", config_hash="h", strategy="ps_sync", workers=4, agents=2)
        m.observe_window(S, 0.01)
        m.record_update(S, loss=0.5, staleness=0, vworker="w3")
        m.record_update(S, loss=0.25, staleness=1, vworker="w3")
        m.set_accuracy(0.5)
        m.set_speed_ratio(2.0)
        m.set_agents({"running": 2})
    else:
        m.set_virtual_time(S)
        m.add_events(3)
        m.add_message(100, remote=True)
        m.add_message(10, remote=False)
        m.add_compute("gradient", 0.5, 1000, vworker="w3")

"""Data on the network (sim4DistrDL): batches travel from end devices over the topology; totals in the outputs."""
from __future__ import annotations

import json

from tests.helpers import rows, run

EDGE = ["network.topology=tree", "data.placement=end_devices", "network.latency=0", "network.bandwidth=1e15",
        "network.links.bandwidth=125e6", "network.links.latency=100us", "batch_size=16"]


def test_a_fetch_waits_for_the_request_and_the_samples_over_the_tree_exactly(tmp_path):
    # w0 on edge0, its end device d0 on end0.0: the request crosses one 100 us link, the reply 16 x 785 B
    # at 125e6 B/s (100 480 ns) and the link again: 300 480 ns before every gradient (no cache: all misses)
    res = run(tmp_path, [*EDGE, "strategy=ps_sync", "workers=1", "stop.updates=3", "compute.gradient=0.01",
                         "compute.update=0", "compute.aggregate=0"])
    r = rows(tmp_path / "metrics.csv")
    assert [x["data_misses"] for x in r] == ["16", "32", "48"]
    assert [x["data_bytes"] for x in r] == [str(16 * 785 * i) for i in (1, 2, 3)]
    assert [round(float(x["data_wait_s"]) * 1e9) for x in r] == [300_480 * i for i in (1, 2, 3)]
    s = res.summary
    assert (s["data_cache_hits"], s["data_cache_misses"], s["data_bytes_moved"]) == (0, 48, 48 * 785)
    assert json.loads((tmp_path / "plan.json").read_text())["network"]["topology"]["node_of"] == \
        ["edge0", "cloud", "end0.0"]


def test_totals_add_up_over_workers_and_the_cache_changes_nothing_in_a_first_epoch(tmp_path):
    a = run(tmp_path / "a", [*EDGE, "strategy=ps_sync", "workers=3", "stop.updates=5", "data.cache=lru"])
    b = run(tmp_path / "b", [*EDGE, "strategy=ps_sync", "workers=3", "stop.updates=5"])
    assert a.summary["data_cache_misses"] == 5 * 3 * 16 and a.summary["data_cache_hits"] == 0
    assert a.summary["virtual_time_ns"] == b.summary["virtual_time_ns"]


def test_prometheus_and_the_trace_show_the_data_moved_and_the_wait(tmp_path):
    from tests.observability import runs

    d = runs.run(tmp_path / "run", "network=ideal", *EDGE, "strategy=ps_sync", "workers=1", "stop.updates=3",
                 "eval.every=0", "compute.gradient=0.01", "compute.update=0", "compute.aggregate=0")
    prom = (d / "metrics.prom").read_text()
    assert "lockstep_data_cache_misses_total 48.0" in prom
    assert "lockstep_data_cache_hits_total 0.0" in prom
    assert f"lockstep_data_moved_bytes_total {48 * 785}.0" in prom
    wait = next(float(line.split()[1]) for line in prom.splitlines()
                if line.startswith("lockstep_data_wait_seconds_total "))
    assert round(wait * 1e9) == 3 * 300_480
    spans = [e for e in json.loads((d / "trace.json").read_text())["traceEvents"] if e.get("name") == "data_wait"]
    assert [round(e["dur"] * 1000) for e in spans] == [300_480] * 3


def test_data_on_the_network_gives_the_same_outputs_on_one_or_two_agents(tmp_path):
    ov = ["data.placement=end_devices", "data.cache=lru", "data.cache_size=40", "data.end_devices=2",
          "strategy=ps_async", "workers=3", "stop.updates=12", "network.latency=1ms", "batch_size=8"]
    one = run(tmp_path / "one", ov)
    two = run(tmp_path / "two", [*ov, "agents=2"])
    from tests.helpers import without_wall

    assert without_wall(tmp_path / "one" / "metrics.csv") == without_wall(tmp_path / "two" / "metrics.csv")
    assert one.params.equal(two.params)
    assert one.summary["data_cache_misses"] == two.summary["data_cache_misses"] > 0

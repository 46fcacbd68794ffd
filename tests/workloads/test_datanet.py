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

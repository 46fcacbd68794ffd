"""Data on the network over real gRPC agents: the data.fetch rows reach the controller with either kind of window."""
from __future__ import annotations

import pytest

from .conftest import assert_same_outputs, run

DATA = ["data.placement=end_devices", "data.cache=lru", "data.cache_size=40", "data.end_devices=2",
        "strategy=ps_async", "workers=3", "stop.updates=12", "network.latency=1ms", "batch_size=8"]


@pytest.mark.parametrize("windows", ["hub", "direct"])
def test_data_on_the_network_over_two_local_agents_equals_one_agent(tmp_path, windows):
    one = run(tmp_path / "one", DATA + ["agents=1"])
    two = run(tmp_path / "two", DATA + ["agents=2", f"controller.windows={windows}"], local=True)
    assert_same_outputs(tmp_path / "one", tmp_path / "two")
    for key in ("data_cache_hits", "data_cache_misses", "data_bytes_moved", "data_wait_s"):
        assert two.summary[key] == one.summary[key], key
    assert one.summary["data_cache_misses"] > 0 and two.summary["messages_remote"] > 0

"""64 workers over 4 local agent processes complete and match the in-process run."""
from __future__ import annotations

from .conftest import assert_same_outputs, run


def test_64_workers_over_4_local_agents_match_the_inprocess_run(tmp_path):
    over = ["strategy=ps_async", "workers=64", "stop.updates=128", "eval.every=64", "eval.samples=500",
            "batch_size=8", "network.latency=1ms"]
    run(tmp_path / "inprocess", over + ["agents=1"])
    r = run(tmp_path / "local", over + ["agents=4", "placement=block"], local=True,
            max_message_bytes=1 << 16)  # small messages: parameters travel chunked
    assert r.summary["updates"] == 128 and r.summary["messages_remote"] > 0
    assert_same_outputs(tmp_path / "inprocess", tmp_path / "local")

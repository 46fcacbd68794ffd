"""DESIGN §5 causality over real gRPC: a message arriving exactly at a window's end, and zero latency."""
from __future__ import annotations

import csv

import pytest

from .conftest import assert_same_outputs, run

L = 1_000_000  # 1 ms, the lookahead of these runs
PROBE = ["strategy=ps_async", "strategy._target_=tests.distributed.probe.WindowEdge", "workers=1",
         "stop.updates=1000", "network.bandwidth=1Gbit/s"]


def _rows(d):
    with open(d / "metrics.csv", newline="") as f:
        return [(int(r["virtual_time_ns"]), r["vworker"], int(r["iteration"]), float(r["loss"]), int(r["staleness"]))
            for r in csv.DictReader(f)]


@pytest.mark.parametrize("agents,local", [(2, False), (2, True)])
def test_a_message_arriving_exactly_at_the_window_end_is_seen_there(tmp_path, agents, local):
    over = PROBE + ["network.latency=1ms", f"+strategy.poll_at={L}"]
    run(tmp_path / "one", over + ["agents=1"])
    r = run(tmp_path / "many", over + [f"agents={agents}", "placement=round_robin"], local=local)
    rows = _rows(tmp_path / "many")
    # b polls at exactly L, the end of the first window [0, L): the ping sent at 0 arrives at L and is there
    assert rows[0] == (L, "b", 2, float(L), 0)
    assert r.summary["windows"] >= 3 and r.summary["messages_remote"] == 6
    assert_same_outputs(tmp_path / "one", tmp_path / "many", params=False)


@pytest.mark.parametrize("local", [False, True])
def test_zero_latency_runs_instant_windows_at_the_same_virtual_times(tmp_path, local):
    over = PROBE + ["network.latency=0", "+strategy.rounds=4"]
    run(tmp_path / "one", over + ["agents=1"])
    r = run(tmp_path / "many", over + ["agents=2", "placement=round_robin"], local=local)
    rows = _rows(tmp_path / "many")
    assert len(rows) == 8
    # the first ping is sent and delivered at 0 (0 bytes, no latency): the receiver logs it at virtual time 0
    assert rows[0] == (0, "b", 3, 0.0, 0)
    assert r.summary["windows"] > 8  # single-instant windows, repeated until nothing more happens at T
    assert_same_outputs(tmp_path / "one", tmp_path / "many", params=False)


@pytest.mark.parametrize("local", [False, True])
def test_an_idle_agents_immediate_answer_stops_the_senders_window_in_time(tmp_path, local):
    # a pings b at 5.01 ms and polls every 100 us; b, idle with no event of its own, answers at once. Without the reply cap a would run ahead
    # (b has no event of its own) and the pong would land in a's past.
    over = ["strategy=ps_async", "strategy._target_=tests.distributed.probe.Reply", "workers=1",
            "network.latency=1ms", "stop.updates=1000"]
    run(tmp_path / "one", over + ["agents=1"])
    run(tmp_path / "many", over + ["agents=2", "placement=round_robin"], local=local)
    # delivered at 5.01 ms + 2 L = 7.01 ms, which is also a poll time (network events run first)
    assert _rows(tmp_path / "many") == [(7_010_000, "a", 5, 7_010_000.0, 7_010_000)]
    assert_same_outputs(tmp_path / "one", tmp_path / "many", params=False)


@pytest.mark.parametrize("discipline", ["fifo", "fair", "unlimited"])
def test_a_ping_with_bytes_is_answered_in_time_under_every_discipline(tmp_path, discipline):
    # 1000 B at 1 MB/s: b gets the ping 1 ms after its first byte, at 7.01 ms, and answers at once; the
    # pong is in at 8.01 ms. a's window rests on the ping's effect (when its bytes have crossed): one
    # that claimed later would let a run past 8.01 ms.
    over = ["strategy=ps_async", "strategy._target_=tests.distributed.probe.Reply", "+strategy.nbytes=1000",
            "workers=1", "network.latency=1ms", "network.bandwidth=8Mbit/s", f"network.discipline={discipline}",
            "stop.updates=1000"]
    run(tmp_path / "one", over + ["agents=1"])
    run(tmp_path / "many", over + ["agents=2", "placement=round_robin"])
    assert _rows(tmp_path / "many") == [(8_010_000, "a", 5, 8_010_000.0, 8_010_000)]
    assert_same_outputs(tmp_path / "one", tmp_path / "many", params=False)

"""A synchronous PS round takes exactly the throughput paper's closed forms (Eq. 7 and Eq. 8), plus 2 L."""
from __future__ import annotations

import pytest

from tests.helpers import rows, run

NS = 1_000_000_000


def _round_ns(K, M, B, T_C, T_S, L, disc):
    # Eq. 7 (processor sharing): T = K·M/B + (T_F+T_B) + K·M/B + T_S
    # Eq. 8 (FCFS):              T = K·M/B + (T_F+T_B) + M/B   + T_S
    down = K * M / B
    up = K * M / B if disc == "fair" else M / B
    return round((down + T_C + up + T_S + 2 * L) * NS)


@pytest.mark.parametrize("disc", ["fifo", "fair"])
@pytest.mark.parametrize("K", [1, 2, 4])
def test_sync_ps_round_equals_closed_form(tmp_path, disc, K):
    M = 636040  # bytes of the MLP's parameters (float32)
    B = 25e6
    T_C, T_S, L = 0.015, 0.002, 0.003
    res = run(tmp_path, [f"strategy=ps_sync", f"workers={K}", "stop.updates=3", f"network.discipline={disc}",
                         f"network.latency={L}", f"network.bandwidth={B}", f"compute.gradient={T_C}",
                         f"compute.update={T_S}", "compute.aggregate=0"])
    assert res.summary["model_bytes"] == M
    per_round = _round_ns(K, M, B, T_C, T_S, L, disc)
    times = [int(r["virtual_time_ns"]) for r in rows(tmp_path / "metrics.csv")]
    assert times == [per_round, 2 * per_round, 3 * per_round]
    assert res.summary["virtual_time_ns"] == 3 * per_round


def test_async_ps_single_worker_round_is_downlink_compute_uplink_update(tmp_path):
    # one worker: no contention, each update = M/B + L + T_C + M/B + L + T_S
    res = run(tmp_path, ["strategy=ps_async", "workers=1", "stop.updates=4", "network.latency=0.001",
                         "network.bandwidth=1e8", "compute.gradient=0.02", "compute.update=0.005"])
    M = res.summary["model_bytes"]
    step = round(M / 1e8 * NS) * 2 + 2 * 1_000_000 + 20_000_000 + 5_000_000
    assert [int(r["virtual_time_ns"]) for r in rows(tmp_path / "metrics.csv")] == [step * i for i in range(1, 5)]


def test_stop_virtual_time_stops_there(tmp_path):
    res = run(tmp_path, ["strategy=ps_sync", "workers=2", "stop.updates=null", "stop.virtual_time=0.5",
                         "network.latency=0", "network.bandwidth=1e12", "compute.gradient=0.1",
                         "compute.update=0.0", "compute.aggregate=0"])
    assert res.summary["virtual_time_s"] == 0.5
    # a round: 0.1 s of compute plus 2 × 1272 ns on the wire (Eq. 7, K = 2): a 5th update lands after 0.5 s
    step = 100_000_000 + 2 * 1272
    assert [int(r["virtual_time_ns"]) for r in rows(tmp_path / "metrics.csv")] == [step * i for i in range(1, 5)]
    assert res.summary["stopped_by"] == "virtual_time"

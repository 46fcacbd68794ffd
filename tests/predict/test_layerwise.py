"""Layer-wise overlap in emulation (compute.layerwise=true) is Algorithm 2.1 under constant per-layer compute."""
from __future__ import annotations

import pytest

from controller.config import load
from controller.predict import _trace, inputs_of
from controller.predict import finegrained as fg
from tests.helpers import FAST, rows, run

# 1 byte per ns on every NIC and no latency: transfers are whole nanoseconds, as Algorithm 2.1 assumes
BASE = ["compute.layerwise=true", "network.bandwidth=1e9", "network.latency=0", "compute.gradient=0.01",
        "compute.update=0", "compute.aggregate=0", "stop.updates=6"]


def simulated(overrides, link, mode, steps):
    inp = inputs_of(load(FAST + overrides, check_data=False))
    assert inp.layerwise and len(inp.layers) == 2  # the MLP: fc1 (628 000 B), fc2 (8 040 B)
    trace, workers = _trace(inp, link, mode)
    return [round(t) for t in fg.simulate(trace, workers, steps).update_times_ns]


def emulated(tmp_path, overrides):
    run(tmp_path, overrides)
    return [int(r["virtual_time_ns"]) for r in rows(tmp_path / "metrics.csv")]


@pytest.mark.parametrize("K", [1, 3])
def test_layerwise_sync_ps_equals_algorithm_2_1_with_ps_sharing(tmp_path, K):
    ov = [*BASE, "strategy=ps_sync", f"workers={K}", "network.discipline=fair"]
    assert emulated(tmp_path, ov) == simulated(ov, "ps", "sync", 6)


def test_layerwise_async_ps_on_fifo_links_equals_algorithm_2_1_with_fcfs(tmp_path):
    ov = [*BASE, "strategy=ps_async", "workers=1", "network.discipline=fifo"]
    assert emulated(tmp_path, ov) == simulated(ov, "fcfs", "async", 6)


@pytest.mark.parametrize("share", [0.0, 0.5])
def test_layerwise_ring_equals_algorithm_2_1_all_reduce_with_interference(tmp_path, share):
    ov = [*BASE, "strategy=ring_allreduce", "workers=2", f"compute.allreduce_share={share}"]
    assert emulated(tmp_path, ov) == simulated(ov, "all_reduce", "sync", 6)


def test_layerwise_overlap_shortens_the_step_and_keeps_the_gradients(tmp_path):
    ov = ["strategy=ps_sync", "workers=3", "network.bandwidth=1e8", "compute.gradient=0.01", "stop.updates=3"]
    whole = run(tmp_path / "a", ov)
    layered = run(tmp_path / "b", [*ov, "compute.layerwise=true"])
    assert layered.summary["virtual_time_ns"] < whole.summary["virtual_time_ns"]
    assert layered.params.equal(whole.params)


def test_ssp_releases_held_workers_layer_by_layer(tmp_path):
    """SSP's PS releases a held worker with the per-layer messages a layer-wise worker waits for (it sent
    one whole-model message, which the worker never took: the run ended after 4 of its 40 updates)."""
    ov = ["strategy=ssp", "strategy.staleness_bound=0", "workers=4", "stop.updates=40", "compute.gradient=0.01"]
    whole = run(tmp_path / "a", ov)
    layered = run(tmp_path / "b", [*ov, "compute.layerwise=true"])
    assert whole.summary["updates"] == layered.summary["updates"] == 40
    assert layered.summary["stopped_by"] == whole.summary["stopped_by"]

"""Golden equivalences of DESIGN §5 for the new strategies: same averages, same parameters."""
from __future__ import annotations

import pytest
import torch

K4 = ["workers=4", "stop.updates=3", "batch_size=16"]


def test_ring_allreduce_gives_the_same_parameters_as_ps_sync(run):
    ps = run(["strategy=ps_sync", *K4])
    ring = run(["strategy=ring_allreduce", *K4])
    assert ps.params is not None and ring.params is not None
    torch.testing.assert_close(ring.params, ps.params, rtol=0, atol=1e-6)
    # and the trained model moved: the comparison is not between two initial models
    assert (ring.params - ps.worker("ps0").training.initial).abs().max() > 1e-3


def test_ring_allreduce_averaged_gradient_equals_ps_sync_mean(run):
    """One step at lr=1 exposes the averaged gradient itself: params_1 = params_0 - mean(g)."""
    ps = run(["strategy=ps_sync", "lr=1.0", "workers=5", "stop.updates=1", "batch_size=8"])
    ring = run(["strategy=ring_allreduce", "lr=1.0", "workers=5", "stop.updates=1", "batch_size=8"])
    p0 = ps.worker("ps0").training.initial
    torch.testing.assert_close(p0 - ring.params, p0 - ps.params, rtol=0, atol=1e-6)


def test_sharded_ps_sync_equals_one_ps(run):
    one = run(["strategy=ps_sync", *K4])
    three = run(["strategy=ps_sync", "strategy.shards=3", *K4])
    torch.testing.assert_close(three.params, one.params, rtol=0, atol=0)
    assert [r["iteration"] for r in three.rows()] == ["1", "2", "3"]


def test_fedavg_with_one_local_step_and_all_clients_equals_ps_sync(run):
    ps = run(["strategy=ps_sync", *K4])
    fed = run(["strategy=fedavg", "strategy.local_steps=1", "strategy.fraction=1.0", *K4])
    torch.testing.assert_close(fed.params, ps.params, rtol=0, atol=1e-6)


@pytest.mark.parametrize("strategy", ["ps_sync", "ps_async", "ssp", "ring_allreduce", "hierarchical_allreduce",
                                      "gossip", "local_sgd", "fedavg", "fedasync"])
def test_with_one_worker_every_strategy_reduces_to_plain_sgd(run, strategy):
    """DESIGN §5's golden equivalence: bit for bit where one worker's step is SGD's very computation."""
    sgd = run(["strategy=sgd", "workers=1", "stop.updates=3", "lr=0.05", "seed=1"])
    extra = ["++strategy.local_steps=1"] if strategy in ("local_sgd", "fedavg", "fedasync") else []
    one = run([f"strategy={strategy}", "workers=1", "stop.updates=3", "lr=0.05", "seed=1", *extra])
    if strategy in ("ps_sync", "ps_async", "ssp"):
        assert torch.equal(one.params, sgd.params)
    else:  # averaging one model (or mixing it in) may round differently
        torch.testing.assert_close(one.params, sgd.params, rtol=0, atol=1e-6)


def test_hierarchical_allreduce_equals_ps_sync(run):
    ps = run(["strategy=ps_sync", "workers=6", "stop.updates=2", "batch_size=8"])
    h = run(["strategy=hierarchical_allreduce", "strategy.group_size=2", "workers=6", "stop.updates=2",
             "batch_size=8"])
    torch.testing.assert_close(h.params, ps.params, rtol=0, atol=1e-6)


def test_segmented_ring_gives_identical_parameters_and_pays_a_latency_per_segment(run):
    whole = run(["strategy=ring_allreduce", "workers=2", "stop.updates=1", "network.discipline=fifo"])
    seg = run(["strategy=ring_allreduce", "workers=2", "stop.updates=1", "network.discipline=fifo",
               "strategy.segment=100000"])
    torch.testing.assert_close(seg.params, whole.params, rtol=0, atol=0)
    # 318 020-byte chunks in 4 segments of <= 100 000 bytes, 2 ring steps: each segment waits for its
    # receiver-ready message (one latency) and the segments no longer overlap with the next step's
    extra = seg.summary["virtual_time_ns"] - whole.summary["virtual_time_ns"]
    assert extra >= 2 * 4 * 1_000_000 - 2 * 1_000_000


@pytest.mark.parametrize("shards", [1, 3])
def test_gloo_send_and_recv_change_a_sync_ps_step_times_not_its_parameters(run, shards):
    plain = run(["strategy=ps_sync", f"strategy.shards={shards}", *K4])
    gloo = run(["strategy=ps_sync", f"strategy.shards={shards}", "strategy.collective=gloo", *K4])
    torch.testing.assert_close(gloo.params, plain.params, rtol=0, atol=0)
    # the first parameters wait for the workers' announced receives (one latency and 48 bytes), and every
    # message carries gloo's 48-byte preamble
    assert gloo.summary["virtual_time_ns"] > plain.summary["virtual_time_ns"]

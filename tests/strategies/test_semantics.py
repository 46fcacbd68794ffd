"""What each strategy promises: FedAsync's weights, SSP's bound, FedAvg's sampling, gossip's graph."""
from __future__ import annotations

import pytest
import torch

from agents.strategies.fedasync import mix, staleness_weight
from agents.strategies.fedavg import sample_clients
from agents.strategies.gossip import neighbours

HET = ["workers=4", "compute.speed=[1,1,2,5]", "batch_size=8"]


@pytest.mark.parametrize("kind,a,b,expected", [
    ("constant", 0.5, 4, lambda s: 1.0),
    ("polynomial", 0.5, 4, lambda s: 1.0 / (s + 1) ** 0.5),
    ("hinge", 0.5, 2, lambda s: 1.0 if s <= 2 else 1.0 / (0.5 * (s - 2) + 1)),
])
def test_fedasync_applies_exactly_the_staleness_formula(run, kind, a, b, expected):
    ran = run(["strategy=fedasync", *HET, "stop.updates=20", f"strategy.staleness={kind}", f"strategy.a={a}",
               f"strategy.b={b}", "strategy.alpha=0.8"])
    history = ran.worker("server").history
    assert len(history) == 20
    stalenesses = [st for _, st, _ in history]
    assert max(stalenesses) >= 3  # the slow clients do return stale models
    for _, st, alpha in history:
        assert alpha == 0.8 * expected(st)
    rows = ran.rows()
    assert [int(r["staleness"]) for r in rows] == stalenesses


def test_fedasync_mixing_is_the_convex_combination():
    w, wk = torch.randn(1000), torch.randn(1000)
    torch.testing.assert_close(mix(w, wk, 0.25), 0.75 * w + 0.25 * wk, rtol=0, atol=0)
    assert staleness_weight("polynomial", 3, a=0.5) == 0.5
    assert staleness_weight("hinge", 10, a=0.5, b=4) == 0.25


def test_fedasync_server_model_follows_the_mixing_rule(run):
    """Replay the server: w_{t+1} = (1 − α_t) w_t + α_t w_k, with every α_t and w_k it saw."""
    ran = run(["strategy=fedasync", *HET, "stop.updates=1", "strategy.alpha=0.3"])
    server = ran.worker("server")
    (_, st, alpha), = server.history
    assert st == 0 and alpha == 0.3
    w0 = server.training.initial
    moved = ran.params - w0
    # the update is alpha times the client's step, so it is not the full client model (alpha = 1)
    assert moved.abs().max() > 0
    ran1 = run(["strategy=fedasync", *HET, "stop.updates=1", "strategy.alpha=1.0"])
    torch.testing.assert_close(ran.params, mix(w0, ran1.params, 0.3), rtol=0, atol=1e-7)


@pytest.mark.parametrize("bound", [0, 1, 2])
def test_ssp_never_exceeds_its_staleness_bound(run, bound):
    ran = run(["strategy=ssp", *HET, "stop.updates=40", f"strategy.staleness_bound={bound}"])
    ps = ran.worker("ps0")
    assert ps.max_gap <= bound
    assert ps.max_gap == bound  # the slow worker (5x) makes the bound bind
    assert max(ps.clocks.values()) - min(ps.clocks.values()) <= bound + 1


def test_async_ps_without_a_bound_lets_fast_workers_run_ahead(run):
    ran = run(["strategy=ps_async", *HET, "stop.updates=40"])
    clocks = ran.worker("ps0").clocks
    assert max(clocks.values()) - min(clocks.values()) > 3


def test_fedavg_samples_clients_per_round_with_keyed_draws(run):
    ran = run(["strategy=fedavg", "workers=6", "stop.updates=4", "strategy.fraction=0.5",
               "strategy.local_steps=2"])
    history = ran.worker("server").history
    assert len(history) >= 4 and all(len(h) == 3 for h in history)
    assert len({tuple(h) for h in history}) > 1
    assert history[:4] == [sample_clients(0, r, 6, 0.5) for r in range(4)]
    assert sample_clients(1, 0, 6, 0.5) != sample_clients(0, 0, 6, 0.5) or sample_clients(1, 1, 6, 0.5) != \
        sample_clients(0, 1, 6, 0.5)


@pytest.mark.parametrize("k,degree", [(8, 2), (8, 3), (9, 4), (16, 5)])
def test_random_gossip_graph_is_regular_and_symmetric(k, degree):
    nb = neighbours(k, "random", degree, seed=7)
    assert all(len(n) == degree for n in nb)
    assert all(i in nb[j] for i in range(k) for j in nb[i])
    assert nb == neighbours(k, "random", degree, seed=7)
    assert nb != neighbours(k, "random", degree, seed=8)


def test_gossip_replicas_differ_but_stay_close(run):
    ran = run(["strategy=gossip", "workers=4", "stop.updates=5", "batch_size=8"])
    w0, w2 = ran.worker("w0"), ran.worker("w2")
    a, b = w0.flat(), w2.flat()
    assert not torch.equal(a, b)
    assert (a - b).abs().max() < 0.05


@pytest.mark.parametrize("batch, per_row", [("16", 4 * 16), ("[8,16,24,32]", 8 + 16 + 24 + 32)])
def test_a_gossip_row_counts_the_batches_of_all_workers_as_a_ring_round_does(run, batch, per_row):
    # a row counted w0's batch only (16 of the 64 samples a step of 4 workers takes: a ring counts all 64)
    common = ["workers=4", "stop.updates=5", f"batch_size={batch}"]
    gossip, ring = run(["strategy=gossip", *common]), run(["strategy=ring_allreduce", *common])
    m = gossip.summary["model_bytes"]
    assert [(r["vworker"], int(r["samples"]), int(r["bytes"])) for r in gossip.rows()] == [("w0", per_row, 2 * m)] * 5
    assert [int(r["samples"]) for r in ring.rows()] == [per_row] * 5
    assert gossip.summary["samples"] == ring.summary["samples"] == 5 * per_row
    assert gossip.summary["throughput_samples_per_s"] == pytest.approx(
        5 * per_row / gossip.summary["virtual_time_s"], rel=1e-9)
    # the row stands for step v of every worker: at w0's 5th the others are through their 4th or 5th
    assert [gossip.worker(w).version for w in ("w0", "w1", "w2", "w3")][0] == 5
    assert {gossip.worker(w).version for w in ("w1", "w2", "w3")} <= {4, 5}


@pytest.mark.parametrize("optimizer, cls", [("sgd", torch.optim.SGD), ("adam", torch.optim.Adam)])
def test_the_configured_optimizer_is_the_one_the_server_steps_with(run, optimizer, cls):
    """A regression: ``optimizer=adam`` used to be validated and then dropped (the PS stepped with SGD)."""
    ran = run([f"optimizer={optimizer}", "lr=0.001", "workers=2", "stop.updates=2"])
    opt = ran.worker("ps0").opt
    assert type(opt) is cls and opt.param_groups[0]["lr"] == 0.001

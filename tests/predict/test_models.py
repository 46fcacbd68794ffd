"""Each predictor of the throughput-prediction paper on cases computed by hand."""
from __future__ import annotations

import math

import pytest

from controller.predict import Inputs, LayerCost, predict
from controller.predict import finegrained as fg
from controller.predict.mva import WorkerClass, solve

S = 1e9  # ns per second


def by_name(result):
    return {m["model"]: m for m in result["models"]}


# ------------------------------------------------------------------ MVA (Eq. 1-5)
def test_one_worker_cycles_through_every_station_once():
    # no one to share with: X = 1 / (Z + S_U + S_S + S_D), whatever the discipline
    for link in ("fcfs", "ps"):
        r = solve([WorkerClass(1, 0.2, 0.05, 0.01, 0.04)], link)
        assert r.job_throughput == pytest.approx(1 / 0.3)
        assert r.uplink_s == (pytest.approx(0.05),)


def test_processor_sharing_mva_for_two_workers_matches_eq1_by_hand():
    # n=1: T_U = T_D = 0.5, X(1) = 1/2, N_U(1) = N_D(1) = 1/4
    # n=2: T_U = 0.5 (1 + 1/4) = 0.625 (Eq. 1); X = 2 / (1 + 0.625 + 0.625) = 8/9
    r = solve([WorkerClass(2, 1.0, 0.5, 0.0, 0.5)], "ps")
    assert r.uplink_s[0] == pytest.approx(0.625)
    assert r.job_throughput == pytest.approx(8 / 9)
    assert r.utilisation == pytest.approx(8 / 9 * 0.5)


def test_fcfs_mva_for_two_workers_matches_eq2_by_hand():
    # n=1: X = 1/2, N_U = rho_U = 1/4; Eq. 2: T_U(2) = 0.5 + 0.5 (1/4 - 1/8) = 0.5625
    r = solve([WorkerClass(2, 1.0, 0.5, 0.0, 0.5)], "fcfs")
    assert r.uplink_s[0] == pytest.approx(0.5625)
    assert r.job_throughput == pytest.approx(2 / (1 + 2 * 0.5625))


def test_identical_workers_in_two_classes_give_what_one_class_gives():
    one = solve([WorkerClass(4, 0.3, 0.1, 0.01, 0.1)], "ps").job_throughput
    two = solve([WorkerClass(1, 0.3, 0.1, 0.01, 0.1), WorkerClass(3, 0.3, 0.1, 0.01, 0.1)], "ps").job_throughput
    assert two == pytest.approx(one)


def test_bard_schweitzer_stands_in_for_huge_state_spaces_and_stays_close():
    from controller.predict import mva

    classes = [WorkerClass(40, 0.02, 0.001, 0.0, 0.001), WorkerClass(40, 0.04, 0.001, 0.0, 0.001),
               WorkerClass(40, 0.03, 0.002, 0.0, 0.001)]
    approx = mva.solve(classes, "ps")
    assert approx.method.startswith("Bard-Schweitzer")
    old = mva.MAX_STATES
    try:
        mva.MAX_STATES = 10 ** 6
        exact = mva.solve(classes, "ps")
    finally:
        mva.MAX_STATES = old
    assert exact.method.startswith("exact")
    assert approx.job_throughput == pytest.approx(exact.job_throughput, rel=0.02)


def _inputs(**kw):
    base = dict(strategy="ps_async", workers=2, batch=(16, 16), model_bytes=1000,
                layers=(LayerCost("a", 1000, 1 / 3, 2 / 3),), layer_source="flops", gradient_s=(1.0, 1.0),
                update_s=0.0, aggregate_s=0.0, compute_source="test", bandwidth_ps_out=2000.0,
                bandwidth_ps_in=2000.0, bandwidth_worker_out=(2000.0, 2000.0), bandwidth_worker_in=(2000.0, 2000.0),
                latency_s=0.0, egress="fair", ingress="fair", layerwise=False, forward_fraction=1 / 3,
                allreduce_share=0.0)
    base.update(kw)
    return Inputs(**base)


def test_async_ps_prediction_takes_its_sharing_from_the_network_and_the_hybrid_from_the_threshold():
    fair = predict(_inputs(), fine=False)
    m = by_name(fair)
    assert fair["selected"] == "async_ps_mva_ps"
    assert m["async_ps_mva_ps"]["updates_per_s"] == pytest.approx(8 / 9)  # the two-worker case above
    assert m["async_ps_mva_ps"]["samples_per_s"] == pytest.approx(16 * 8 / 9)
    # rho_FCFS = X_FCFS · S = 0.8 · 0.5 = 0.4 <= 0.5: the hybrid (Eq. 5) keeps the FCFS solution
    assert m["async_ps_mva_fcfs"]["utilisation"] == pytest.approx(2 / (1 + 2 * 0.5625) * 0.5)
    assert m["async_ps_hybrid"]["updates_per_s"] == m["async_ps_mva_fcfs"]["updates_per_s"]
    high = by_name(predict(_inputs(rho_threshold=0.1), fine=False))
    assert high["async_ps_hybrid"]["updates_per_s"] == m["async_ps_mva_ps"]["updates_per_s"]
    assert predict(_inputs(egress="fifo", ingress="fifo"), fine=False)["selected"] == "async_ps_mva_fcfs"


def test_unlimited_links_are_delays_and_their_mva_is_the_prediction_of_such_a_network():
    # no sharing on either link: X = 2 / (1 + 0.5 + 0.5) whatever the population, only the update queues (0 here)
    r = solve([WorkerClass(2, 1.0, 0.5, 0.0, 0.5)], "delay")
    assert r.uplink_s[0] == pytest.approx(0.5) and r.job_throughput == pytest.approx(1.0)
    both = predict(_inputs(egress="unlimited", ingress="unlimited"), fine=False)
    assert both["selected"] == "async_ps_mva_delay"
    assert by_name(both)["async_ps_mva_delay"]["updates_per_s"] == pytest.approx(1.0)
    # an unlimited egress and a fair ingress: the downlink a delay, the uplink shared (Eq. 1)
    mixed = predict(_inputs(egress="unlimited", ingress="fair"), fine=False)
    assert mixed["selected"] == "async_ps_mva_ps_delay"
    assert by_name(mixed)["async_ps_mva_ps_delay"]["updates_per_s"] == pytest.approx(
        solve([WorkerClass(2, 1.0, 0.5, 0.0, 0.5)], "ps", downlink="delay").job_throughput)
    assert "async_ps_mva_delay" not in by_name(predict(_inputs(), fine=False))  # only where a NIC is unlimited


@pytest.mark.parametrize("egress, ingress, selected", [
    ("fair", "fair", "sync_ps_eq7_ps"), ("fair", "fifo", "sync_ps_eq7_ps"), ("fifo", "fair", "sync_ps_eq8_fcfs"),
    ("fifo", "unlimited", "sync_ps_eq8_fcfs"), ("fair", "unlimited", "sync_ps_eq8_fcfs"),
    ("unlimited", "fifo", "sync_ps_eq8_fcfs"), ("unlimited", "unlimited", "sync_ps_uncontended")])
def test_a_sync_round_is_predicted_by_the_form_of_both_nics_of_the_ps(egress, ingress, selected):
    # (unlimited, unlimited) was Eq. 8's, 71 % slower than the emulated round at K = 4
    r = predict(_inputs(strategy="ps_sync", egress=egress, ingress=ingress), fine=False)
    assert r["selected"] == selected
    if selected == "sync_ps_uncontended":  # M/B down, compute, M/B up: 0.5 + 1 + 0.5
        assert by_name(r)[selected]["step_s"] == pytest.approx(2.0)


def test_overlap_correction_eq6_for_one_worker():
    # K=1: T_D = S_D = 0.5, T_U = S_U = 0.5; S_F = 1/3, S_B = 2/3:
    # S_W = max(0, 1/3 - 0.5) + max(0, 2/3 - 0.5) = 1/6, X = 1 / (1/6 + 0.5 + 0.5)
    inp = _inputs(workers=1, batch=(16,), gradient_s=(1.0,), bandwidth_worker_out=(2000.0,),
                  bandwidth_worker_in=(2000.0,))
    m = by_name(predict(inp, fine=False))
    assert m["async_ps_overlap_ps"]["updates_per_s"] == pytest.approx(1 / (1 / 6 + 1.0))
    assert m["async_ps_mva_ps"]["updates_per_s"] == pytest.approx(1 / 2.0)


def test_latency_is_a_delay_of_two_one_way_trips_per_step():
    inp = _inputs(workers=1, batch=(16,), gradient_s=(1.0,), bandwidth_worker_out=(2000.0,),
                  bandwidth_worker_in=(2000.0,), latency_s=0.25)
    assert by_name(predict(inp, fine=False))["async_ps_mva_ps"]["step_s"] == pytest.approx(2.5)


# --------------------------------------------------------------- Eq. 7-11
def test_sync_ps_forms_eq7_to_eq10():
    inp = _inputs(strategy="ps_sync", workers=4, batch=(8,) * 4, gradient_s=(0.3,) * 4, update_s=0.01,
                  aggregate_s=0.02, bandwidth_worker_out=(2000.0,) * 4, bandwidth_worker_in=(2000.0,) * 4,
                  latency_s=0.001)
    r = predict(inp, fine=False)
    m = by_name(r)
    KMB = 4 * 1000 / 2000  # K·M/B = 2 s
    assert m["sync_ps_eq7_ps"]["step_s"] == pytest.approx(KMB + 0.3 + KMB + 0.03 + 0.002)
    assert m["sync_ps_eq8_fcfs"]["step_s"] == pytest.approx(KMB + 0.3 + 0.5 + 0.03 + 0.002)
    assert m["sync_ps_eq9_hybrid"]["step_s"] == pytest.approx(KMB + 0.3 + 5 * 1000 / 4000 + 0.03 + 0.002)
    assert m["sync_ps_eq10_overlap"]["step_s"] == pytest.approx(max(KMB, 0.1) + max(1.25, 0.2) + 0.03 + 0.002)
    assert m["sync_ps_eq7_ps"]["samples_per_s"] == pytest.approx(32 / m["sync_ps_eq7_ps"]["step_s"])
    assert r["selected"] == "sync_ps_eq7_ps"


def test_ring_eq11_with_its_latencies_and_chunk_additions():
    inp = _inputs(strategy="ring_allreduce", workers=5, batch=(4,) * 5, gradient_s=(0.3,) * 5, update_s=0.01,
                  aggregate_s=0.002, bandwidth_worker_out=(2000.0,) * 5, bandwidth_worker_in=(2000.0,) * 5,
                  latency_s=0.001)
    m = by_name(predict(inp, fine=False))
    assert m["ring_eq11"]["step_s"] == pytest.approx(0.3 + 2 * 4 / 5 * 0.5 + 0.01 + 8 * 0.001 + 4 * 0.002)


def test_strategies_the_paper_does_not_model_get_a_sentence_and_no_numbers():
    r = predict(_inputs(strategy="gossip"))
    assert r["models"] == [] and "gossip" in r["note"]


# ----------------------------------------------------------- Algorithm 2.1
def _sim(arch, mode, link, layer_bytes, fwd, bwd, workers=1, bw=1000.0, latency=0.0, update=0.0, aggregate=0.0,
         steps=2, cap=None, share=0.0, weights=None):
    tr = fg.Trace(arch, mode, link, tuple(layer_bytes), bw, bw, latency * S, update * S, aggregate * S,
                  workers, cap, share)
    if isinstance(fwd[0], (int, float)):
        fwd, bwd = [fwd] * workers, [bwd] * workers
    ws = [fg.SimWorker(tuple(f * S for f in fw), tuple(b * S for b in bw_), 16, (weights or [1] * workers)[i])
          for i, (fw, bw_) in enumerate(zip(fwd, bwd))]
    return fg.simulate(tr, ws, steps, record_ops=True)


def seconds(r):
    return [round(t / S, 9) for t in r.update_times_ns]


def test_algorithm_2_1_one_worker_overlaps_layers_as_derived_by_hand():
    # layers 1000 B and 3000 B at 1000 B/s, latency 0.5 s, forward (2, 1) s, backward (1, 2) s, update 0.25 s:
    # down1 0-1 (+0.5), down2 1-4 (+0.5); fwd1 1.5-3.5; fwd2 max(3.5, 4.5)-5.5; bwd2 5.5-7.5; bwd1 7.5-8.5;
    # up2 7.5-10.5 (+0.5); up1 queued behind it 10.5-11.5 (+0.5); update 12.0-12.25
    r = _sim("ps", "async", "ps", [1000, 3000], [2, 1], [1, 2], latency=0.5, update=0.25)
    assert seconds(r) == [12.25, 24.5]
    spans = {(op, round(a / S, 3), round(b / S, 3)) for w, res, op, a, b in r.ops if b <= 12.25 * S}
    assert ("fwd1", 4.5, 5.5) in spans and ("up0", 10.5, 11.5) in spans


def test_fcfs_gives_the_first_active_worker_the_whole_link_and_ps_shares_it():
    # two workers, 1000 B at 1000 B/s, latency 0.1 s, w0 computes 1.2 s, w1 1.0 s
    kw = dict(workers=2, latency=0.1, steps=1)
    fcfs = _sim("ps", "async", "fcfs", [1000], [[0.4], [1 / 3]], [[0.8], [2 / 3]], **kw)
    # w0: down 0-1, compute 1.1-2.3, up 2.3-3.3 -> 3.4; w1: down 1-2, compute 2.1-3.1, up waits for w0: 3.3-4.3 -> 4.4
    assert seconds(fcfs) == [3.4, 4.4]
    ps = _sim("ps", "async", "ps", [1000], [[0.4], [1 / 3]], [[0.8], [2 / 3]], **kw)
    # both downs share: 0-2; w1 computes 2.1-3.1, uploads alone until w0 joins at 3.3, then both at half rate:
    # w1 has 0.2 s of work done, 0.8 left -> 4.9 (+0.1); w0 has 0.8 s done by then, 0.2 left alone -> 5.1 (+0.1)
    assert seconds(ps) == [5.0, 5.2]


def test_a_flow_cap_slows_a_lone_transfer_down():
    free = _sim("ps", "sync", "ps", [1000], [0.1], [0.2], steps=1)
    capped = _sim("ps", "sync", "ps", [1000], [0.1], [0.2], steps=1, cap=500.0)
    assert seconds(free) == [2.3] and seconds(capped) == [4.3]


def test_an_all_reduce_slows_the_computation_it_overlaps_by_its_device_share():
    # ring, K=2: each layer's all-reduce moves 2(K-1)/K · 1000 B = 1000 B at 1000 B/s = 1 s
    # fwd 0-1, 1-2; bwd2 2-4; allreduce2 4-5 while bwd1 runs at half speed (0.5 s of work), bwd1 ends 6.5;
    # allreduce1 6.5-7.5
    slow = _sim("ring", "sync", "all_reduce", [1000, 1000], [1, 1], [2, 2], workers=2, steps=1, share=0.5)
    free = _sim("ring", "sync", "all_reduce", [1000, 1000], [1, 1], [2, 2], workers=2, steps=1)
    assert seconds(slow) == [7.5] and seconds(free) == [7.0]


@pytest.mark.parametrize("K", [1, 2, 4])
def test_algorithm_2_1_without_layers_reduces_to_eq7_and_eq8(K):
    M, B, T_C, T_S, T_A, L = 636040, 25e6, 0.015, 0.002, 0.001, 0.003
    for link, up in (("ps", K * M / B), ("fcfs", M / B)):
        r = _sim("ps", "sync", link, [M], [T_C / 3], [2 * T_C / 3], workers=K, bw=B, latency=L, update=T_S,
                 aggregate=T_A, steps=3)
        step = K * M / B + T_C + up + T_S + T_A + 2 * L
        assert seconds(r) == [pytest.approx(step * i, abs=1e-9) for i in (1, 2, 3)]


def test_algorithm_2_1_without_layers_reduces_to_eq11():
    K, M, B, L = 5, 636040, 127208.0, 0.001
    r = _sim("ring", "sync", "all_reduce", [M], [0.01 / 3], [0.02 / 3], workers=K, bw=B, latency=L, update=0.001,
             steps=3)
    step = 0.01 + 2 * (K - 1) * M / (K * B) + 2 * (K - 1) * L + 0.001
    assert step == pytest.approx(8.019)
    assert seconds(r) == [pytest.approx(step * i, abs=1e-9) for i in (1, 2, 3)]


def test_one_worker_standing_for_many_gives_the_same_synchronous_rounds():
    many = _sim("ps", "sync", "ps", [500, 1500], [0.1, 0.2], [0.2, 0.4], workers=6, latency=0.01, steps=3)
    one = _sim("ps", "sync", "ps", [500, 1500], [0.1, 0.2], [0.2, 0.4], workers=1, latency=0.01, steps=3, weights=[6])
    assert seconds(one) == seconds(many)
    assert math.isclose(many.samples[0], 6 * 16) and one.samples == many.samples

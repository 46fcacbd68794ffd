"""What a fault means to each strategy (docs/faults.md), with exact virtual times and parameters."""
from __future__ import annotations

import pytest
import torch

MS = 1_000_000
FAST_NET = ["network.discipline=unlimited", "network.bandwidth=1e15", "network.latency=1ms", "compute.gradient=0.01",
            "compute.update=0.001", "compute.aggregate=0"]


def times(ran) -> list[int]:
    return [int(r["virtual_time_ns"]) for r in ran.rows()]


def test_a_sync_ps_waits_for_a_crashed_worker_which_rejoins_with_the_parameters_it_pulls(run):
    common = [*FAST_NET, "strategy=ps_sync", "workers=2", "stop.updates=3"]
    base = times(run(common))
    ran = run([*common, "faults=[{kind:crash,workers:[w1],at:5ms,until:50ms}]"])
    # w1 dies computing its first gradient; at 50 ms it restarts and pulls (1 ms), gets version 0 (1 ms),
    # computes (10 ms) and pushes (1 ms): the first round ends 50 + 1 + 1 + 10 + 1 + 1 (update) = 64 ms
    # instead of 1 + 10 + 1 + 1 = 13 ms, and the others follow at the same pace
    assert [t - b for t, b in zip(times(ran), base)] == [51 * MS] * 3
    w1 = ran.worker("w1")
    assert w1.restarted and w1.incarnation == 1


def test_an_async_ps_goes_on_without_a_crashed_worker_and_takes_it_back_after_recovery(run):
    common = [*FAST_NET, "strategy=ps_async", "workers=3", "stop.updates=30"]
    base = run(common)
    ran = run([*common, "faults=[{kind:crash,workers:[w1],at:5ms,until:60ms}]"])
    ps, ps0 = ran.worker("ps0"), base.worker("ps0")
    assert ps.clocks["w1"] < ps0.clocks["w1"]  # it missed the updates of its downtime
    assert ps.clocks["w1"] > 0  # and contributed again after it pulled the parameters
    assert ps.version == ps0.version == 30
    assert ran.worker("w1").restarted


def test_a_fedavg_client_that_crashed_misses_every_round_which_ends_at_the_round_timeout(run):
    ran = run([*FAST_NET, "strategy=fedavg", "workers=4", "strategy.local_steps=1", "batch_size=16",
               "stop.updates=3", "strategy.round_timeout=500ms", "compute.aggregate=0.002",
               "faults=[{kind:crash,workers:[c1]}]"])
    rows = ran.rows()
    # each round waits the whole 500 ms for c1, then aggregates (2 ms) the three others' updates
    assert times(ran) == [502 * MS, 1004 * MS, 1506 * MS]
    assert [int(r["samples"]) for r in rows] == [3 * 16] * 3


def test_a_fedavg_client_slower_than_the_round_timeout_trains_the_newest_model_and_keeps_no_backlog(run):
    # c1 takes 3 x 10 ms a step; each round ends at its 20 ms deadline: it is sent a model every ~21 ms and
    # needs ~32 ms a round, so the models of rounds it missed queue up. It used to train the oldest (whose
    # update was sure to be dropped as late) and keep the rest: one more 636 kB model each round, forever
    ran = run([*FAST_NET, "strategy=fedavg", "workers=4", "strategy.local_steps=1", "batch_size=16",
               "stop.updates=60", "strategy.round_timeout=20ms", "faults=[{kind:straggler,workers:[c1],factor:3}]"])
    assert [int(r["samples"]) for r in ran.rows()] == [3 * 16] * 60  # c1 is too slow for any round
    c1 = ran.worker("c1")
    assert len([m for m in c1._mailbox if m.tag == "model"]) <= 1


def test_a_fedavg_round_shorter_than_sending_the_models_sends_a_client_no_model_while_its_last_is_leaving(
        run, monkeypatch):
    # two 636 040-byte models share the server's 1 Gbit/s NIC: both leave at 10.176 ms, while a round ends
    # every 1 ms (no update can be in by then). The server used to send every round's model to every client
    # anyway, a queue on its NIC that grew by a model per client per millisecond (1.5 GB of memory by 2 s);
    # now it skips a client whose last model is still leaving: the round at 11 ms is the next to send
    from agents.sim.env import Environment

    sent: list[tuple[str, str, int]] = []
    on_send = Environment.on_send

    def recording(self, w, tr, remote):
        if tr.tag == "model":
            sent.append((w.name, tr.dst_name, tr.sent_at))
        return on_send(self, w, tr, remote)

    monkeypatch.setattr(Environment, "on_send", recording)
    ran = run(["strategy=fedavg", "workers=2", "strategy.local_steps=1", "batch_size=16", "stop.updates=null",
               "stop.virtual_time=100ms", "network.latency=0.1ms", "strategy.round_timeout=1ms", "compute.gradient=0.01",
               "compute.update=0.001", "compute.aggregate=0"])
    assert ran.summary["updates"] == 0 and ran.worker("server").rnd == 100
    rounds = [11 * MS * i for i in range(10)]  # 0, 11, ..., 99 ms
    assert sent == [("server", c, t) for t in rounds for c in ("c0", "c1")]


def test_a_fedavg_round_timeout_too_short_for_any_update_stops_the_run_naming_it(run):
    # 5 ms rounds, while a model takes 10 ms to reach a client: no round ever takes in an update. The run
    # used to go on for ever with `updates` at 0 (stop.updates cannot fire); the server now gives up after
    # EMPTY_ROUNDS rounds without one, from the start
    from agents.sim.kernel import WorkerCrashed
    from agents.strategies.fedavg import EMPTY_ROUNDS

    with pytest.raises(WorkerCrashed) as err:
        run([*FAST_NET, "network.latency=10ms", "strategy=fedavg", "workers=2", "strategy.local_steps=1",
             "stop.updates=3", "strategy.round_timeout=25ms"])
    assert (f"vworker server raised RuntimeError at virtual time {EMPTY_ROUNDS * 25 * MS} ns: fedavg: the first "
            f"{EMPTY_ROUNDS} rounds all ended without an update (strategy.round_timeout=25ms is shorter than any "
            f"chosen client's round") in str(err.value)


def test_a_fedavg_round_timeout_that_some_rounds_meet_is_no_error(run):
    # the same 25 ms rounds where a round takes 2 x 10 + 10 + 1 ms: every round but the very first few meets it
    ran = run([*FAST_NET, "network.latency=10ms", "strategy=fedavg", "workers=2", "strategy.local_steps=1",
               "stop.updates=3", "strategy.round_timeout=35ms"])
    assert ran.summary["updates"] == 3


def test_a_sharded_sync_ps_whose_parameters_are_duplicated_drops_the_copies_and_learns_the_same(run):
    # a copy of ps0's slice of version v, taken with ps1's slice of v + 1, made a model of mixed versions whose
    # gradient ps0 dropped: the run stopped after 2 updates, every vworker parked
    common = [*FAST_NET, "strategy=ps_sync", "strategy.shards=2", "workers=4", "stop.updates=30"]
    base = run(common)
    ran = run([*common, "faults=[{kind:duplicate,workers:[ps0],probability:0.3}]"])
    assert [r["iteration"] for r in ran.rows()] == [str(i) for i in range(1, 31)]
    assert torch.equal(ran.params, base.params)


def test_a_fedavg_round_timeout_without_faults_changes_nothing(run):
    common = [*FAST_NET, "strategy=fedavg", "workers=4", "strategy.local_steps=1", "stop.updates=3"]
    a, b = run(common), run([*common, "strategy.round_timeout=10s"])
    assert times(a) == times(b) and torch.equal(a.params, b.params)


def test_a_frozen_ring_member_stalls_the_ring_exactly_like_a_compute_call_that_ends_at_the_thaw(run):
    # K = 5 and 127 208-byte chunks: an Eq. 11 step of 8.019 s (tests/strategies/test_timing.py)
    common = ["strategy=ring_allreduce", "workers=5", "stop.updates=3", "network.discipline=fifo",
              "network.bandwidth=127208", "compute.gradient=0.01", "compute.update=0.001", "compute.aggregate=0"]
    base = times(run(common))
    step = base[0]
    # w1 freezes 5 ms into its second gradient (started at `step`, due 10 ms later) until step + 500 ms ...
    frozen = times(run([*common, f"faults=[{{kind:crash,workers:[w1],at:{step + 5 * MS}ns,"
                                 f"until:{step + 500 * MS}ns}}]"]))
    # ... which is a 50x straggler on that one call: the ring waits for w1 either way, to the nanosecond
    slow = times(run([*common, f"faults=[{{kind:straggler,workers:[w1],factor:50,at:{step}ns,until:{step + 1}ns}}]"]))
    assert frozen == slow
    assert frozen[0] == base[0] and frozen[1] - base[1] > 400 * MS  # the whole ring stalled


def test_byzantine_sign_flip_and_scaling_change_exactly_the_gradient_of_the_faulty_worker(run):
    common = ["strategy=ps_sync", "workers=2", "stop.updates=1", "lr=0.1"]
    honest = run(common).params
    flipped = run([*common, "faults=[{kind:byzantine,workers:[w1],mode:sign_flip}]"]).params
    silent = run([*common, "faults=[{kind:byzantine,workers:[w1],mode:scale,factor:1e-30}]"]).params
    tripled = run([*common, "faults=[{kind:byzantine,workers:[w1],mode:scale,factor:3}]"]).params
    # one step: p0 - lr (g0 + c g1) / 2; "silent" is c = 0 (to float precision), so each differs from it by c
    d = honest - silent
    assert d.abs().max() > 1e-4
    torch.testing.assert_close(flipped - silent, -d, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(tripled - silent, 3 * d, rtol=1e-4, atol=1e-6)


def test_byzantine_noise_is_keyed_rerun_identical_and_only_from_the_interval_on(run):
    common = ["strategy=ps_async", "workers=2", "stop.updates=6", "lr=0.1"]
    noisy = ["faults=[{kind:byzantine,workers:[w1],mode:noise,std:0.5}]"]
    a, b, c = run([*common, *noisy]), run([*common, *noisy]), run(common)
    assert torch.equal(a.params, b.params)
    assert not torch.equal(a.params, c.params)
    late = run([*common, "faults=[{kind:byzantine,workers:[w1],mode:noise,std:0.5,at:1000s}]"])
    assert torch.equal(late.params, c.params)

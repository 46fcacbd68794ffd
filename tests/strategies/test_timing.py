"""Virtual times of the strategies against closed forms, and heterogeneity applied exactly as configured."""
from __future__ import annotations

import math

import pytest

from controller import closed_forms as cf

M = 636_040  # bytes of the MLP's parameters (159 010 float32)
MS = 1_000_000


def times(ran) -> list[int]:
    return [int(r["virtual_time_ns"]) for r in ran.rows()]


@pytest.mark.parametrize("discipline", ["fifo", "unlimited"])
def test_ring_allreduce_step_is_eq11_plus_2_k_minus_1_latencies(run, discipline):
    # K = 5 divides the 159 010 parameters, so every chunk is exactly M/K bytes (127 208 B): 1 s at B
    k, bw = 5, 127_208
    ran = run(["strategy=ring_allreduce", f"workers={k}", "stop.updates=3", f"network.discipline={discipline}",
               f"network.bandwidth={bw}", "compute.gradient=0.01", "compute.update=0.001", "compute.aggregate=0"])
    step = cf.ring_step(k, M, bw, 0.01, 0.001, latency=0.001)
    assert step == pytest.approx(8.019)
    assert times(ran) == [round(i * step * 1e9) for i in (1, 2, 3)]


# Eq. 7 / Eq. 8 for a synchronous PS round: tests/golden/test_closed_forms.py (derived there by hand).


FAST_NET = ["network.discipline=unlimited", "network.bandwidth=1e15", "compute.gradient=0.01",
            "compute.update=0.001", "compute.aggregate=0", "workers=4", "stop.updates=3", "strategy=ps_sync"]


@pytest.mark.parametrize("speed,slowest", [
    ("compute.speed={classes:[{fraction:0.5,factor:2.0}]}", 2.0),
    ("compute.speed=[1,1,1,3]", 3.0),
    ("compute.stragglers={w2:5.0}", 5.0),
])
def test_heterogeneous_speeds_change_virtual_times_exactly(run, speed, slowest):
    base = times(run(FAST_NET))
    slow = times(run([*FAST_NET, speed]))
    # a synchronous round waits for the slowest worker: (factor - 1) x 10 ms more per round
    assert [s - b for s, b in zip(slow, base)] == [round(i * (slowest - 1) * 10 * MS) for i in (1, 2, 3)]


def test_speed_classes_fill_workers_in_order(run):
    ran = run([*FAST_NET, "compute.speed={classes:[{fraction:0.25,factor:4.0},{fraction:0.5,factor:2.0}]}"])
    assert list(ran.handles[0].core.env.compute.spec.speed) == [4.0, 2.0, 2.0, 1.0, 1.0]  # ps0 last, factor 1


KEYED = ["strategy=ps_async", "workers=4", "stop.updates=12", "network=wan", "compute.jitter=0.3",
         "compute.start_spread=20ms",
         "compute.speed={distribution:lognormal,mu:0.0,sigma:0.5}", "compute.straggle={probability:0.3,factor:4.0}"]


def test_keyed_distributions_give_identical_draws_whatever_the_placement(run):
    one = run(KEYED)
    two = run([*KEYED, "agents=2"])
    three = run([*KEYED, "agents=3", "placement=block"])
    strip = [{k: v for k, v in r.items() if not k.startswith("wall")} for r in one.rows()]
    for other in (two, three):
        assert [{k: v for k, v in r.items() if not k.startswith("wall")} for r in other.rows()] == strip
        assert other.params.equal(one.params)
    plan = one.handles[0].core.plan
    assert len(set(plan.network.bandwidth_out)) == 5  # a draw per vworker, not one for all
    assert len(set(plan.compute.speed[:4])) == 4
    # the stagglers and jitter moved the times: the async PS's updates are not evenly spaced
    t = [int(r["virtual_time_ns"]) for r in one.rows()]
    assert len({b - a for a, b in zip(t, t[1:])}) > 3


def test_start_spread_starts_each_vworker_at_its_keyed_offset(run):
    # ps_sync on a fast network: the PS sends at its start o_ps, the parameters reach worker i at
    # o_ps + L + x (x: 1 ns of transfer at 1e15 B/s), worker i computes from max(o_i, o_ps + L + x), and the
    # round closes C + L after the last of them; later rounds keep that shift
    from agents.sim import keyed

    spread_ns, arrive_ns = 2 * 10**9, 1 * MS + math.ceil(M * 1e9 / 1e15)  # L + x
    base = times(run(FAST_NET))
    ran = run([*FAST_NET, "compute.start_spread=2s"])
    starts = [int(keyed.uniform(0, "start", vid) * spread_ns) for vid in range(5)]  # w0..w3, ps0 (id 4)
    assert len(set(starts)) == 5 and all(0 <= s < spread_ns for s in starts)
    assert [ran.handles[0].core.env.compute.start_at(vid) for vid in range(5)] == starts
    shift = max(max(starts[:4]), starts[4] + arrive_ns) - arrive_ns
    assert shift > 0 and times(ran) == [t + shift for t in base]


def test_start_offsets_add_a_fixed_delay_to_the_named_vworkers_start(run):
    # as in the test above: worker w2 starts 40 ms in and the PS 5 ms in, so the parameters reach w2 at
    # 5 ms + L + x, before it starts; w2 computes from 40 ms, and the round closes C + L after it: every
    # round ends 40 ms - (L + x) later. With a spread the fixed delay adds to each keyed draw.
    import json

    from agents.common.plan import Plan
    from agents.sim import keyed

    arrive_ns = 1 * MS + math.ceil(M * 1e9 / 1e15)  # L + x
    base = times(run(FAST_NET))
    ran = run([*FAST_NET, "compute.start_offsets={w2: 40ms, ps0: 5ms}"])
    assert [ran.handles[0].core.env.compute.start_at(vid) for vid in range(5)] == [0, 0, 40 * MS, 0, 5 * MS]
    assert times(ran) == [t + 40 * MS - arrive_ns for t in base]
    assert times(run([*FAST_NET, "compute.start_offsets={w2: 40ms, ps0: 5ms}", "agents=2"])) == times(ran)
    plan = ran.handles[0].core.plan  # as it travels to agent processes
    assert Plan.from_json(plan.to_json()).compute.start_offsets_ns == {2: 40 * MS, 4: 5 * MS}
    assert "start_offsets_ns" not in json.loads(run(FAST_NET).handles[0].core.plan.to_json())["compute"]
    spread = run([*FAST_NET, "compute.start_offsets={w2: 40ms}", "compute.start_spread=2ms"])
    assert [spread.handles[0].core.env.compute.start_at(vid) for vid in range(5)] == [
        (40 * MS if vid == 2 else 0) + int(keyed.uniform(0, "start", vid) * 2 * MS) for vid in range(5)]


def test_start_after_delays_the_first_parameters_and_so_every_update(run):
    cfg = ["strategy=ps_async", "workers=3", "stop.updates=9", "compute.gradient=0.01", "compute.update=0.001"]
    base = times(run(cfg))
    assert times(run([*cfg, "strategy.start_after=250ms"])) == [t + 250 * MS for t in base]


def test_a_vworker_that_starts_late_still_gets_gloo_announcements_made_before_it_started(run):
    # with gloo's send/recv the PS announces its parameters to workers that have not started yet: the
    # announcement waits in their mailbox until their transport exists (it was lost before: the run stalled)
    cfg = [*FAST_NET, "strategy.collective=gloo", "compute.start_spread=50ms"]
    one = run(cfg)
    assert len(one.rows()) == 3
    two = run([*cfg, "agents=2"])
    assert times(two) == times(one) and two.params.equal(one.params)


@pytest.mark.parametrize("strategy", ["strategy=ring_allreduce", "strategy=local_sgd",
                                      "strategy=hierarchical_allreduce strategy.group_size=1"])
def test_start_after_starts_the_first_ring_member_late_and_so_the_first_all_reduce(run, strategy):
    # K = 2, links without sharing: w1 computes and sends its chunk at once; w0 (rank 0, which records the
    # updates) starts 250 ms late, finds w1's chunk waiting and ends its all-reduce after its own chunk's
    # round trip: w0's first all-reduce ends exactly the delay later (after it, w1 runs ahead of w0)
    cfg = [*strategy.split(), "workers=2", "stop.updates=2", "network.discipline=unlimited",
           "compute.gradient=0.01", "compute.update=0.001", "compute.aggregate=0"]
    base = times(run(cfg))
    late = times(run([*cfg, "strategy.start_after=250ms"]))
    assert late[0] == base[0] + 250 * MS


def test_the_dissemination_barrier_touches_the_connections_gloo_uses():
    """gloo/barrier.cc over n ranks: in rounds d = 1, 2, 4, ... a rank hears from rank - d and rank + d and
    answers rank + d. With 9 ranks (a PS and K = 8 workers) rank 0 never talks to ranks 3 and 6."""
    from agents.strategies.collective import barrier_peers

    assert barrier_peers(0, 1) == (set(), set())
    assert barrier_peers(0, 2) == ({1}, {1})
    assert barrier_peers(1, 3) == ({0, 2}, {0, 2})  # d = 1: 0 and 2 (answers 2); d = 2: 2 and 0 (answers 0)
    assert barrier_peers(0, 5) == ({1, 2, 3, 4}, {1, 2, 4})
    assert barrier_peers(0, 9) == ({1, 2, 4, 5, 7, 8}, {1, 2, 4, 8})
    assert barrier_peers(3, 9) == ({1, 2, 4, 5, 7, 8}, {2, 4, 5, 7})  # 3 + 8 = 11 = 2 (mod 9)


def test_the_barrier_releases_the_rank_that_left_init_process_group_last_one_way_time_late():
    """``barrier_exits`` by hand, one-way time l (ranks leave init_process_group at -2l(n-2-r), the last at -l).

    n = 2: rank 0 at 0, rank 1 at -l. d = 1: 0's op to 1 leaves at max(0, -l + l) = 0, 1's op to 0 at
    max(-l, 0 + l) = l; rank 0 is done at max(0, l + l) = 2l, rank 1 at max(l, 0 + l) = l: [l, 0].
    n = 5: entries -6l, -4l, -2l, 0, -l. In round d rank r's op to r + d leaves when r + d's announcement has
    come, sent_r = max(start_r, start_r+d + l), and r goes on at max(sent_r, sent_r-d + l). In units of l:

        start             -6  -4  -2   0  -1
        d = 1: sent       -3  -1   1   0  -1    done   0  -1   1   2   1
        d = 2: sent        2   3   2   2   1    done   3   3   3   4   3
        d = 4: sent        4   4   4   4   5    done   5   5   5   6   5

    so the rank that left init_process_group last (3) leaves the barrier l after the others: [0, 0, 0, l, 0].
    """
    from agents.strategies.collective import barrier_exits

    l = 1_257_000
    assert barrier_exits(1, l) == [0]
    assert barrier_exits(2, l) == [l, 0]
    assert barrier_exits(3, l) == [0, l, 0]
    assert barrier_exits(5, l) == [0, 0, 0, l, 0]
    assert barrier_exits(9, l) == [l, 0, l, l, 0, l, l, 2 * l, l]


def test_on_two_cores_a_rank_woken_while_both_are_busy_waits_until_one_is_free():
    """``barrier_on_cores`` by hand, one-way time l, every rank's setup S after the barrier, two cores held
    from a rank's exit to the end of its setup (nothing preempts a running process).

    n = 3 (a PS and two workers), entries -2l, 0, -l: with cores to spare the ranks leave at 3l, 4l, 3l
    (``barrier_exits``). On two cores with S = 5l, ranks 0 and 2 hold both from 3l to 8l; rank 1's last
    message comes at 4l, it runs at 8l and is ready at 13l — the testbed's K = 2, 30 MB start (rank 1's first
    receive 12 ms after the others'). With S = l/2 the cores are free again at 3.5l: nothing waits.
    n = 5, S = 2l: ranks 0, 1, 2, 4 have their last messages at 5l. The two first in ``ties`` (1, 2) leave at
    once and hold the cores to 7l; 4 and 0 wait, and rank 4's last op to rank 3 leaves only when it runs,
    at 7l: rank 3 has it at 8l, waits for a core and leaves at 9l (with cores to spare: 5l and 6l).
    """
    from agents.strategies.collective import barrier_entries, barrier_exits, barrier_on_cores

    l = 2_257_000
    assert barrier_entries(3, l) == [-2 * l, 0, -l]
    assert barrier_on_cores(barrier_entries(3, l), l, [0] * 3, cores=3) == ([3 * l, 4 * l, 3 * l],) * 2
    assert barrier_on_cores(barrier_entries(3, l), l, [5 * l] * 3, cores=2) == (
        [3 * l, 8 * l, 3 * l], [8 * l, 13 * l, 8 * l])
    assert barrier_on_cores(barrier_entries(3, l), l, [l // 2] * 3, cores=2) == (
        [3 * l, 4 * l, 3 * l], [3 * l + l // 2, 4 * l + l // 2, 3 * l + l // 2])
    ties = [0.9, 0.2, 0.5, 0.1, 0.7]  # rank 1 and rank 2 first, then 4 and 0
    assert barrier_on_cores(barrier_entries(5, l), l, [2 * l] * 5, cores=2, ties=ties) == (
        [7 * l, 5 * l, 5 * l, 9 * l, 7 * l], [9 * l, 7 * l, 7 * l, 11 * l, 9 * l])
    # with a core per rank and no setup each rank is ready as it leaves: the barrier alone (barrier_exits)
    for n in range(1, 18):
        exits, ready = barrier_on_cores(barrier_entries(n, l), l, [0] * n, cores=n)
        assert ready == exits
    assert barrier_exits(5, l) == [0, 0, 0, l, 0]


@pytest.mark.parametrize("strategy, ranks", [
    ("strategy=ps_sync", ["ps0", "w0", "w1", "w2", "w3"]),
    ("strategy=ps_async", ["ps0", "w0", "w1", "w2", "w3"]),
    ("strategy=ring_allreduce", ["w0", "w1", "w2", "w3"]),
])
def test_gloo_programs_pass_a_barrier_in_rank_order_before_the_first_tensor(run, monkeypatch, strategy, ranks):
    """``collective: gloo`` with the tcp network: every vworker hands its barrier peers to the network once, in
    realrun's rank order (the servers first, then the workers; a ring in ring order)."""
    from agents.sim.tcp import TcpNetwork
    from agents.strategies.collective import barrier_peers

    calls = []
    original = TcpNetwork.barrier_history

    def record(self, w, heard, answered):
        names = self.env.names
        calls.append((w.name, sorted(names[i] for i in heard), sorted(names[i] for i in answered), w.now))
        return original(self, w, heard, answered)

    monkeypatch.setattr(TcpNetwork, "barrier_history", record)
    run([strategy, "workers=4", "stop.updates=2", "network=tcp", "network.tcp.delayed_ack=true",
         "strategy.collective=gloo"])
    expect = []
    for r, name in enumerate(ranks):
        heard, answered = barrier_peers(r, len(ranks))
        expect.append((name, sorted(ranks[i] for i in heard), sorted(ranks[i] for i in answered), 0))
    assert sorted(calls) == sorted(expect)  # one call per vworker, none twice

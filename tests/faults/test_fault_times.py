"""Each fault kind's exact virtual-time effect in a small scenario (docs/faults.md), to the nanosecond.

The probe strategies (tests/faults/probe.py) train nothing: w0 sends 1000-byte messages to w1 and w2 at
0, 10 and 20 ms; a sink records each delivery. L = 1 ms, B = 1 MB/s: a message takes L + S/B = 2 ms
uncontended (``unlimited`` NICs), so every time below is derived by hand.
"""
from __future__ import annotations

import pytest

from agents.sim import keyed

MS = 1_000_000
PROBE = "tests.faults.probe"
NET = [f"strategy._target_={PROBE}.Net", "workers=1", "stop.updates=null", "stop.virtual_time=1s",
       "network.latency=1ms", "network.bandwidth=1000000", "network.discipline=unlimited"]


def deliveries(ran, name: str) -> list[tuple[int, int]]:
    """(delivered at ns, message index) of every row of vworker ``name``."""
    return [(int(r["virtual_time_ns"]), int(r["iteration"])) for r in ran.rows() if r["vworker"] == name]


def test_without_faults_every_message_takes_latency_plus_size_over_bandwidth(run):
    ran = run(NET)
    for sink in ("w1", "w2"):
        assert deliveries(ran, sink) == [(2 * MS, 0), (12 * MS, 1), (22 * MS, 2)]


def test_a_partition_delays_exactly_the_messages_sent_across_it_until_it_heals(run):
    ran = run([*NET, "faults=[{kind:partition,groups:[[w0,w2],[w1]],at:5ms,until:15ms}]"])
    # w0 -> w1 at 10 ms crosses the partition: it leaves at 15 ms, arrives 2 ms later
    assert deliveries(ran, "w1") == [(2 * MS, 0), (17 * MS, 1), (22 * MS, 2)]
    # w0 -> w2 stays inside one group: untouched
    assert deliveries(ran, "w2") == [(2 * MS, 0), (12 * MS, 1), (22 * MS, 2)]


def test_partitions_that_overlap_hold_a_message_until_the_last_one_heals(run):
    ran = run([*NET, "faults=[{kind:partition,groups:[[w0],[w1]],at:5ms,until:15ms},"
                     "{kind:partition,groups:[[w0],[w1,w2]],at:14ms,until:18ms}]"])
    assert deliveries(ran, "w1") == [(2 * MS, 0), (20 * MS, 1), (22 * MS, 2)]


def test_message_loss_over_an_interval_drops_exactly_the_messages_sent_in_it(run):
    ran = run([*NET, "faults=[{kind:loss,at:5ms,until:15ms}]"])
    for sink in ("w1", "w2"):
        assert deliveries(ran, sink) == [(2 * MS, 0), (22 * MS, 2)]


def test_message_loss_with_a_probability_is_a_keyed_draw_per_message(run):
    at = [float(i) for i in range(20)]
    ran = run([*NET, f"+strategy.at_ms={at}", "faults=[{kind:loss,probability:0.5}]", "seed=7"])
    for dst, sink in ((1, "w1"), (2, "w2")):
        # w0's message counter: message i goes to w1 as number 2i+1 and to w2 as 2i+2
        kept = [i for i in range(20) if keyed.uniform(7, "fault", 0, 0, dst, 2 * i + dst) >= 0.5]
        assert 0 < len(kept) < 20
        assert deliveries(ran, sink) == [((i + 2) * MS, i) for i in kept]


def test_duplication_delivers_a_second_copy_at_the_same_instant(run):
    ran = run([*NET, "faults=[{kind:duplicate,workers:[w0],at:5ms,until:15ms}]"])
    for sink in ("w1", "w2"):
        assert deliveries(ran, sink) == [(2 * MS, 0), (12 * MS, 1), (12 * MS, 1), (22 * MS, 2)]


def test_a_slow_nic_sends_at_its_reduced_rate_over_the_interval(run):
    ran = run([*NET, "faults=[{kind:slow_link,workers:[w0],factor:0.5,at:5ms,until:15ms}]"])
    # at 10 ms w0's NIC has 0.5 MB/s: the last byte leaves at 12 ms and arrives at 13 ms
    for sink in ("w1", "w2"):
        assert deliveries(ran, sink) == [(2 * MS, 0), (13 * MS, 1), (22 * MS, 2)]


def test_a_slow_nic_shared_fairly_reshares_at_the_fault_boundaries(run):
    ran = run([*NET, "network.discipline=fair", "faults=[{kind:slow_link,workers:[w0],factor:0.5,at:5ms,until:15ms}]"])
    # fair: two transfers share w0's NIC; 1 MB/s -> 2 ms each (arrive at 3 ms), 0.5 MB/s -> 4 ms (at 15 ms)
    for sink in ("w1", "w2"):
        assert deliveries(ran, sink) == [(3 * MS, 0), (15 * MS, 1), (23 * MS, 2)]


COMPUTE = [f"strategy._target_={PROBE}.Compute", "workers=1", "stop.updates=null", "stop.virtual_time=1s",
           "compute.gradient=0.01"]


def ends(ran) -> list[int]:
    return [int(r["virtual_time_ns"]) for r in ran.rows()]


def test_a_straggler_interval_slows_exactly_the_compute_calls_that_start_in_it(run):
    ran = run([*COMPUTE, "faults=[{kind:straggler,workers:[w0],factor:3,at:5ms,until:25ms}]"])
    # calls start at 0 (outside: 10 ms), 10 ms (inside: 30 ms), 40 ms (outside again: 10 ms)
    assert ends(ran) == [10 * MS, 40 * MS, 50 * MS]


def test_a_straggler_probability_is_a_keyed_draw_per_compute_call(run):
    ran = run([*COMPUTE, "+strategy.steps=1", "faults=[{kind:straggler,workers:[w0],factor:2,probability:0.5}]",
               "seed=3"])
    w = ran.worker("w0")
    assert w.compute_seq == 3
    t, expected = 0, []
    for seq in range(3):
        t += 10 * MS * (2 if keyed.uniform(3, "fault", 0, 0, seq) < 0.5 else 1)
        expected.append(t)
    assert ends(ran) == expected


TICKS = [f"strategy._target_={PROBE}.Ticks", "workers=1", "stop.updates=null", "stop.virtual_time=1s",
         "network.latency=1ms", "faults=[{kind:crash,workers:[w0,w1,w2,w3],at:15ms,until:32ms}]"]


def rows_of(ran, name: str) -> list[tuple[int, int, int]]:
    return [(int(r["virtual_time_ns"]), int(r["iteration"]), int(r["staleness"])) for r in ran.rows()
            if r["vworker"] == name]


def test_a_crashed_vworker_that_freezes_continues_where_it_was_at_recovery(run):
    ran = run(TICKS)
    # w0 ticks every 10 ms; frozen over [15, 32) ms its 20 ms tick waits until 32 ms
    assert rows_of(ran, "w0") == [(10 * MS, 0, 0), (32 * MS, 1, 0), (42 * MS, 2, 0), (52 * MS, 3, 0), (62 * MS, 4, 0)]
    # w2 (frozen) still receives: the message of 20 ms (arrived at 21 ms) is read at the thaw
    assert rows_of(ran, "w2") == [(32 * MS, 0, 20 * MS), (41 * MS, 1, 40 * MS)]


def test_a_crashed_vworker_that_restarts_loses_its_state_and_the_messages_sent_to_it(run):
    ran = run(TICKS)
    # w1 restarts at 32 ms from tick 0 (staleness 1: restarted)
    assert rows_of(ran, "w1") == [(10 * MS, 0, 0)] + [((42 + 10 * i) * MS, i, 1) for i in range(5)]
    # w3 was down when the 20 ms message arrived: lost; the 40 ms one reaches the restarted process
    assert rows_of(ran, "w3") == [(41 * MS, 1, 40 * MS)]
    assert ran.worker("w1").incarnation == 1 and ran.worker("w0").incarnation == 0


def test_overlapping_crashes_restart_a_vworker_once_when_the_last_one_ends(run):
    ran = run([*TICKS[:-1], "faults=[{kind:crash,workers:[w1],at:15ms,until:32ms},"
                            "{kind:crash,workers:[w1],at:25ms,until:40ms}]"])
    assert rows_of(ran, "w1") == [(10 * MS, 0, 0)] + [((50 + 10 * i) * MS, i, 1) for i in range(5)]
    assert ran.worker("w1").incarnation == 1


def test_stop_updates_stops_a_run_that_also_has_a_later_stop_virtual_time(run):
    # (found with the fault experiments, which set stop.virtual_time: the first condition to fire wins)
    ran = run(["strategy=ps_sync", "workers=2", "stop.updates=3", "stop.virtual_time=100s"])
    assert ran.summary["updates"] == 3 and ran.summary["stopped_by"] == "updates"
    assert ran.summary["virtual_time_ns"] == int(ran.rows()[-1]["virtual_time_ns"])

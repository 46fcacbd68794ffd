"""Virtual times of the strategies against closed forms, and heterogeneity applied exactly as configured."""
from __future__ import annotations

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

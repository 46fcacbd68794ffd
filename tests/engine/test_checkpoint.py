"""Checkpoints of an agent (agents.checkpoint): a core restored from a snapshot taken between two windows
finishes the run exactly as the core it was taken from — the same rows, parameters, events and end time."""
from __future__ import annotations

import pytest
import torch

from agents import checkpoint
from agents.checkpoint import NotCheckpointable
from agents.core import AgentCore
from agents.sim.types import INFINITY
from controller.config import load
from controller.plan import make_plan
from tests import helpers

BASE = [*helpers.FAST, "agents=1", "workers=4", "stop.updates=60", "eval.every=20", "network.latency=1ms"]
# every kind of fault at once (as tests/faults/test_fault_identity.py): crashes and restarts, a partition,
# keyed loss and duplication, a slow NIC, stragglers and a Byzantine worker
FAULTS = ("faults=[{kind:crash,workers:[w3],at:20ms,until:90ms},"
          "{kind:partition,groups:[[w1,w2],[w0,w3,w4,w5,ps0]],at:30ms,until:60ms},"
          "{kind:duplicate,workers:[w5],probability:0.3},"
          "{kind:loss,workers:[w4],probability:0.2,at:100ms,until:130ms},"
          "{kind:slow_link,workers:[w2],factor:0.25,at:0,until:80ms},"
          "{kind:straggler,fraction:0.34,factor:3,probability:0.5},"
          "{kind:byzantine,workers:[w5],mode:noise,std:0.1}]")


def _plan(overrides: list[str]):
    return make_plan(load([*BASE, *overrides]), run_id="ckpt")


@pytest.fixture(scope="module")
def data():
    return AgentCore(_plan([]), 0).training.data


@pytest.mark.parametrize("overrides", [
    ["strategy=ps_async"],
    ["strategy=ps_sync", "compute.aggregate=0.002"],
    ["strategy=ssp", "strategy.staleness_bound=1"],
    ["strategy=ps_async", "network=tcp"],
    ["strategy=ps_async", "strategy.collective=gloo"],
    ["strategy=ps_sync", "compute.batch=vmap"],
    ["strategy=ps_async", "compute.batch=off"],
    ["strategy=ps_async", "compute.batch=loop", "compute.overlap=true"],
    ["strategy=ps_async", "workers=6", "network.bandwidth=100Mbit/s", "compute.gradient=0.005", FAULTS],
], ids=lambda o: " ".join(o)[:60])
def test_a_core_restored_from_a_checkpoint_finishes_the_run_exactly_as_the_one_it_was_taken_from(data, overrides):
    plan = _plan(overrides)
    whole, updates, evals, cuts = helpers.whole_run_and_cuts(plan, data)
    assert len(updates) == 60
    for cut in cuts:
        before = AgentCore(plan, 0, data=data)
        u0, e0 = helpers.core_rows(before.advance(cut))
        assert len(u0) < 60
        blob = checkpoint.snapshot(before)
        before.close()
        after = checkpoint.restore(plan, 0, blob, data=data)
        u1, e1 = helpers.core_rows(after.advance(INFINITY))
        assert u0 + u1 == updates, cut
        assert e0 + e1 == evals, cut
        assert torch.equal(after.result_params(), whole.result_params())
        assert (after.kernel.now, after.kernel.events_processed) == (whole.kernel.now, whole.kernel.events_processed)
        after.close()
    whole.close()


@pytest.mark.parametrize("strategy", ["ps_async", "ps_sync"])
def test_a_restored_core_can_be_checkpointed_again_and_again_and_still_ends_identically(data, strategy):
    plan = _plan([f"strategy={strategy}", "compute.aggregate=0.002"])
    whole, updates, _, cuts = helpers.whole_run_and_cuts(plan, data)
    core = AgentCore(plan, 0, data=data)
    got: list = []
    for cut in (*cuts, INFINITY):
        got += helpers.core_rows(core.advance(cut))[0]
        if cut < INFINITY:
            core = checkpoint.restore(plan, 0, checkpoint.snapshot(core), data=data)
    assert got == updates
    assert torch.equal(core.result_params(), whole.result_params())
    assert (core.kernel.now, core.kernel.events_processed) == (whole.kernel.now, whole.kernel.events_processed)


def test_a_strategy_without_tails_is_refused_naming_the_vworker_and_where_it_waits(data):
    core = AgentCore(_plan(["strategy=ring_allreduce"]), 0, data=data)
    core.advance(20_000_001)
    with pytest.raises(NotCheckpointable, match=r"^vworker w0 is suspended in RingWorker\.run, which its strategy "
                                                r"\(RingWorker\) cannot checkpoint"):
        checkpoint.snapshot(core)


def test_a_damaged_or_foreign_checkpoint_is_refused_with_one_sentence(data):
    plan = _plan(["strategy=ps_async"])
    core = AgentCore(plan, 0, data=data)
    core.advance(10_000_001)
    blob = checkpoint.snapshot(core)
    with pytest.raises(NotCheckpointable, match=r"^the checkpoint of agent 0 cannot be read: "):
        checkpoint.restore(plan, 0, blob[: len(blob) // 2], data=data)
    other = make_plan(load([*BASE, "strategy=ps_async"]), run_id="another")
    with pytest.raises(NotCheckpointable, match=r"^the checkpoint is agent 0's of run ckpt, not agent 0's of run "
                                                r"another$"):
        checkpoint.restore(other, 0, blob, data=data)


def test_a_checkpoint_holds_the_data_set_by_reference_not_by_value(data):
    core = AgentCore(_plan(["strategy=ps_async"]), 0, data=data)
    core.advance(10_000_001)
    blob = checkpoint.snapshot(core)
    assert len(blob) < data.train_x.numel() * data.train_x.element_size() // 10


def test_tensors_that_share_memory_still_share_it_after_a_restore(data):
    plan = _plan(["strategy=ps_async"])
    core = AgentCore(plan, 0, data=data)
    core.advance(10_000_001)
    w = core.workers["w1"]
    w.base = torch.arange(10.0)
    w.view = w.base[2:5]
    again = checkpoint.restore(plan, 0, checkpoint.snapshot(core), data=data).workers["w1"]
    again.base[3] = -1.0
    assert again.view.tolist() == [2.0, -1.0, 4.0]

"""Checkpoints of an agent (agents.checkpoint): a core restored from a snapshot taken between two windows
finishes the run exactly as the core it was taken from — the same rows, parameters, events and end time."""
from __future__ import annotations

import contextlib
import pickle

import numpy as np
import pytest
import torch

from agents import checkpoint
from agents.checkpoint import NotCheckpointable
from agents.core import AgentCore
from agents.sim import resume
from agents.sim.types import INFINITY
from agents.sim.worker import Worker
from agents.strategies.base import Strategy, VWorkerSpec
from controller.config import load
from controller.plan import make_plan
from tests import helpers
from tests.faults.test_fault_identity import FAULTS  # every kind of fault at once

BASE = [*helpers.FAST, "agents=1", "workers=4", "eval.every=10", "network.latency=1ms"]
SLOW = ["compute.gradient=0.005", "eval.every=2"]  # (short runs: a gradient long enough for faults to bite)
LAYERWISE = ["compute.layerwise=true", "network.bandwidth=1e8", "stop.updates=10", "eval.every=5"]
END_DEVICES = ["data.placement=end_devices", "data.cache=lru", "data.cache_size=40", "data.end_devices=2",
               "batch_size=8", "stop.updates=20"]
CASES = [
    ["strategy=ps_async"],
    ["strategy=ps_sync", "compute.aggregate=0.002"],
    ["strategy=ssp", "strategy.staleness_bound=1"],
    ["strategy=ps_async", "network=tcp"],
    ["strategy=ps_async", "strategy.collective=gloo"],
    ["strategy=ps_sync", "compute.batch=vmap"],
    ["strategy=ps_async", "compute.batch=off"],
    ["strategy=ps_async", "compute.batch=loop", "compute.overlap=true"],
    ["strategy=ps_async", "workers=6", "network.bandwidth=100Mbit/s", "compute.gradient=0.005", FAULTS],
    ["strategy=ps_sync", "workers=6", "network.bandwidth=100Mbit/s", "compute.gradient=0.005", "eval.every=4",
     "faults=[{kind:crash,workers:[w3],at:20ms,until:90ms},{kind:duplicate,workers:[w5],probability:0.3}]"],
    ["strategy=ssp", "strategy.staleness_bound=0", "compute.layerwise=true", "network.discipline=fair"],
    ["strategy=ps_async", "strategy.start_after=3ms"],
    ["strategy=ps_sync", "strategy.shards=2", "stop.updates=10"],
    ["strategy=sgd", "workers=1", "stop.updates=12", "eval.every=4"],
    ["strategy=ring_allreduce", "stop.updates=8", "eval.every=4", "compute.aggregate=0.001"],
    ["strategy=ring_allreduce", "strategy.segment=100000", "stop.updates=4", "eval.every=2"],
    ["strategy=ring_allreduce", "strategy.collective=gloo", "stop.updates=4", "eval.every=2",
     "compute.aggregate=0.0005", "strategy.start_after=5ms"],
    ["strategy=ring_allreduce", "strategy.collective=gloo", "network=tcp", "network.tcp.delayed_ack=true",
     "stop.updates=4", "eval.every=2"],
    ["strategy=local_sgd", "strategy.local_steps=2", "stop.updates=4", "eval.every=2"],
    ["strategy=hierarchical_allreduce", "strategy.group_size=3", "stop.updates=6", "eval.every=3",
     "compute.aggregate=0.001", "strategy.start_after=2ms"],
    ["strategy=hierarchical_allreduce", "strategy.group_size=2", "strategy.collective=gloo", "stop.updates=4",
     "eval.every=2"],
    ["strategy=gossip", "stop.updates=8", "eval.every=4", "compute.aggregate=0.001"],
    ["strategy=fedavg", "strategy.local_steps=2", "stop.updates=8", "eval.every=2", "compute.aggregate=0.001",
     "strategy.round_timeout=100ms"],
    ["strategy=fedasync", "strategy.local_steps=2", "stop.updates=10", "eval.every=5", "compute.aggregate=0.001"],
    ["strategy=microbench", "stop.updates=8", "eval.every=0"],
    ["strategy=microbench", "strategy.kind=fanin", "workers=3", "stop.updates=8", "eval.every=0"],
    # faults in the federated and collective strategies (as tests/faults/test_fault_identity.py)
    ["strategy=fedavg", "workers=5", "strategy.local_steps=2", "strategy.fraction=0.6", "strategy.round_timeout=200ms",
     "stop.updates=6", *SLOW, "faults=[{kind:crash,fraction:0.2,at:10ms,until:300ms},{kind:loss,probability:0.1}]"],
    ["strategy=ring_allreduce", "stop.updates=6", *SLOW,
     "faults=[{kind:crash,workers:[w2],at:10ms,until:150ms},{kind:byzantine,workers:[w1],mode:scale,factor:-2}]"],
    ["strategy=gossip", "stop.updates=6", *SLOW,
     "faults=[{kind:crash,workers:[w3],at:5ms,until:80ms},{kind:partition,groups:[[w0,w1],[w2,w3]],at:20ms,"
     "until:50ms}]"],
    # compute.layerwise: the ring's per-layer all-reduces, the PS's per-layer messages (fair and fifo egress)
    ["strategy=ring_allreduce", "workers=2", "compute.allreduce_share=0.5", *LAYERWISE, "data.placement=end_devices",
     "data.end_devices=2", "batch_size=8"],
    ["strategy=ps_sync", "workers=3", "network.discipline=fair", *LAYERWISE],
    ["strategy=ps_async", "workers=2", "network.discipline=fair", *LAYERWISE, "network.bandwidth=1e6", "stop.updates=6",
     "data.placement=end_devices", "data.end_devices=2", "batch_size=8"],
    ["strategy=ps_async", "workers=2", "network.discipline=fifo", *LAYERWISE],
    # the training data on the end devices, over a star and over the tree topology
    ["strategy=ps_async", "workers=3", *END_DEVICES],
    ["strategy=ring_allreduce", "workers=3", "network.topology=tree", "network.links.bandwidth=125e6",
     "network.links.latency=100us", *END_DEVICES],
    # a fat tree crowded enough that its flows are shared as columns (agents.sim.topology.COLUMNS_FROM)
    ["strategy=ps_async", "workers=70", "batch_size=4", "network.topology=fat_tree", "network.links.latency=10us",
     "stop.updates=20", "eval.every=10"],
]


def _updates(plan) -> int:
    return plan.settings["stop_updates"]


def _plan(overrides: list[str]):
    return make_plan(load([*BASE, "stop.updates=30", *overrides]), run_id="ckpt")


RAN: set[str] = set()  # the tails a restored core ran, and the cases that ran (see the last test)
DONE: set[str] = set()


class _Noting(dict):
    """The registry of tails (agents.sim.resume), noting each tail a restored coroutine runs."""

    def __getitem__(self, name: str):
        RAN.add(name)
        return super().__getitem__(name)


@pytest.fixture(scope="module", autouse=True)
def _note_the_tails_that_run():
    tails = resume._TAILS
    resume._TAILS = _Noting(tails)  # (a strategy module imported meanwhile registers its tails there)
    yield
    tails.update(resume._TAILS)
    resume._TAILS = tails


@pytest.fixture(scope="module")
def data():
    return AgentCore(_plan([]), 0).training.data


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: " ".join(o)[:60])
def test_a_core_restored_from_a_checkpoint_finishes_the_run_exactly_as_the_one_it_was_taken_from(data, overrides):
    plan = _plan(overrides)
    whole, updates, evals, cuts = helpers.whole_run_and_cuts(plan, data)
    assert len(updates) == _updates(plan)
    for cut in cuts:
        before = AgentCore(plan, 0, data=data)
        u0, e0 = helpers.core_rows(before.advance(cut))
        assert len(u0) < _updates(plan)
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
    DONE.add(" ".join(overrides))


@pytest.mark.parametrize("overrides", [
    ["strategy=ps_async", "compute.batch=loop", "compute.overlap=true"],
    ["strategy=ps_async", "compute.batch=auto", "compute.overlap=true", "model=cnn"],
    ["strategy=ps_sync", "compute.batch=vmap", "compute.overlap=true"],
], ids=lambda o: " ".join(o)[:60])
def test_taking_checkpoints_changes_nothing_in_the_run_they_are_taken_from(data, overrides):
    """A snapshot reads the agent — with the executor's thread paused — and leaves it as it was: the run goes on
    to the same rows (a snapshot once marked the running executor's queued batches as not offered, and its
    thread later failed on them)."""
    plan = _plan(overrides)
    whole, updates, evals, cuts = helpers.whole_run_and_cuts(plan, data)
    core = AgentCore(plan, 0, data=data)
    got_u: list = []
    got_e: list = []
    for cut in (*cuts, INFINITY):
        u, e = helpers.core_rows(core.advance(cut))
        got_u += u
        got_e += e
        if cut < INFINITY:
            checkpoint.snapshot(core)
    assert (got_u, got_e) == (updates, evals)
    assert torch.equal(core.result_params(), whole.result_params())
    core.close()
    whole.close()


@pytest.mark.parametrize("overrides", [CASES[i] for i in (1, 4, 8, 13, 14, 17, 23, 26, 28, 31)],
                         ids=lambda o: " ".join(o)[:60])
def test_a_restored_core_can_be_checkpointed_again_and_again_and_still_ends_identically(data, overrides):
    plan = _plan(overrides)
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


class Ping(Worker):
    """Two vworkers passing a counter back and forth: a loop in ``run`` itself, and no tails."""

    async def run(self):
        peer = "w1" if self.name == "w0" else "w0"
        if self.name == "w0":
            self.send(peer, 1, tag="ping")
        while True:
            m = await self.recv(tag="ping")
            self.send(peer, m.payload + 1, tag="ping")


class NoTails(Strategy):
    name = "notails"
    result = "w0"

    @classmethod
    def layout(cls, workers, settings):
        return [VWorkerSpec(f"w{i}", f"{__name__}.Ping", {}) for i in range(workers)]


def test_where_a_strategy_has_no_tail_a_checkpoint_is_refused_naming_the_vworker_and_where_it_waits(data):
    core = AgentCore(_plan([f"strategy._target_={__name__}.NoTails", "strategy.name=notails", "workers=2"]), 0,
                     data=data)
    core.advance(20_000_001)
    with pytest.raises(NotCheckpointable, match=r"^vworker w0 is suspended in Ping\.run, which its strategy "
                                                r"\(Ping\) cannot checkpoint \(docs/recovery\.md\)$"):
        checkpoint.snapshot(core)


def test_a_damaged_or_foreign_checkpoint_is_refused_with_one_sentence(data):
    plan = _plan(["strategy=ps_async"])
    core = AgentCore(plan, 0, data=data)
    core.advance(10_000_001)
    blob = checkpoint.snapshot(core)
    with pytest.raises(NotCheckpointable, match=r"^the checkpoint of agent 0 cannot be read: "):
        checkpoint.restore(plan, 0, blob.tobytes()[: len(blob) // 2], data=data)
    with pytest.raises(NotCheckpointable, match=r"^the checkpoint of agent 0 cannot be read: "):
        checkpoint.restore(plan, 0, blob.tobytes()[:5], data=data)
    older = pickle.dumps({"format": 1, "storages": {}}, protocol=5)  # what a lockstep before format 2 began with
    with pytest.raises(NotCheckpointable, match=r"^the checkpoint of agent 0 has format 1; this lockstep reads "
                                                r"format 2$"):
        checkpoint.restore(plan, 0, len(older).to_bytes(8, "little") + older, data=data)
    other = make_plan(load([*BASE, "strategy=ps_async"]), run_id="another")
    with pytest.raises(NotCheckpointable, match=r"^the checkpoint is agent 0's of run ckpt, not agent 0's of run "
                                                r"another$"):
        checkpoint.restore(other, 0, blob, data=data)


def test_a_checkpoint_holds_the_data_set_by_reference_not_by_value(data):
    core = AgentCore(_plan(["strategy=ps_async"]), 0, data=data)
    core.advance(10_000_001)
    blob = checkpoint.snapshot(core)
    assert len(blob) < data.train_x.numel() * data.train_x.element_size() // 10


def test_a_checkpoint_copies_each_storage_once_and_is_never_joined(data):
    """The agent's checkpoint is its pieces side by side — head, graph, and one buffer with every storage's
    bytes — so saving 3 GB of tensors costs 3 GB more, not three times that (docs/recovery.md)."""
    core = AgentCore(_plan(["strategy=ps_async"]), 0, data=data)
    core.advance(10_000_001)
    at = (core.kernel.now, core.kernel.events_processed, core.workers["ps0"].params())
    blob = checkpoint.snapshot(core)
    n_head = int.from_bytes(blob.pieces[0], "little")
    head = pickle.loads(blob.pieces[1])
    assert [m.nbytes for m in blob.pieces[:3]] == [8, n_head, head["graph"]] and len(blob.pieces) == 4
    table = head["storages"]
    assert blob.pieces[3].nbytes == sum(n for _, _, n in table) >= at[2].nbytes
    assert [off for _, off, _ in table] == [sum(n for _, _, n in table[:i]) for i in range(len(table))]
    # the buffer is a copy: the run goes on (and changes its tensors) while the checkpoint is written
    whole = blob.tobytes()
    core.advance(INFINITY)
    assert not torch.equal(core.workers["ps0"].params(), at[2])
    assert blob.tobytes() == whole and len(blob) == len(whole)
    assert b"".join(blob.chunks(4096)) == whole
    for saved in (blob, whole, memoryview(whole)):
        c = checkpoint.restore(core.plan, 0, saved, data=data)
        assert (c.kernel.now, c.kernel.events_processed) == at[:2]
        assert torch.equal(c.workers["ps0"].params(), at[2])
        c.close()
    core.close()


def test_a_live_checkpoint_views_the_tensors_in_place_for_a_caller_that_writes_it_at_once(data):
    """An in-process core between two of the controller's windows is written before it runs again, so its
    storages are not copied at all (controller.run: commit_now)."""
    core = AgentCore(_plan(["strategy=ps_async"]), 0, data=data)
    core.advance(10_000_001)
    at = (core.kernel.now, core.kernel.events_processed, core.workers["ps0"].params())
    live = checkpoint.snapshot(core, live=True)
    copied = checkpoint.snapshot(core)
    assert live.live and not copied.live and len(live) == len(copied)
    addresses = {np.frombuffer(m, dtype=np.uint8).ctypes.data for m in live.pieces[3:]}
    params = list(core.workers["ps0"].model.parameters())
    assert all(p.untyped_storage().data_ptr() in addresses for p in params), "the model's own memory"
    assert not {np.frombuffer(copied.pieces[3], dtype=np.uint8).ctypes.data} & addresses
    whole = live.tobytes()
    c = checkpoint.restore(core.plan, 0, whole, data=data)
    assert (c.kernel.now, c.kernel.events_processed) == at[:2] and torch.equal(c.workers["ps0"].params(), at[2])
    c.close()
    core.close()


NEVER_RUN = {  # tails no run can reach, kept so that a later change cannot make a frame unsaveable
    "agents.strategies.fedavg:FedClient.run": "a client's loop never ends",
    "agents.strategies.collective:_GlooPair.flush": "gloo's ring waited for every send (wait_sent) before",
    "agents.strategies.collective:_GlooRing.finish": "(the same)",
}


def test_every_tail_ran_in_a_restored_core():
    """The cases above cut where every tail continues a frame (each class's chains of frames), so a wrong
    tail changes some case's rows, parameters or events."""
    if len(DONE) < len(CASES):
        pytest.skip("runs after every case of the parametrized test")
    missing = sorted(n for n in set(resume._TAILS) - RAN if n.startswith("agents."))  # (not tests' and docs')
    assert missing == sorted(NEVER_RUN), f"no case ran these tails: {', '.join(missing)}"


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


@pytest.mark.parametrize("step", [1, 7, 4096, 1 << 20])
def test_a_checkpoint_taken_piece_by_piece_restores_the_core_its_bytes_restore(data, step):
    """agents.checkpoint.Taking (an agent's restore, agents/agent.py): the pieces of pack_checkpoint's bytes, cut
    anywhere, give the core restore() gives from the whole, each storage's bytes written straight into its tensor,
    and the core finishes the run as the undisturbed one; the storages' tensors are allocated inside ``allocating``."""
    from agents.mesh import pack_checkpoint, taken_checkpoint

    plan = _plan(["strategy=ps_async"])
    whole, updates, _, cuts = helpers.whole_run_and_cuts(plan, data)
    core = AgentCore(plan, 0, data=data)
    u0 = helpers.core_rows(core.advance(cuts[len(cuts) // 2]))[0]
    view = {"windows": 3, "next_t": [5]}
    packed = pack_checkpoint(3, view, checkpoint.snapshot(core)).tobytes()
    core.close()
    entered = []

    @contextlib.contextmanager
    def allocating():
        entered.append(len(taking.storages))
        yield
        entered.append(len(taking.storages))

    taking = checkpoint.Taking(allocating)
    for i in range(0, len(packed), step):
        taking.feed(packed[i:i + step])
    taking.done()
    d = taken_checkpoint(taking)
    assert (d["window"], d["view"]) == (3, view) and entered == [0, len(taking.storages)] and entered[1] > 0
    again = checkpoint.restore(plan, 0, taken=taking, data=data)
    assert helpers.core_rows(again.advance(INFINITY))[0] == updates[len(u0):]
    assert torch.equal(again.result_params(), whole.result_params())
    again.close()
    whole.close()


def test_a_checkpoint_taken_piece_by_piece_refuses_too_few_too_many_or_overlapping_bytes(data):
    from agents.common.files import headed
    from agents.mesh import pack_checkpoint

    core = AgentCore(_plan(["strategy=ps_async"]), 0, data=data)
    core.advance(10_000_001)
    packed = pack_checkpoint(3, {}, checkpoint.snapshot(core)).tobytes()
    core.close()
    short = checkpoint.Taking()
    short.feed(packed[:-1])
    with pytest.raises(ValueError, match=r"^the checkpoint ended early \(in its storages, after \d+ of \d+ storage "):
        short.done()
    extra = checkpoint.Taking()
    with pytest.raises(ValueError, match="^1 bytes more than the checkpoint's$"):
        extra.feed(packed + b"x")
    table = [(("cpu", 0, 0), 0, 8), (("cpu", 0, 1), 4, 8)]  # the second begins inside the first
    for core_head, error, match in [
            ({"format": 2, "storages": table, "graph": 0}, ValueError, "^the storage at 4 overlaps the one before it"),
            ({"format": 1, "graph": 0}, NotCheckpointable, "^has format 1; this lockstep reads format 2$")]:
        core_bytes = headed(core_head, [bytes(12)]).tobytes()
        with pytest.raises(error, match=match):
            checkpoint.Taking().feed(headed({"format": 2, "core": len(core_bytes)}, [core_bytes]).tobytes())

"""What a version is and which versions are evaluated: FedAvg counts aggregations (a round that ends without an
update is no update), and a sharded asynchronous PS evaluates at every multiple of eval.every."""
from __future__ import annotations

import pytest
import torch

from agents.strategies.fedavg import sample_clients
from agents.strategies.ps import PSWorker

MS = 1_000_000
# c1 is down for the first 500 ms: a round that chooses it before then ends at its 50 ms timeout without an
# update (tester's report: 22 updates for stop.updates=30, iterations 1, 2, 4, 6, 7, 9, ...)
EMPTY = ["strategy=fedavg", "workers=2", "strategy.fraction=0.5", "strategy.local_steps=1",
         "strategy.round_timeout=50ms", "faults=[{kind:crash,workers:[c1],at:0,until:500ms}]", "stop.updates=30"]


def _iterations(rows) -> list[int]:
    return [int(r["iteration"]) for r in rows]


def _no_wall(rows) -> list[dict[str, str]]:
    return [{k: v for k, v in r.items() if not k.startswith("wall_")} for r in rows]


def test_fedavg_rounds_left_empty_by_a_crash_leave_the_model_and_its_version_as_they_were(run):
    ran = run(EMPTY)
    rows, server = ran.rows(), ran.worker("server")
    assert ran.summary["updates"] == 30 and ran.summary["stopped_by"] == "updates"
    assert _iterations(rows) == list(range(1, 31))  # no gaps where a round was empty
    assert server.version == 30 and server.rnd == 36  # six rounds were empty
    # the rounds keep their own counter: the keyed draw of each round is unchanged
    assert server.history == [sample_clients(server.env.seed, r, 2, 0.5) for r in range(36)]
    # a round takes 23.17664 ms when its client answers, 50 ms when it is c1 before 500 ms (then no row)
    step, t, expected, empty = int(rows[0]["virtual_time_ns"]), 0, [], []
    for rnd, chosen in enumerate(server.history):
        if chosen == [1] and t < 500 * MS:
            t += 50 * MS
            empty.append(rnd)
        else:
            t += step
            expected.append(t)
    assert step == 23_176_640 and empty == [2, 4, 7, 9, 14, 15]
    assert [int(r["virtual_time_ns"]) for r in rows] == expected


def test_fedavg_without_empty_rounds_has_a_version_per_round(run):
    ran = run(["strategy=fedavg", "workers=4", "strategy.fraction=0.5", "strategy.local_steps=1", "stop.updates=7",
               "strategy.round_timeout=1s"])
    server = ran.worker("server")
    assert _iterations(ran.rows()) == list(range(1, 8))
    assert server.rnd == server.version == 7


def test_a_fedavg_server_checkpointed_before_versions_were_counted_goes_on_numbering_by_round():
    from agents import checkpoint
    from agents.core import AgentCore
    from agents.sim.types import INFINITY
    from controller.config import load
    from controller.plan import make_plan
    from tests import helpers

    plan = make_plan(load([*helpers.FAST, "agents=1", "workers=4", "network.latency=1ms", "eval.every=2",
                           "strategy=fedavg", "strategy.local_steps=2", "stop.updates=8",
                           "strategy.round_timeout=100ms"]), run_id="ckpt")
    whole, updates, evals, _ = helpers.whole_run_and_cuts(plan)
    assert [row[3] for _, row in updates] == list(range(1, 9))
    before = AgentCore(plan, 0, data=whole.training.data)
    u0, e0 = helpers.core_rows(before.advance(int(updates[3][1][0]) + 1))  # past the 4th update
    server = before.workers["server"]
    assert server.version == server.rnd == 4
    del server.version  # as a server of before this attribute was
    blob = checkpoint.snapshot(before)
    before.close()
    after = checkpoint.restore(plan, 0, blob, data=whole.training.data)
    u1, e1 = helpers.core_rows(after.advance(INFINITY))
    assert u0 + u1 == updates and e0 + e1 == evals
    assert after.workers["server"].version == 8
    assert torch.equal(after.result_params(), whole.result_params())
    after.close()
    whole.close()


SHARDED = ["strategy=ps_async", "workers=3", "eval.every=5", "eval.samples=500", "stop.updates=40"]


def test_a_sharded_async_ps_evaluates_exactly_at_every_multiple_of_eval_every(run):
    # tester's report: eval.csv had 10, 25, 40 (the versions w0 happened to be sent) where one PS has 5, 10, ... 40
    one, two = run(SHARDED), run([*SHARDED, "strategy.shards=2"])
    evals = two.rows("eval.csv")
    assert _iterations(evals) == list(range(5, 41, 5))
    # each multiple v < 40 is evaluated by the one worker ps0 sent v; 40 is the result model's (w0) at the end
    assert [r["vworker"] for r in evals] == ["w1", "w0", "w2", "w1", "w0", "w2", "w1", "w0"]
    # on this network the shards apply the gradients in one order: the model at v is one PS's to the bit
    assert [r["test_loss"] for r in evals[:-1]] == [r["test_loss"] for r in one.rows("eval.csv")[:-1]]
    # evaluations are observers: the rows and the parameters are those of a run without them
    none = run([*SHARDED, "strategy.shards=2", "eval.every=0"])
    assert _no_wall(two.rows()) == _no_wall(none.rows())
    assert torch.equal(two.params, none.params)


def test_a_sharded_async_ps_evaluates_each_version_once_when_a_worker_crashes_and_pulls_a_multiple(run):
    # every=1: the parameters a restarted w1 pulls are of a version ps0 also sent the worker that made it
    ran = run(["strategy=ps_async", "workers=3", "strategy.shards=2", "eval.every=1", "stop.updates=24",
               "faults=[{kind:crash,workers:[w1],at:30ms,until:60ms}]"])
    evals = ran.rows("eval.csv")
    # version 2, made by w1's gradient in flight when it crashed, went to the crashed w1: no one evaluated it
    assert _iterations(evals) == [1, *range(3, 25)]
    assert [r["vworker"] for r in evals[:6]] == ["w0", "w2", "w0", "w2", "w1", "w0"]


def test_a_sharded_ssp_evaluates_at_w0_the_first_version_it_holds_at_or_after_each_multiple(run, monkeypatch):
    held: list[int] = []
    observe = PSWorker._observe

    def spy(self, evals, v, params):
        if self.name == "w0":
            held.append(v)
        return observe(self, evals, v, params)

    monkeypatch.setattr(PSWorker, "_observe", spy)
    common = ["strategy=ssp", "workers=4", "strategy.shards=2", "strategy.staleness_bound=1", "stop.updates=30",
              "network.bandwidth=[1e9,5e8,2e9,1e8]"]
    ran = run([*common, "eval.every=4"])
    evals = ran.rows("eval.csv")
    assert _iterations(evals) == [5, 11, 15, 19, 23, 27, 30]
    assert {r["vworker"] for r in evals} == {"w0"}
    # the rule: the first version w0 holds at or after each multiple (the last row: the result model at the stop)
    firsts = sorted({min(v for v in held if v >= m) for m in range(4, 30, 4) if any(v >= m for v in held)})
    assert firsts == [5, 11, 15, 19, 23, 27]
    held.clear()
    none = run([*common, "eval.every=0"])
    assert _no_wall(ran.rows()) == _no_wall(none.rows())
    assert torch.equal(ran.params, none.params)


def test_a_sharded_sync_ps_still_evaluates_at_w0_when_it_records_a_multiple(run):
    ran = run(["strategy=ps_sync", "workers=3", "strategy.shards=2", "eval.every=5", "stop.updates=12"])
    evals = ran.rows("eval.csv")
    assert [(int(r["iteration"]), r["vworker"]) for r in evals] == [(5, "w0"), (10, "w0"), (12, "w0")]


@pytest.mark.parametrize("overrides,iterations", [
    (["strategy=ps_async", "eval.every=3"], [3, 6, 9, 12, 15, 18]),
    (["strategy=ssp", "strategy.staleness_bound=1", "eval.every=4", "network.bandwidth=[1e9,5e8,2e9,1e8]"],
     [5, 11, 15, 19]),
], ids=["ps_async", "ssp"])
def test_a_sharded_async_ps_restored_from_a_checkpoint_evaluates_as_the_whole_run(overrides, iterations):
    from agents import checkpoint
    from agents.core import AgentCore
    from agents.sim.types import INFINITY
    from controller.config import load
    from controller.plan import make_plan
    from tests import helpers

    plan = make_plan(load([*helpers.FAST, "agents=1", "workers=4", "network.latency=1ms", "strategy.shards=2",
                           "stop.updates=20", *overrides]), run_id="ckpt")
    whole, updates, evals, cuts = helpers.whole_run_and_cuts(plan)
    assert [row[3] for _, row in evals] == iterations
    for cut in cuts:
        before = AgentCore(plan, 0, data=whole.training.data)
        u0, e0 = helpers.core_rows(before.advance(cut))
        blob = checkpoint.snapshot(before)
        before.close()
        after = checkpoint.restore(plan, 0, blob, data=whole.training.data)
        u1, e1 = helpers.core_rows(after.advance(INFINITY))
        assert u0 + u1 == updates and e0 + e1 == evals, cut
        after.close()
    whole.close()


def test_a_sharded_async_ps_evaluates_the_same_rows_on_one_agent_or_two(run):
    # the evaluating worker may sit on another agent than w0: its agent's scratch model evaluates, rows sort as one
    common = ["strategy=ps_async", "workers=4", "strategy.shards=2", "eval.every=3", "stop.updates=20"]
    one, two = run([*common, "agents=1"]), run([*common, "agents=2"])
    assert [(int(r["iteration"]), r["vworker"]) for r in one.rows("eval.csv")] == [
        (3, "w2"), (6, "w1"), (9, "w0"), (12, "w3"), (15, "w2"), (18, "w1"), (20, "w0")]
    assert _no_wall(one.rows("eval.csv")) == _no_wall(two.rows("eval.csv"))
    assert _no_wall(one.rows()) == _no_wall(two.rows())

"""The executor of deferred compute (DESIGN §4.2, agents/sim/executor.py) on hand-built kernels."""
from __future__ import annotations

import threading

import pytest
import torch

from agents.sim.compute import ComputeSpec
from agents.sim.env import Environment
from agents.sim.executor import Executor, ExecutorSpec, TaskArgumentMutated, batch_rule
from agents.sim.kernel import Kernel, WorkerCrashed
from agents.sim.network import ConstantLatency, NetworkSpec
from agents.sim.worker import Worker


def build(workers: dict, batch: str = "loop", overlap: bool = False, latency_ns: int = 1000,
          gradient_s: float = 0.001, max_batch: int = 64):
    names = list(workers)
    n = len(names)
    k = Kernel()
    env = Environment(k, names, NetworkSpec(ConstantLatency(latency_ns), (1e9,) * n, (1e9,) * n, "fifo", "fifo"),
                      ComputeSpec(model="constant", constant_s={"gradient": gradient_s, "update": 0.0,
                                                                "aggregate": 0.0},
                                  batch=batch, overlap=overlap, max_batch=max_batch))
    objs = {}
    for vid, name in enumerate(names):
        cls, kwargs = workers[name]
        objs[name] = cls(name, vid, env, **kwargs)
        k.add_worker(objs[name])
    return k, env, objs


class Sharer(Worker):
    """Sends a tensor to ``b`` and then computes on the same tensor (which ``b`` now holds too)."""

    async def run(self):
        t = torch.ones(4)
        self.send("b", t)
        self.result = await self.compute(torch.sum, t)


class Mutator(Worker):
    """Changes the tensor it received in place — while the sender's deferred task still needs it."""

    async def run(self):
        m = await self.recv()
        m.payload.add_(1.0)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_task_whose_argument_is_changed_after_issue_fails_naming_its_vworker(overlap):
    # with overlap, the first call of a function runs on the kernel's thread when its vworker resumes (that
    # run tells whether the function changes its own arguments), so the check before it finds the change
    k, env, objs = build({"a": (Sharer, {}), "b": (Mutator, {})}, overlap=overlap)
    msg = mutation_failure_of_a(k, env)
    assert "changed in place before the vworker resumed" in msg
    assert "compute.batch=off" in msg  # how to get the old, eager behaviour


def mutation_failure_of_a(k, env) -> str:
    """Run to the end, which must fail vworker ``a`` with TaskArgumentMutated on a float32[4]; the message."""
    with pytest.raises(WorkerCrashed) as err:
        k.run_until()
    env.executor.close()
    assert err.value.name == "a"
    assert isinstance(err.value.__cause__, TaskArgumentMutated)
    msg = str(err.value)
    assert "vworker a" in msg and "float32[4]" in msg
    return msg


class Gate:
    """Lets a test change a tensor exactly while a task runs on the executor's background thread."""

    def __init__(self):
        self.running, self.proceed = threading.Event(), threading.Event()


def gated_sum(x, gate=None):
    if gate is not None:  # on the background thread: say so, then wait until the other vworker changed x
        gate.running.set()
        assert gate.proceed.wait(30)
    return x.sum()


class RacingSharer(Worker):
    """Calls ``gated_sum`` once alone (its first run: it leaves its arguments alone), then on a tensor it
    also sends to ``b``, which changes it while that call runs on the background thread."""

    def __init__(self, name, vid, env, gate):
        super().__init__(name, vid, env)
        self.gate = gate

    async def run(self):
        await self.compute(gated_sum, torch.ones(2))
        t = torch.ones(4)
        self.send("b", t)
        self.result = await self.compute(gated_sum, t, self.gate)


class RacingMutator(Worker):
    def __init__(self, name, vid, env, gate):
        super().__init__(name, vid, env)
        self.gate = gate

    async def run(self):
        m = await self.recv()
        assert self.gate.running.wait(30), "the task should be running on the background thread"
        m.payload.add_(1.0)
        self.gate.proceed.set()


def test_a_change_made_while_the_task_runs_on_the_background_thread_fails_naming_its_vworker():
    gate = Gate()
    k, env, objs = build({"a": (RacingSharer, {"gate": gate}), "b": (RacingMutator, {"gate": gate})}, overlap=True)
    msg = mutation_failure_of_a(k, env)
    assert "by someone else while the task ran on the agent's compute thread (compute.overlap)" in msg
    assert not hasattr(objs["a"], "result")  # nothing was computed on the wrong value


class SelfChanging(Worker):
    """Computes a function that changes its own argument in place: allowed, as in eager execution."""

    async def run(self):
        self.buf = torch.zeros(3)
        for _ in range(3):
            await self.compute(lambda b: b.add_(1.0), self.buf)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_task_may_change_its_own_arguments(overlap):
    k, env, objs = build({"w": (SelfChanging, {})}, overlap=overlap)
    k.run_until()
    env.executor.close()
    assert objs["w"].buf.tolist() == [3.0, 3.0, 3.0]


def test_the_same_run_eagerly_computes_on_the_value_at_issue():
    k, env, objs = build({"a": (Sharer, {}), "b": (Mutator, {})}, batch="off")
    k.run_until()
    assert env.executor is None
    assert objs["a"].result == 4.0  # eager: computed before b changed the tensor


class Summer:
    """A batchable compute function whose batch rule records the batches it was given."""

    def __init__(self):
        self.batches: list[int] = []
        self.calls = 0

    @batch_rule("many")
    def one(self, x):
        self.calls += 1
        return float(x.sum())

    def many(self, calls):
        self.batches.append(len(calls))
        return [float(c[0].sum()) for c in calls]


class Computer(Worker):
    def __init__(self, name, vid, env, fn, start_ns, rounds=1):
        super().__init__(name, vid, env)
        self.fn, self.start_ns, self.rounds = fn, start_ns, rounds
        self.results = []

    async def run(self):
        await self.sleep(self.start_ns)
        for r in range(self.rounds):
            value = await self.compute(self.fn, torch.full((3,), float(self.id + r)))
            self.results.append((self.now, value))


def _computers(fn, starts, rounds=1):
    return {f"w{i}": (Computer, {"fn": fn, "start_ns": s, "rounds": rounds}) for i, s in enumerate(starts)}


def test_vmap_runs_the_tasks_pending_when_the_first_is_needed_as_one_batch():
    s = Summer()
    # gradients take 1 ms: w0..w2 issue within it (one batch), w3 after w0 resumed (a batch of its own)
    k, env, objs = build(_computers(s.one, [0, 100, 200, 2_000_000]), batch="vmap")
    k.run_until()
    # w3 ran alone, through the rule too: with another placement its companions change, its rule does not
    assert s.batches == [3, 1]
    assert s.calls == 0
    assert [objs[f"w{i}"].results for i in range(4)] == [
        [(1_000_000, 0.0)], [(1_000_100, 3.0)], [(1_000_200, 6.0)], [(3_000_000, 9.0)]]
    info = env.executor.info()
    assert (info["tasks"], info["batches"], info["vmap_batches"], info["largest_batch"]) == (4, 2, 2, 3)


def test_max_batch_closes_batches_in_issue_order():
    s = Summer()
    k, env, objs = build(_computers(s.one, [0, 1, 2, 3, 4]), batch="vmap", max_batch=2)
    k.run_until()
    assert s.batches == [2, 2, 1]  # (w0, w1), (w2, w3), then w4 alone (through the rule as well)
    assert s.calls == 0


def test_loop_never_uses_the_batch_rule_and_overlap_changes_nothing():
    results = {}
    for overlap in (False, True):
        s = Summer()
        k, env, objs = build(_computers(s.one, [0, 100, 200], rounds=3), batch="loop", overlap=overlap)
        k.run_until()
        env.executor.close()
        assert s.batches == [] and s.calls == 9
        results[overlap] = [objs[f"w{i}"].results for i in range(3)]
    assert results[False] == results[True]


def test_auto_uses_the_rule_only_from_the_batch_size_where_the_probe_found_it_faster():
    s = Summer()
    ex = Executor(ExecutorSpec("auto", max_batch=8, probe_runs=1))
    ex._time = lambda fn, rule, calls: (1.0, 0.5 if len(calls) >= 4 else 2.0)  # the rule wins from 4 on
    ex.probe("sig", s.one, lambda n: [(torch.ones(3),)] * n, [2, 4, 8])
    assert ex.probes["sig"]["vmap_from"] == 4
    assert ex.probes["sig"]["figures"]["2"] == {"loop_s": 1.0, "vmap_s": 2.0}


class Failing(Worker):
    async def run(self):
        await self.compute(lambda x: 1 / 0, torch.ones(1))


def test_an_error_inside_a_deferred_task_crashes_its_vworker_when_it_resumes():
    k, env, objs = build({"w0": (Failing, {})})
    with pytest.raises(WorkerCrashed) as err:
        k.run_until()
    assert err.value.name == "w0" and err.value.now == 1_000_000
    assert isinstance(err.value.__cause__, ZeroDivisionError)


def test_measured_compute_is_never_deferred():
    k = Kernel()
    env = Environment(k, ["w0"], NetworkSpec(ConstantLatency(0), (1e9,), (1e9,)),
                      ComputeSpec(model="measured", batch="vmap"))
    assert env.executor is None


def test_auto_with_overlap_stops_waiting_for_batches_that_stay_too_small_and_reruns_alike():
    outcomes = []
    for _ in range(2):
        s = Summer()
        # 20 workers, each gradient (1 ms) alone in virtual time: batches of one, never the rule's size
        k, env, objs = build(_computers(s.one, [i * 2_000_000 for i in range(20)]), batch="auto", overlap=True)
        ex = env.executor
        ex._time = lambda fn, rule, calls: (1.0, 0.5 if len(calls) >= 4 else 2.0)
        ex.probe("sig", s.one, lambda n: [(torch.full((3,), 0.0),)] * n, [2, 4, 8])
        k.run_until()
        ex.close()
        info = ex.info()
        assert s.batches == [] and s.calls == 20
        assert info["switched_to_loop"] == ["after 16 batches (16 tasks, 0 by the rule)"]
        outcomes.append([objs[f"w{i}"].results for i in range(20)])
    assert outcomes[0] == outcomes[1]


def test_a_change_after_the_task_ran_early_is_found_when_its_vworker_resumes():
    from tests.helpers import wait_until

    class Owner:
        name = "w7"

    ex = Executor(ExecutorSpec("loop", overlap=True))
    first = ex.issue(Owner(), "gradient", torch.sum, (torch.ones(2),), {}, 1)
    assert not first.batch.offered  # a function's first call waits for its demand (and shows it changes nothing)
    assert ex.result(first) == 2.0
    t = torch.ones(4)
    task = ex.issue(Owner(), "gradient", torch.sum, (t,), {}, 5)
    assert task.batch.offered
    wait_until(lambda: task.batch.state == 2, timeout=30, what="the background thread to run the task")
    t.mul_(2.0)  # someone else changes the argument after it ran, before its vworker resumed
    with pytest.raises(TaskArgumentMutated, match="vworker w7: a tensor argument .* issued at 5 ns"):
        ex.result(task)
    ex.close()


class _Owner:  # (module level: a checkpoint pickles a task's owner)
    name = "w3"


def test_a_snapshot_while_the_thread_is_paused_leaves_the_running_executor_and_restores_a_working_one():
    """agents.checkpoint pickles the executor inside ``paused()``; the running executor goes on exactly as before
    (a snapshot once marked its queued batches as not offered, and the vworker's demand then failed), and the
    restored one computes the queued tasks too."""
    import pickle

    ex = Executor(ExecutorSpec("loop", overlap=True))
    assert ex.result(ex.issue(_Owner(), "gradient", torch.sum, (torch.ones(2),), {}, 1)) == 2.0  # (known: offered)
    with ex.paused():
        task = ex.issue(_Owner(), "gradient", torch.sum, (torch.ones(4),), {}, 5)
        assert task.batch.offered and task.batch.state == 0  # queued for the thread, which starts nothing now
        blob = pickle.dumps((ex, task))
    assert ex.result(task) == 4.0
    ex.close()
    again, queued = pickle.loads(blob)
    again.start()
    assert again.result(queued) == 4.0
    again.close()

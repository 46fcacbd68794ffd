"""Deferred, batched execution of compute calls — DESIGN §4.2 ("Deferred, batched execution").

Every compute model but ``measured`` knows a call's virtual duration before its
value, so with ``compute.batch`` other than ``off`` :meth:`Worker.compute
<agents.sim.worker.Worker.compute>` hands the call to its agent's
:class:`Executor` as a :class:`Task`, suspends the vworker until ``t + d``, and
takes the value when the vworker resumes (:meth:`Executor.result`). Between
issue and resume other vworkers issue tasks; the executor runs pending tasks of
one *batch key* (the function, its owner object and the arguments' shapes and
dtypes) together:

* ``loop`` — one plain call per task, in issue order: bit-identical to eager
  execution (``off``), whatever the batches;
* ``vmap`` — the function's *batch rule* (:func:`batch_rule`; e.g.
  ``torch.func.vmap`` over stacked parameters and batches) for every batch, a
  batch of one task too; floats differ from eager execution in the last bits,
  so a run says so in ``summary.json``. A rule whose rows do not depend on the
  rest of the batch makes the floats independent of how tasks are batched, and
  so of placement (``Training.gradient_at_batched`` on the CPU);
* ``auto`` — per batch key and batch size, the faster of the two as a timed
  probe at start-up measured it (:meth:`Executor.probe`; kept in the profile
  database like profiled durations, so reruns on the device choose alike).

**Batches are deterministic.** Per batch key, unstarted tasks wait in issue
order; ``max_batch`` of them close a batch, and a demanded task closes the
open one it is in. Who runs a closed batch (the thread that demands it, or the
background thread) never changes what is in it, so a rerun computes the same
batches, the same floats.

**Overlap** (``compute.overlap``): a background thread runs closed batches as
soon as they close, so real computation proceeds while the vworkers and the
window protocol go on; a demand waits for a batch that is running.

**Arguments are snapshots.** A task may only read what its vworker owns or was
sent, and nothing may change its tensors before it runs: the version counter of
every tensor argument is recorded at issue and checked before the task runs; a
change fails the owner with :class:`TaskArgumentMutated`, naming it. With overlap, the first call of each
function runs on the kernel's thread, which shows whether the function changes its own arguments; for
one that does not, a change made while a later call runs on the background thread is an error too.
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable

from agents.sim.kernel import KernelError
from agents.sim.types import VirtualTime

if TYPE_CHECKING:  # pragma: no cover
    from agents.sim.compute import ProfileDB

__all__ = ["BATCH_MODES", "ExecutorSpec", "Executor", "Task", "TaskArgumentMutated", "batch_rule",
           "batch_rule_of"]

log = logging.getLogger(__name__)

BATCH_MODES = ("off", "loop", "vmap", "auto")
_NEVER = 1 << 62  # auto: a batch key whose batches never use the batch rule
_LEARN = 16  # auto with overlap: batches of a key looked at before deciding whether waiting for batches pays


class TaskArgumentMutated(KernelError):
    """A tensor handed to a deferred compute call changed before the call ran."""


def batch_rule(method: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a method as batchable: ``method`` names its sibling that takes a list of argument tuples.

    ``owner.<method>([args_1, args_2, ...])`` must return ``[fn(*args_1), fn(*args_2), ...]``
    up to float rounding (e.g. ``torch.func.vmap`` over the stacked arguments).
    """

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        fn._lockstep_batch_rule = method  # type: ignore[attr-defined]
        return fn

    return mark


def batch_rule_of(fn: Callable[..., Any]) -> Callable[[list[tuple]], list[Any]] | None:
    """The batch rule of a bound method marked with :func:`batch_rule`, or None."""
    owner = getattr(fn, "__self__", None)
    name = getattr(getattr(fn, "__func__", None), "_lockstep_batch_rule", None)
    return getattr(owner, name) if owner is not None and name is not None else None


@dataclass(frozen=True)
class ExecutorSpec:
    """``compute.batch``, ``compute.max_batch``, ``compute.overlap`` and the probe's settings."""

    batch: str = "off"
    max_batch: int = 64
    overlap: bool = False
    probe_runs: int = 5
    margin: float = 0.1  # auto: the batch rule must beat the loop by this share to be chosen


def _tensors(a: Any, out: list) -> None:
    """Every tensor inside an argument (lists, tuples and dict values are searched)."""
    if hasattr(a, "_version") and hasattr(a, "data_ptr"):
        out.append(a)
    elif isinstance(a, (list, tuple)):
        for x in a:
            _tensors(x, out)
    elif isinstance(a, dict):
        for x in a.values():
            _tensors(x, out)


def _describe(a: Any) -> str:
    shape = getattr(a, "shape", None)
    return f"{str(getattr(a, 'dtype', '')).replace('torch.', '')}{list(shape)}" if shape is not None else \
        type(a).__name__


class _Batch:
    __slots__ = ("tasks", "state", "rule", "offered", "background")

    def __init__(self, tasks: list["Task"], rule: Callable[[list[tuple]], list[Any]] | None):
        self.tasks, self.rule = tasks, rule
        self.state = 0  # 0 waiting, 1 running, 2 done
        self.offered = False  # in the background thread's queue
        self.background = False  # run by the background thread


class Task:
    """One deferred compute call: the owner, what to call, and (once run) its value or error."""

    __slots__ = ("owner", "kind", "fn", "args", "kwargs", "key", "issued_at", "versions", "batch", "value",
                 "error")

    def __init__(self, owner: Any, kind: str, fn: Callable[..., Any], args: tuple, kwargs: dict, key: Any,
                 issued_at: VirtualTime):
        self.owner, self.kind, self.fn, self.args, self.kwargs = owner, kind, fn, args, kwargs
        self.key, self.issued_at = key, issued_at
        ts: list = []
        _tensors(args, ts)
        if kwargs:
            _tensors(kwargs, ts)
        self.versions = [(t, t._version) for t in ts]
        self.batch: _Batch | None = None
        self.value: Any = None
        self.error: BaseException | None = None

    def __getstate__(self) -> dict[str, Any]:
        """For a checkpoint: each argument's changes since issue, not its version counter, which a tensor
        loaded from a checkpoint starts afresh."""
        state = {k: getattr(self, k) for k in self.__slots__}
        state["versions"] = [(t, t._version - v) for t, v in self.versions]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)
        self.versions = [(t, t._version - d) for t, d in state["versions"]]

    def check(self, when: str = "before the vworker resumed") -> None:
        """Raise :class:`TaskArgumentMutated` when a tensor argument changed since issue (before the task
        ran) or since the task ran (after it ran; what the task itself changed does not count)."""
        for i, (t, v) in enumerate(self.versions):
            if t._version != v:
                raise TaskArgumentMutated(
                    f"vworker {self.owner.name}: a tensor argument ({_describe(t)}, #{i}) of its {self.kind} task "
                    f"issued at {self.issued_at} ns was changed in place {when}; with deferred "
                    f"compute (compute.batch) a compute call's arguments must stay unchanged until its vworker "
                    f"resumes — pass a copy (tensor.clone()), or run with compute.batch=off")


class _Identity:
    """An object compared by identity in a batch key, whatever its own ``__eq__`` (a tensor's is elementwise)."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any):
        self.obj = obj

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, _Identity) and other.obj is self.obj

    def __hash__(self) -> int:
        return id(self.obj)


def _code(fn: Callable[..., Any]) -> Any:
    """What identifies a task's function across calls: its code (a lambda made anew each call has the same)."""
    f = getattr(fn, "__func__", fn)
    return getattr(f, "__code__", f)


class Executor:
    """Runs the deferred compute tasks of one agent (DESIGN §4.2); see the module docstring."""

    def __init__(self, spec: ExecutorSpec, threads: int = 1):
        if spec.batch not in BATCH_MODES or spec.batch == "off":
            raise ValueError(f"compute.batch={spec.batch!r} does not defer; accepted here: loop | vmap | auto")
        if spec.max_batch < 1:
            raise ValueError(f"compute.max_batch={spec.max_batch!r}; accepted: an integer >= 1")
        self.spec = spec
        self.batching = spec.batch in ("vmap", "auto")
        self.max_batch = spec.max_batch if self.batching else 1
        self._cv = threading.Condition()
        self._open: dict[Any, list[Task]] = {}  # batch key -> unstarted tasks not yet in a closed batch
        self._ready: list[_Batch] = []  # closed batches for the background thread, in closing order
        self._from: dict[Any, int] = {}  # auto: batch key -> smallest batch size that uses the batch rule
        # auto with overlap: (batches, tasks, tasks in batches that used the rule) of each key's first batches,
        # and the keys whose batches turned out too small for the rule: their tasks start at once instead
        self._seen: dict[Any, list[int]] = {}
        self._looping: set[Any] = set()
        self.switched: list[str] = []
        self.probes: dict[str, dict[str, Any]] = {}  # auto: what the probe measured, per signature
        # vmap: whether the batch rules' rows were found not to depend on the rest of their batch (checked
        # before the first window, Training.prepare_batches); None: not checked
        self.rows_independent: bool | None = None
        self.wall_s: dict[str, float] = {}  # wall seconds per kind, drained by the agent each window
        # the same per (vworker, kind), for metrics.per_worker (None: not kept; AgentCore sets a dict)
        self.worker_wall_s: dict[tuple[str, str], float] | None = None
        self.tasks = self.batches = self.ruled_batches = self.ruled_tasks = 0
        self.largest = 0
        self.waited_s = 0.0  # wall time demands spent waiting for the background thread
        # overlap: whether each task function (by code) changes its own tensor arguments, from its first run,
        # which is on the kernel's thread (nothing else runs then); closed batches of functions not run yet
        # wait here for that run instead of going to the background thread
        self._changes_args: dict[Any, bool] = {}
        self._unknown: list[_Batch] = []
        self._threads = threads
        self._closed = False
        self._busy = False  # the background thread runs a batch
        self._paused = False  # a checkpoint is being taken: the background thread starts nothing
        self._thread: threading.Thread | None = None
        self.start()

    def start(self) -> None:
        """Start the background thread (``compute.overlap``), unless it runs or the executor is closed."""
        if self.spec.overlap and self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._background, name="lockstep-executor", daemon=True)
            self._thread.start()

    @property
    def threaded(self) -> bool:
        """Whether a background thread runs batches (it may change tensors while the kernel waits)."""
        return self._thread is not None

    # ---------------------------------------------------------- checkpoints (agents.checkpoint)
    @contextlib.contextmanager
    def paused(self):
        """No batch runs on the background thread inside this block (the agent's state is being saved)."""
        with self._cv:
            self._paused = True
            while self._busy:
                self._cv.wait()
        try:
            yield
        finally:
            with self._cv:
                self._paused = False
                self._cv.notify_all()

    def __getstate__(self) -> dict[str, Any]:
        """Pending tasks and counters; not the lock, the thread, nor what was learnt about task functions
        (keyed by code objects): batches offered to the thread wait, as at the start, for their function's
        first run on the kernel's thread. Values never depend on which thread computed them."""
        state = dict(self.__dict__)  # (a copy: the running executor goes on unchanged)
        for k in ("_cv", "_thread"):
            state.pop(k)
        state["_changes_args"] = {}
        state["_unknown"], state["_ready"] = self._unknown + self._ready, []
        state["_paused"] = state["_busy"] = False
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._cv = threading.Condition()
        self._thread = None
        for b in self._unknown:  # (the restored batches: none is offered to a thread yet)
            b.offered = False

    # ------------------------------------------------------------- issuing
    def key_of(self, fn: Callable[..., Any], args: tuple) -> Any:
        """The batch key of a call, or None when it is never batched (no batch rule, or mode loop)."""
        if not self.batching or batch_rule_of(fn) is None:
            return None
        shapes = tuple((tuple(a.shape), a.dtype, a.device) if hasattr(a, "shape") else
                       (type(a), a if isinstance(a, (int, float, str, bool)) else None) for a in args)
        # the bound object itself, not its id: a key must survive a checkpoint (agents.checkpoint)
        return (getattr(fn, "__func__", fn), _Identity(getattr(fn, "__self__", None)), shapes)

    def issue(self, owner: Any, kind: str, fn: Callable[..., Any], args: tuple, kwargs: dict,
              now: VirtualTime) -> Task:
        """Record a call of ``owner``; its value is taken with :meth:`result` when ``owner`` resumes."""
        key = self.key_of(fn, args) if not kwargs else None
        if key is not None and (key in self._looping or (self.spec.batch == "auto" and
                                                         self._from.get(key, _NEVER) == _NEVER)):
            key = None  # auto: a call the rule never pays for (or the probe never saw) starts at once
        task = Task(owner, kind, fn, args, kwargs, key, now)
        with self._cv:
            self.tasks += 1
            if key is None:
                self._close([task], None)
            else:
                pending = self._open.get(key)
                if pending is None:
                    pending = self._open[key] = []
                pending.append(task)
                if len(pending) >= self.max_batch:
                    del self._open[key]
                    self._close(pending, key)
        return task

    def _close(self, tasks: list[Task], key: Any) -> _Batch:
        """Make ``tasks`` one batch (caller holds the lock) and offer it to the background thread."""
        rule = None
        # vmap: every batch, one task too, so that a row never depends on what else is in its batch (docs/batching.md);
        # auto: batches from the size its probe chose
        if key is not None and (self.spec.batch == "vmap" or len(tasks) >= self._from.get(key, _NEVER)):
            rule = batch_rule_of(tasks[0].fn)
        b = _Batch(tasks, rule)
        for t in tasks:
            t.batch = b
        if key is not None:
            self._learn(key, b)
        if self._thread is not None:
            if _code(tasks[0].fn) in self._changes_args:
                self._offer(b)
            else:
                self._unknown.append(b)
        return b

    def _offer(self, b: _Batch) -> None:
        b.offered = True
        self._ready.append(b)
        self._cv.notify_all()

    # --------------------------------------------------------------- values
    def result(self, task: Task) -> Any:
        """The task's value, computed now (with its batch) unless done already; re-raises its error."""
        b = task.batch
        if b is None or b.state != 2:
            run_here = False
            with self._cv:
                if task.batch is None:  # still open: it closes the open batch of its key
                    self._close(self._open.pop(task.key), task.key)
                b = task.batch
                if b.state == 0:
                    b.state = 1
                    if b.offered:
                        self._ready.remove(b)
                    elif self._thread is not None:
                        self._unknown.remove(b)
                    run_here = True
                elif b.state == 1:
                    t0 = time.perf_counter()
                    while b.state != 2:
                        self._cv.wait()
                    self.waited_s += time.perf_counter() - t0
            if run_here:
                self._run(b)
        if task.error is None:
            try:
                # a change after the task ran early (on the background thread) is found here, so a change
                # between issue and resume fails the run whichever thread was first
                task.check()
            except TaskArgumentMutated as e:
                task.error = e
        if task.error is not None:
            raise task.error
        value, task.value, task.args, task.kwargs, task.versions = task.value, None, (), {}, []
        return value

    def _learn(self, key: Any, b: _Batch) -> None:
        """``auto`` with overlap: after ``_LEARN`` batches of a key, give up waiting for batches when most
        of its tasks ran in batches too small for the rule anyway — they are better started at once on
        the background thread. The batches' sizes follow from virtual time alone, so the switch comes at
        the same task on every rerun."""
        if self.spec.batch != "auto" or self._thread is None or key in self._looping:
            return
        seen = self._seen.setdefault(key, [0, 0, 0])
        seen[0] += 1
        seen[1] += len(b.tasks)
        seen[2] += len(b.tasks) if b.rule is not None else 0
        if seen[0] >= _LEARN and seen[2] < 0.5 * seen[1]:
            self._looping.add(key)
            self.switched.append(f"after {seen[0]} batches ({seen[1]} tasks, {seen[2]} by the rule)")

    def _run(self, b: _Batch) -> None:
        """Run a batch (state 1, set by the caller) and mark it done."""
        tasks = b.tasks
        t0 = time.perf_counter()
        ok = []
        for t in tasks:
            try:
                t.check()
                ok.append(t)
            except TaskArgumentMutated as e:
                t.error = e
        if b.rule is not None and ok:
            try:
                values = b.rule([t.args for t in ok])
                for t, v in zip(ok, values):
                    t.value = v
            except BaseException as e:  # noqa: BLE001 - each owner sees it when it resumes
                for t in ok:
                    t.error = e
        else:
            for t in ok:
                try:
                    t.value = t.fn(*t.args, **t.kwargs)
                except BaseException as e:  # noqa: BLE001 - the owner sees it when it resumes
                    t.error = e
        self._after_run(b, ok)
        wall = time.perf_counter() - t0
        with self._cv:
            share = wall / len(tasks)
            for t in tasks:
                self.wall_s[t.kind] = self.wall_s.get(t.kind, 0.0) + share
            if self.worker_wall_s is not None:
                for t in tasks:
                    key = (getattr(t.owner, "name", str(t.owner)), t.kind)
                    self.worker_wall_s[key] = self.worker_wall_s.get(key, 0.0) + share
            self.batches += 1
            self.largest = max(self.largest, len(tasks))
            if b.rule is not None and ok:
                self.ruled_batches += 1
                self.ruled_tasks += len(ok)
            b.state = 2
            self._cv.notify_all()

    def _after_run(self, b: _Batch, ok: list[Task]) -> None:
        """What the task changed itself is no one else's change: its versions now are the reference for the
        check when its vworker resumes. With overlap, a change *while* a task ran on the background thread
        is told apart from the task's own by its function: one that left its arguments alone on its first
        run (on the kernel's thread, nothing else running) must leave them alone on every run."""
        code = _code(b.tasks[0].fn)
        known = self._changes_args.get(code)
        changed = False
        for t in ok:
            moved = any(x._version != v for x, v in t.versions)
            if moved and known is False and b.background and t.error is None:
                try:
                    t.check(when="by someone else while the task ran on the agent's compute thread "
                                 "(compute.overlap)")
                except TaskArgumentMutated as e:
                    t.error = e
            changed = changed or moved
            t.versions = [(x, x._version) for x, _ in t.versions]
        if known is None and self._thread is not None and not b.background:
            with self._cv:
                self._changes_args[code] = changed
                waiting = [x for x in self._unknown if _code(x.tasks[0].fn) == code]
                for x in waiting:
                    self._unknown.remove(x)
                    self._offer(x)

    def _background(self) -> None:
        try:
            import torch

            torch.set_num_threads(self._threads)  # a new thread does not inherit the agent's setting
        except ImportError:  # pragma: no cover - torch is always there in an agent
            pass
        while True:
            with self._cv:
                while (not self._ready or self._paused) and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                b = self._ready.pop(0)
                b.state = 1
                b.background = True
                self._busy = True
            try:
                self._run(b)
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def drain_wall(self) -> dict[str, float]:
        """Wall seconds spent per kind since the last call (for the window's stats)."""
        with self._cv:
            out, self.wall_s = self.wall_s, {}
        return out

    def drain_worker_wall(self) -> dict[tuple[str, str], float]:
        """Wall seconds per (vworker, kind) since the last call, when kept (metrics.per_worker)."""
        with self._cv:
            if self.worker_wall_s is None:
                return {}
            out, self.worker_wall_s = self.worker_wall_s, {}
        return out

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    # ----------------------------------------------------------------- auto
    def probe(self, sig: str, fn: Callable[..., Any], make_calls: Callable[[int], list[tuple]],
              sizes: Iterable[int], db: "ProfileDB | None" = None, device: str = "") -> None:
        """``auto``: time the loop and the batch rule of ``fn`` at each batch size; keep the choice.

        For each size n the fastest of ``probe_runs`` timed runs of each (interleaved, after one
        warm-up: on a shared machine the minimum is the figure least disturbed by others) is taken, or read from the profile database ``db`` when an earlier run stored it
        (so reruns on the device choose alike). Batches of a size at which the batch rule was not at
        least ``margin`` faster, or smaller than the largest such size, run as a loop.
        """
        rule = batch_rule_of(fn)
        if self.spec.batch != "auto" or rule is None:
            return
        figures: dict[str, dict[str, float]] = {}
        use_from = _NEVER
        key = None
        for n in sorted(set(s for s in sizes if 2 <= s <= self.spec.max_batch)):
            calls = make_calls(n)
            key = self.key_of(fn, calls[0])
            loop_s = db.get(device, f"batchprobe|loop|{n}|{sig}") if db is not None else None
            rule_s = db.get(device, f"batchprobe|vmap|{n}|{sig}") if db is not None else None
            if loop_s is None or rule_s is None:
                loop_s, rule_s = self._time(fn, rule, calls)
                if db is not None:
                    loop_s = db.put(device, f"batchprobe|loop|{n}|{sig}", loop_s)
                    rule_s = db.put(device, f"batchprobe|vmap|{n}|{sig}", rule_s)
            figures[str(n)] = {"loop_s": loop_s, "vmap_s": rule_s}
            wins = rule_s <= (1.0 - self.spec.margin) * loop_s
            if wins and use_from == _NEVER:
                use_from = n
            elif not wins:
                use_from = _NEVER  # only sizes from which the rule wins at every larger probed size
        if key is not None:
            self._from[key] = use_from
        self.probes[sig] = {"vmap_from": None if use_from == _NEVER else use_from, "figures": figures}

    def _time(self, fn: Callable[..., Any], rule: Callable[[list[tuple]], list[Any]],
              calls: list[tuple]) -> tuple[float, float]:
        loop_t, rule_t = [], []
        for i in range(1 + self.spec.probe_runs):
            t0 = time.perf_counter()
            for c in calls:
                fn(*c)
            t1 = time.perf_counter()
            rule(calls)
            t2 = time.perf_counter()
            if i:
                loop_t.append(t1 - t0)
                rule_t.append(t2 - t1)
        return min(loop_t), min(rule_t)

    def info(self) -> dict[str, Any]:
        """What ran and how (for summary.json): tasks, batches, the probe's figures and choices."""
        with self._cv:
            return {"mode": self.spec.batch, "overlap": self.spec.overlap, "max_batch": self.spec.max_batch,
                    "tasks": self.tasks, "batches": self.batches, "largest_batch": self.largest,
                    "vmap_batches": self.ruled_batches, "vmap_tasks": self.ruled_tasks, "switched_to_loop": self.switched,
                    "wait_s": self.waited_s, "probes": dict(self.probes),
                    "rows_independent": getattr(self, "rows_independent", None)}  # (None: restored from before it)

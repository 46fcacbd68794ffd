"""Checkpoints of an agent at a window boundary (DESIGN §11, docs/recovery.md): save, then restore.

A checkpoint is the whole state of one :class:`~agents.core.AgentCore` between two windows — its
kernel's clock and event heap, the network model, the executor's pending tasks, every vworker (models,
optimizers, mailboxes, keyed-draw counters, batch streams) and where each vworker's coroutine is
suspended — as bytes. Restoring them in a fresh process gives a core that runs the rest of the run
exactly as the saved one would have (tests/engine/test_checkpoint.py).

Everything but the coroutines is plain data, pickled as one graph (so an object two vworkers share is
still shared after a restore). The loaded data set, the Prometheus metrics and the executor's thread
are the process's own and are attached again, not saved.

**Coroutines.** Python cannot pickle a suspended coroutine. It can read one: the chain of frames from
``run()`` down to the kernel awaitable it waits in (``cr_await``), each with its code and its locals.
A checkpoint saves that chain — the code's name and the locals of every frame — and a restore builds a
coroutine that, resumed with the value the original was waiting for, runs *the rest of each frame*,
innermost first. The rest of a frame is written once, next to the frame it continues, as a *tail*
registered with :func:`continues`::

    @continues(TrainingWorker.gradient)
    async def _(f, value, below):    # f: the frame's locals; value: what its await returned;
        return f["self"].gradient_done(f["seq"], f["y"], *value)  # below: the awaited function's name

A tail is written in *tail-call form*: it either returns without awaiting or ends in its only await,
``return await ...``. So a coroutine rebuilt from a checkpoint can itself be saved again: a tail suspended
in its await has nothing left to do but return what it awaits.

A frame whose code has no tail — a strategy that has not written them, or a vworker suspended where its
strategy has none — makes :func:`snapshot` raise :class:`NotCheckpointable`, naming the vworker and the
frame; recovery then replays from virtual time 0, as before. The tails of the Worker API's own awaits
(``recv``, ``compute``, ``wait``, send handles) are in :mod:`agents.sim.worker`; a strategy adds those of
its own frames.
"""
from __future__ import annotations

import contextlib
import io
import pickle
import time
import types
from typing import Any, Awaitable, Callable

__all__ = ["NotCheckpointable", "snapshot", "restore", "continues", "FORMAT"]

FORMAT = 1
"""Bumped whenever what a checkpoint holds changes: a restore refuses another format."""


class NotCheckpointable(RuntimeError):
    """This agent cannot be checkpointed now; the message names the vworker and where it waits."""


Tail = Callable[[dict[str, Any], Any, str], Awaitable[Any]]
_TAILS: dict[str, Tail] = {}
_TAIL_CODES: set[types.CodeType] = set()
_LEAVES: set[str] = set()  # the kernel's own suspension points: resumed with the value itself


def _name(module: str, code: types.CodeType) -> str:
    return f"{module}:{code.co_qualname}"


def _of(fn: Callable[..., Any]) -> str:
    fn = getattr(fn, "__func__", fn)
    return _name(fn.__module__, fn.__code__)


def continues(fn: Callable[..., Any]) -> Callable[[Tail], Tail]:
    """Register the decorated ``async def tail(f, value)`` as the rest of ``fn``'s frame after its await."""
    name = _of(fn)

    def register(tail: Tail) -> Tail:
        _TAILS[name] = tail
        _TAIL_CODES.add(tail.__code__)
        return tail
    return register


def leaf(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a kernel awaitable (a generator that yields to the kernel) whose result is the value sent in."""
    _LEAVES.add(_of(fn))
    return fn


def _links(coro: Any) -> Any:
    """(frame, what it awaits) of each coroutine or generator in an await chain, outermost first."""
    c = coro
    while c is not None:
        if isinstance(c, types.CoroutineType):
            frame, nxt = c.cr_frame, c.cr_await
        elif isinstance(c, types.GeneratorType):
            frame, nxt = c.gi_frame, c.gi_yieldfrom
        else:
            raise TypeError(type(c).__name__)
        if frame is None:  # a finished coroutine
            return
        yield frame, nxt
        c = nxt


def frames_of(worker: Any) -> list[tuple[str, dict[str, Any] | None]]:
    """Where ``worker``'s coroutine is suspended: (code name, locals) of each frame, ``run()`` first.

    A coroutine rebuilt by an earlier restore is read as the frames it stands for: the frames whose tails
    have not run yet, the one whose tail runs (locals None: its tail, in tail-call form, returns what it
    awaits), then what that tail awaits."""
    out: list[tuple[str, dict[str, Any] | None]] = []
    skip_tail = False
    try:
        for frame, nxt in _links(worker.coro):
            code = frame.f_code
            if skip_tail:  # the running tail of a rebuilt coroutine (checked: a registered tail)
                skip_tail = False
                if code not in _TAIL_CODES:
                    raise NotCheckpointable(f"vworker {worker.name} is suspended in {code.co_qualname}, which a "
                                            "checkpoint cannot save")
                continue
            if code is _rebuilt.__code__:
                f = frame.f_locals
                if "i" not in f:  # still waiting where it was saved
                    out.extend(f["frames"])
                    break
                out.extend(f["frames"][:f["i"]])
                out.append((f["frames"][f["i"]][0], None))
                skip_tail = True
                continue
            out.append((_name(frame.f_globals.get("__name__", "?"), code), dict(frame.f_locals)))
    except TypeError as e:
        raise NotCheckpointable(f"vworker {worker.name} waits in {e}, which a checkpoint cannot save") from None
    if not out:
        return out
    if out[-1][0] not in _LEAVES:
        raise NotCheckpointable(f"vworker {worker.name} is suspended in {out[-1][0].rsplit(':', 1)[1]}, which is "
                                "not one of the kernel's awaitables")
    for name, f in out[:-1]:
        if f is not None and name not in _TAILS:
            raise NotCheckpointable(f"vworker {worker.name} is suspended in {name.rsplit(':', 1)[1]}, which its "
                                    f"strategy ({type(worker).__name__}) cannot checkpoint (docs/recovery.md)")
    return out


def _short(name: str) -> str:
    return name.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


async def _rebuilt(frames: list[tuple[str, dict[str, Any] | None]]) -> Any:
    """The rest of a saved coroutine: wait where it waited, then finish each frame, innermost first."""
    from agents.sim.kernel import park

    value = await park()  # the kernel's pending event resumes it with what the original waited for
    for i in range(len(frames) - 2, -1, -1):
        name, f = frames[i]
        if f is not None:  # (None: a tail that returns what it awaited, saved from a rebuilt coroutine)
            value = await _TAILS[name](f, value, _short(frames[i + 1][0]))
    return value


# ------------------------------------------------------------------------------------------- pickling
class _Pickler(pickle.Pickler):
    def __init__(self, buf: io.BytesIO, shared: dict[int, str]):
        super().__init__(buf, protocol=5)
        self.shared = shared

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is types.CoroutineType:
            return ("coroutine",)  # rebuilt from the saved frames (above)
        key = self.shared.get(id(obj))
        return None if key is None else (key,)


class _Unpickler(pickle.Unpickler):
    def __init__(self, buf: io.BytesIO, shared: dict[str, Any]):
        super().__init__(buf)
        self.shared = shared

    def persistent_load(self, pid: Any) -> Any:
        if pid == ("coroutine",):
            return None
        try:
            return self.shared[pid[0]]
        except (KeyError, IndexError, TypeError):
            raise pickle.UnpicklingError(f"a checkpoint refers to {pid!r}, which this process does not have") from None


def _shared(core: Any) -> dict[str, Any]:
    """What a checkpoint refers to but does not hold: the process's own objects."""
    from agents.sim.kernel import HALTED

    out: dict[str, Any] = {"halted": HALTED, "metrics": core.metrics}
    if core.training is not None:
        out["data"] = core.training.data
    return out


def snapshot(core: Any) -> bytes:
    """The state of ``core`` between two windows, as bytes (raises :class:`NotCheckpointable`)."""
    positions = {}
    for w in core.workers.values():
        if w.coro is None or type(w.coro) is not types.CoroutineType:
            continue  # not started yet (its start is a queued event), finished, or crashed (HALTED)
        positions[w.id] = frames_of(w)
    ex = core.env.executor
    shared = {id(v): k for k, v in _shared(core).items() if v is not None}
    buf = io.BytesIO()
    state = {"format": FORMAT, "agent": core.agent_id, "run_id": core.plan.run_id, "core": core,
             "positions": positions, "wall_s": time.perf_counter() - core.env.recorder.wall_start}
    try:
        with ex.paused() if ex is not None else contextlib.nullcontext():  # no batch half-run meanwhile
            _Pickler(buf, shared).dump(state)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise NotCheckpointable(f"agent {core.agent_id}'s state cannot be saved: {e}") from e
    return buf.getvalue()


def restore(plan: Any, agent_id: int, blob: bytes, *, data: Any = None, metrics: Any = None,
            own_process: bool = False) -> Any:
    """An AgentCore for ``agent_id`` of ``plan`` in the state :func:`snapshot` saved in ``blob``."""
    import torch

    from agents.core import use_memory
    from agents.sim.kernel import HALTED
    from agents.workloads.data import load_fashion_mnist

    torch.set_num_threads(plan.workload.threads)
    use_memory(plan.workload.memory, len(plan.local_ids(agent_id)))  # before anything is allocated

    class Shared(dict):
        def __missing__(self, key: str) -> Any:
            if key != "data":
                raise KeyError(key)
            self[key] = load_fashion_mnist(plan.workload.data_root)  # (memory-mapped: docs/workloads.md)
            return self[key]

    shared = Shared(halted=HALTED, metrics=metrics)
    if data is not None:
        shared["data"] = data
    try:
        state = _Unpickler(io.BytesIO(blob), shared).load()
    except Exception as e:  # noqa: BLE001 - a damaged or foreign file: one sentence
        raise NotCheckpointable(f"the checkpoint of agent {agent_id} cannot be read: {type(e).__name__}: {e}") from e
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise NotCheckpointable(f"the checkpoint of agent {agent_id} has format {state.get('format')!r}; this "
                                f"lockstep reads format {FORMAT}")
    if state["agent"] != agent_id or state["run_id"] != plan.run_id:
        raise NotCheckpointable(f"the checkpoint is agent {state['agent']}'s of run {state['run_id']}, not agent "
                                f"{agent_id}'s of run {plan.run_id}")
    core = state["core"]
    core.plan, core.metrics = plan, metrics
    core.env.recorder.wall_start = time.perf_counter() - state["wall_s"]
    for w in core.workers.values():
        frames = state["positions"].get(w.id)
        if frames is not None:
            w.coro = _rebuilt(frames)
            if w.coro.send(None) is not _parked():
                raise NotCheckpointable(f"vworker {w.name} did not wait where it was saved")
    if core.env.executor is not None:
        core.env.executor.start()
    return core


def _parked() -> Any:
    from agents.sim.kernel import PARKED

    return PARKED

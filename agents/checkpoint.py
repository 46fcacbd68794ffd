"""Checkpoints of an agent at a window boundary (DESIGN §11, docs/recovery.md): save, then restore.

A checkpoint is the whole state of one :class:`~agents.core.AgentCore` between two windows — its
kernel's clock and event heap, the network model, the executor's pending tasks, every vworker (models,
optimizers, mailboxes, keyed-draw counters, batch streams) and where each vworker's coroutine is
suspended — as bytes. Restoring them in a fresh process gives a core that runs the rest of the run
exactly as the saved one would have (tests/engine/test_checkpoint.py).

Everything but the coroutines is plain data, pickled as one graph (so an object two vworkers share is
still shared after a restore; tensor storages are saved once each, next to the graph, so a view and its
base share memory again too — pickle alone would copy each view). The loaded data set, the Prometheus
metrics and the executor's thread are the process's own and are attached again, not saved.

**Bytes.** A checkpoint is ``[8-byte length of the head][head][graph][storages]``: the head (a small pickle)
lists each storage's offset and size in the last part, which is every storage's bytes copied once into one
buffer. :func:`snapshot` returns it as a :class:`Blob`, the parts side by side, never joined: a copy of the
storages is the only copy a checkpoint costs the agent, however large (10 000 vworkers: 3.3 GB; the layout
before it copied them three times over, and the 10 000-vworker run was killed for want of memory). The
copy is needed where the run goes on while the checkpoint is written on another thread; an in-process
core, which the controller writes before it runs again, is saved ``live``: its storages viewed in place,
not copied at all (docs/recovery.md, "Cost").

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
import warnings
from typing import Any, Callable, ContextManager

import numpy as np
import torch

from agents.common.files import Blob, headed, read_headed
from agents.sim.resume import NotCheckpointable, continues, finishes, frames_of, rebuilt  # noqa: F401 - re-exported

__all__ = ["Blob", "NotCheckpointable", "Taking", "snapshot", "restore", "continues", "finishes", "FORMAT"]

FORMAT = 2
"""Bumped whenever what a checkpoint holds changes: a restore refuses another format."""

with warnings.catch_warnings():  # what a tensor's pickling hands over: deprecated, and still what it uses
    warnings.simplefilter("ignore")
    from torch.storage import TypedStorage as _TypedStorage


class _Pickler(pickle.Pickler):
    """Coroutines and the process's own objects by reference; tensor storages once each, so that tensors
    sharing one (a view and its base) still share it after a restore — pickle alone copies each view."""

    def __init__(self, buf: io.BytesIO, shared: dict[int, str]):
        super().__init__(buf, protocol=5)
        self.shared = shared
        self.storages: dict[tuple, Any] = {}

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is types.CoroutineType:
            return ("coroutine",)  # rebuilt from the saved frames (above)
        if isinstance(obj, _TypedStorage):
            u = obj._untyped_storage
            key = (u.device.type, u.device.index, u.data_ptr(), u.nbytes())
            self.storages.setdefault(key, u)  # (kept alive until saved: no other storage reuses its address)
            return ("storage", key, obj.dtype)
        key = self.shared.get(id(obj))
        return None if key is None else (key,)


class _Unpickler(pickle.Unpickler):
    def __init__(self, buf: io.BytesIO, shared: dict[str, Any], storages: dict[tuple, Any]):
        super().__init__(buf)
        self.shared, self.storages = shared, storages

    def persistent_load(self, pid: Any) -> Any:
        if pid == ("coroutine",):
            return None
        if isinstance(pid, tuple) and len(pid) == 3 and pid[0] == "storage":
            return _TypedStorage(wrap_storage=self.storages[pid[1]], dtype=pid[2], _internal=True)
        try:
            return self.shared[pid[0]]
        except (KeyError, IndexError, TypeError):
            raise pickle.UnpicklingError(f"a checkpoint refers to {pid!r}, which this process does not have") from None


def _storage_pieces(storages: dict[tuple, Any], copy: bool) -> tuple[list[tuple], list[memoryview]]:
    """Every storage's bytes side by side: ``([(key, offset, nbytes)], pieces)`` — copied once into one
    buffer, or with ``copy=False`` views of the storages themselves (a device's are copied to the host), for
    a caller that writes them before anything changes them."""
    table, total = [], 0
    for key, u in storages.items():
        table.append((key, total, u.nbytes()))
        total += u.nbytes()
    whole = [torch.empty(0, dtype=torch.uint8, device=u.device).set_(u) for u in storages.values()]
    if not copy:
        return table, [memoryview(t.cpu().numpy()).cast("B") for t in whole]
    out = torch.empty(total, dtype=torch.uint8)  # not zero-filled: every byte is written below
    for (_, off, n), t in zip(table, whole):
        out[off:off + n].copy_(t)
    return table, [memoryview(out.numpy()).cast("B")]


def _check_storage(off: Any, n: Any, region: int) -> None:
    """A storage table's entry lies inside the ``region`` bytes of the storages (ValueError if not)."""
    if not (isinstance(off, int) and isinstance(n, int) and 0 <= off and 0 <= n and off + n <= region):
        raise ValueError(f"a storage of {n!r} bytes at {off!r}, outside the {region} bytes saved")


def _on_device(key: tuple, t: Any) -> Any:
    """The untyped storage of the filled host tensor ``t``, on the device ``key`` names."""
    kind, index = key[0], key[1]
    return (t if kind == "cpu" else t.to(torch.device(kind, index))).untyped_storage()


def _checked_head(head: Any) -> dict[str, Any]:
    """A core's head, if it is of this lockstep's format (NotCheckpointable if not)."""
    if not isinstance(head, dict) or head.get("format") != FORMAT:
        raise NotCheckpointable(f"has format {head.get('format') if isinstance(head, dict) else None!r}; this "
                                f"lockstep reads format {FORMAT}")
    return head


def _storages(table: list[tuple], region: memoryview) -> dict[tuple, Any]:
    """The storages of a checkpoint, each a fresh tensor's (the checkpoint's buffer is not kept alive)."""
    out = {}
    for key, off, n in table:
        _check_storage(off, n, region.nbytes)
        t = torch.empty(n, dtype=torch.uint8)
        if n:
            t.numpy()[:] = np.frombuffer(region, dtype=np.uint8, count=n, offset=off)
        out[key] = _on_device(key, t)
    return out


class Taking:
    """A checkpoint taken as its pieces come (call ``restore``, agents/agent.py): the bytes of
    ``headed(outer, [headed(core head, [graph, storages])])`` — what :func:`agents.mesh.pack_checkpoint` wraps around
    :func:`snapshot` — with the heads and the graph gathered and every storage's bytes written straight into the
    tensor that keeps it. So no buffer holds the whole checkpoint (GBs at 10 000 vworkers) and its bytes are copied
    once, not twice (docs/recovery.md). ``allocating()`` is entered around the allocation of the storages' tensors
    (a compact agent is compact for them: :func:`agents.core.passing_buffers`). A malformed checkpoint raises
    ValueError or :class:`NotCheckpointable` from :meth:`feed` or :meth:`done`."""

    def __init__(self, allocating: Callable[[], ContextManager] = contextlib.nullcontext):
        self.allocating = allocating
        self.outer: dict[str, Any] | None = None  # the outer head (the window loop's view, the core's length)
        self.head: dict[str, Any] | None = None  # the core's head: its format, storages table, graph's length
        self.graph = bytearray()
        self.storages: dict[tuple, Any] = {}
        self._stage, self._need, self._buf = "outer length", 8, bytearray()
        self._core = 0  # the core's bytes (outer["core"]): its head, its graph and its storages
        self._fill: list[tuple[int, int, Any]] = []  # (offset, bytes, numpy view of the tensor) by offset
        self._next_fill = 0
        self._region = self._pos = 0  # the storages' bytes, and how many of them came

    def feed(self, data: Any) -> None:
        """Take the next bytes of the checkpoint."""
        mv = memoryview(data).cast("B")
        while mv.nbytes:
            if self._stage == "storages":
                mv = self._take_storages(mv)
            elif self._stage == "done":
                raise ValueError(f"{mv.nbytes} bytes more than the checkpoint's")
            else:
                k = min(self._need - len(self._buf), mv.nbytes)
                self._buf += mv[:k]
                mv = mv[k:]
                while self._stage not in ("storages", "done") and len(self._buf) == self._need:
                    self._next()

    def done(self) -> None:
        """The last bytes came: check that they were all of the checkpoint's; the device's storages go to it."""
        if self._stage != "done":
            raise ValueError(f"the checkpoint ended early (in its {self._stage}, after {self._pos} of {self._region} "
                             "storage bytes)")
        for key, u in list(self.storages.items()):
            if key[0] != "cpu":
                self.storages[key] = _on_device(key, torch.empty(0, dtype=torch.uint8).set_(u))

    def _next(self) -> None:
        buf, self._buf = self._buf, bytearray()
        if self._stage == "outer length":
            self._stage, self._need = "outer head", int.from_bytes(buf, "little")
        elif self._stage == "outer head":
            self.outer = pickle.loads(buf)  # noqa: S301 - trusted like config.yaml (docs/security.md)
            if not isinstance(self.outer, dict) or not isinstance(self.outer.get("core"), int):
                raise ValueError("not a lockstep agent checkpoint (its head names no core)")
            self._core = self.outer["core"]
            self._stage, self._need = "core length", 8
        elif self._stage == "core length":
            self._stage, self._need = "core head", int.from_bytes(buf, "little")
            self._region = self._core - 8 - self._need
        elif self._stage == "core head":
            self.head = _checked_head(pickle.loads(buf))  # noqa: S301
            g = int(self.head["graph"])
            self._region -= g
            if g < 0 or self._region < 0:
                raise ValueError(f"a core of {self._core} bytes does not hold a graph of {g} bytes")
            self._stage, self._need = "graph", g
        elif self._stage == "graph":
            self.graph = buf
            self._allocate(self.head["storages"])
            self._stage = "storages" if self._region else "done"

    def _allocate(self, table: list[tuple]) -> None:
        """A tensor for every storage of ``table`` (each one's bytes side by side, as :func:`_storage_pieces` puts
        them), allocated before any of its bytes come."""
        end = 0
        with self.allocating():
            for key, off, n in sorted(table, key=lambda e: e[1]):
                _check_storage(off, n, self._region)
                if off < end:
                    raise ValueError(f"the storage at {off} overlaps the one before it (which ends at {end})")
                end = off + n
                t = torch.empty(n, dtype=torch.uint8)
                self.storages[key] = t.untyped_storage()
                if n:
                    self._fill.append((off, n, t.numpy()))

    def _take_storages(self, mv: memoryview) -> memoryview:
        """Write the front of ``mv`` (the storages' bytes from ``_pos`` on) into its tensors; what is left of it."""
        while mv.nbytes and self._pos < self._region:
            fill = self._fill[self._next_fill] if self._next_fill < len(self._fill) else None
            if fill is None or self._pos < fill[0]:  # bytes no storage holds (none in a snapshot's checkpoint)
                k = min(mv.nbytes, (fill[0] if fill else self._region) - self._pos)
            else:
                off, n, arr = fill
                k = min(mv.nbytes, off + n - self._pos)
                at = self._pos - off
                arr[at:at + k] = np.frombuffer(mv, dtype=np.uint8, count=k)
                if at + k == n:
                    self._next_fill += 1
            mv, self._pos = mv[k:], self._pos + k
        if self._pos == self._region:
            self._stage = "done"
        return mv


def _shared(core: Any) -> dict[str, Any]:
    """What a checkpoint refers to but does not hold: the process's own objects."""
    from agents.sim.kernel import HALTED

    out: dict[str, Any] = {"halted": HALTED, "metrics": core.metrics}
    if core.training is not None:
        out["data"] = core.training.data
    return out


def snapshot(core: Any, live: bool = False) -> Blob:
    """The state of ``core`` between two windows (raises :class:`NotCheckpointable`).

    ``live``: the caller writes the checkpoint before ``core`` runs again (an in-process agent between two
    of the controller's windows), so the storages are not copied but viewed in place (``Blob.live``) —
    unless the executor has a background thread, which could change them meanwhile."""
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
            p = _Pickler(buf, shared)
            p.dump(state)
            live = live and (ex is None or not ex.threaded)
            table, pieces = _storage_pieces(p.storages, copy=not live)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise NotCheckpointable(f"agent {core.agent_id}'s state cannot be saved: {e}") from e
    graph = buf.getbuffer()
    return headed({"format": FORMAT, "storages": table, "graph": graph.nbytes}, [graph, *pieces], live=live)


def _parts(blob: Any) -> tuple[dict[str, Any], memoryview, memoryview]:
    """``(head, graph, storages)`` of a checkpoint's bytes (ValueError or NotCheckpointable if they are not)."""
    head, rest = read_headed(blob)  # a checkpoint is trusted like config.yaml (docs/security.md)
    head = _checked_head(head)
    g = int(head["graph"])
    if g > rest.nbytes:
        raise ValueError(f"{rest.nbytes} bytes do not hold a graph of {g} bytes")
    return head, rest[:g], rest[g:]


def restore(plan: Any, agent_id: int, blob: Any = None, *, taken: Taking | None = None, data: Any = None,
            metrics: Any = None) -> Any:
    """An AgentCore for ``agent_id`` of ``plan`` in the state :func:`snapshot` saved in ``blob`` (its bytes, a
    memoryview of them, or the :class:`Blob`), or that a :class:`Taking` took from pieces (``taken``, done)."""
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
        if taken is None:
            head, graph, region = _parts(blob)
            storages = _storages(head["storages"], region)
        else:
            graph, storages = taken.graph, taken.storages
        state = _Unpickler(io.BytesIO(graph), shared, storages).load()
    except NotCheckpointable as e:
        raise NotCheckpointable(f"the checkpoint of agent {agent_id} {e}") from None
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
            w.coro = rebuilt(frames)
            if w.coro.send(None) is not _parked():
                raise NotCheckpointable(f"vworker {w.name} did not wait where it was saved")
    if core.env.executor is not None:
        core.env.executor.start()
    return core


def _parked() -> Any:
    from agents.sim.kernel import PARKED

    return PARKED

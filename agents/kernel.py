"""The discrete-event kernel: an event heap and a driver for native coroutines.

Events are ordered by ``(time_ns, priority, origin_vworker_id, origin_seq)``
(DESIGN §5). ``origin_seq`` counts the events each vworker has created, and is
only ever incremented on the agent that hosts that vworker, so the order never
mentions an agent and is the same however vworkers are placed.

The kernel drives the ``run()`` coroutine of every local vworker itself — no
asyncio loop, no real sleeps. A coroutine suspends by yielding either an int
(``resume me at this virtual time``) or the ``PARKED`` sentinel (``someone will
call wake() on me``); anything else is a foreign awaitable and is thrown back
into the coroutine as a :class:`ForeignAwaitableError`.

A kernel runs one *window* at a time (:meth:`Kernel.run_until`): every event
with time ``< window_end``. Events addressed to vworkers hosted elsewhere are
collected in :attr:`Kernel.outbox` for the controller to route; the in-process
runner simply uses one kernel and an infinite window.
"""
from __future__ import annotations

import heapq
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Coroutine

from agents.types import INFINITY, VirtualTime

if TYPE_CHECKING:  # pragma: no cover
    from agents.worker import Worker

__all__ = [
    "Kernel", "RemoteEvent", "KernelError", "ForeignAwaitableError", "WorkerCrashed",
    "PRIO_NET", "PRIO_RESUME", "PARKED", "suspend_until", "park",
]

PRIO_NET = 0
"""Network events (arrival, tail, link completion, delivery) run before resumes at one instant."""
PRIO_RESUME = 1


class KernelError(RuntimeError):
    """A misuse of the kernel by a strategy or a broken invariant."""


class ForeignAwaitableError(KernelError):
    """A vworker awaited something the kernel does not drive (e.g. ``asyncio.sleep``)."""


class WorkerCrashed(KernelError):
    """A vworker's coroutine raised; names the vworker and keeps the cause."""

    def __init__(self, name: str, now: VirtualTime, cause: BaseException):
        self.name, self.now = name, now
        super().__init__(f"vworker {name} raised {type(cause).__name__} at virtual time {now} ns: {cause}")


class _Parked:
    __slots__ = ()

    def __repr__(self) -> str:
        return "PARKED"


PARKED = _Parked()


@types.coroutine
def suspend_until(t: VirtualTime) -> Any:
    """Suspend the current vworker until virtual time ``t``; returns the resume value (None)."""
    return (yield t)


@types.coroutine
def park() -> Any:
    """Suspend until some kernel code calls ``kernel.wake(worker, value)``; returns ``value``."""
    return (yield PARKED)


@dataclass(frozen=True, slots=True)
class RemoteEvent:
    """An event for a vworker on another agent: its full heap key plus a kind and a payload.

    ``kind`` names a handler registered with :meth:`Kernel.on_remote` on the
    receiving agent (e.g. ``"arrive"``, ``"tail"``, ``"notify"``).
    """

    time: VirtualTime
    priority: int
    origin: int
    seq: int
    dst: int
    kind: str
    data: Any


class Kernel:
    """Event heap, virtual clock and coroutine driver of one agent."""

    def __init__(self) -> None:
        self.now: VirtualTime = 0
        self._heap: list[tuple] = []
        self.workers: dict[int, "Worker"] = {}  # local vworkers by id
        self.outbox: list[RemoteEvent] = []
        self._remote_handlers: dict[str, Callable[[Any], None]] = {}
        self._stop_at: VirtualTime | None = None
        self.events_processed = 0
        self._crash: WorkerCrashed | None = None
        self._current: "Worker | None" = None  # the vworker whose coroutine is running

    # ----------------------------------------------------------------- setup
    def add_worker(self, worker: "Worker") -> None:
        """Host ``worker`` here and schedule the start of its ``run()`` at time 0."""
        if worker.id in self.workers:
            raise KernelError(f"vworker id {worker.id} ({worker.name}) added twice")
        self.workers[worker.id] = worker
        worker._attach(self)
        self.schedule(0, PRIO_RESUME, worker, self._start, worker)

    def is_local(self, vworker_id: int) -> bool:
        return vworker_id in self.workers

    def on_remote(self, kind: str, handler: Callable[[Any], None]) -> None:
        """Register the handler that runs a :class:`RemoteEvent` of ``kind`` when it comes due."""
        self._remote_handlers[kind] = handler

    # ------------------------------------------------------------ scheduling
    def schedule(self, t: VirtualTime, priority: int, owner: "Worker",
                 fn: Callable[[Any], None], arg: Any = None) -> None:
        """Run ``fn(arg)`` at virtual time ``t``; the event is keyed by ``owner``'s counter."""
        if t < self.now:
            raise KernelError(f"event scheduled in the past: {t} < now {self.now} (owner {owner.name})")
        owner._seq += 1
        heapq.heappush(self._heap, (t, priority, owner.id, owner._seq, fn, arg))

    def post(self, t: VirtualTime, priority: int, owner: "Worker", dst: int, kind: str, data: Any) -> None:
        """An event for vworker ``dst``: scheduled here when ``dst`` is local, else sent via the outbox."""
        owner._seq += 1
        if dst in self.workers:
            if t < self.now:
                raise KernelError(f"event posted in the past: {t} < now {self.now}")
            heapq.heappush(self._heap, (t, priority, owner.id, owner._seq, self._remote_handlers[kind], data))
        else:
            self.outbox.append(RemoteEvent(t, priority, owner.id, owner._seq, dst, kind, data))

    def inject(self, ev: RemoteEvent) -> None:
        """Insert an event that another agent posted for one of our vworkers (same heap key)."""
        if ev.dst not in self.workers:
            raise KernelError(f"event for vworker {ev.dst}, which this agent does not host")
        if ev.time < self.now:
            raise KernelError(f"causality violated: event at {ev.time} ns injected at {self.now} ns")
        handler = self._remote_handlers.get(ev.kind)
        if handler is None:
            raise KernelError(f"no handler for remote event kind {ev.kind!r}")
        heapq.heappush(self._heap, (ev.time, ev.priority, ev.origin, ev.seq, handler, ev.data))

    def wake(self, worker: "Worker", value: Any = None, at: VirtualTime | None = None) -> None:
        """Resume a parked vworker at ``at`` (default: now) with ``value`` as the await's result."""
        self.schedule(self.now if at is None else at, PRIO_RESUME, worker, worker._resume, value)

    # -------------------------------------------------------------- stopping
    def request_stop(self) -> None:
        """Stop after every event of the current instant has run (DESIGN §5: stop conditions)."""
        if self._stop_at is None:
            self._stop_at = self.now

    @property
    def stop_time(self) -> VirtualTime | None:
        return self._stop_at

    def stop_at(self, t: VirtualTime) -> None:
        """Told by the controller that another agent stopped at ``t``: run nothing after it."""
        if self._stop_at is None or t < self._stop_at:
            self._stop_at = t

    # --------------------------------------------------------------- running
    def next_time(self) -> VirtualTime:
        """Time of the next event, or INFINITY when the heap is empty or the run has stopped."""
        if not self._heap:
            return INFINITY
        t = self._heap[0][0]
        if self._stop_at is not None and t > self._stop_at:
            return INFINITY
        return t

    def run_until(self, window_end: VirtualTime = INFINITY, max_events: int | None = None) -> VirtualTime:
        """Run every event with time < ``window_end`` (and ≤ the stop time); return the next event time.

        ``max_events`` returns early (for progress reports of a single agent); the
        next call simply continues, so results do not depend on it.
        """
        heap = self._heap
        pop = heapq.heappop
        n = 0
        limit = max_events if max_events is not None else -1
        try:
            while heap and n != limit:
                t = heap[0][0]
                if t >= window_end:
                    break
                stop = self._stop_at
                if stop is not None and t > stop:
                    break
                _, _, _, _, fn, arg = pop(heap)
                self.now = t
                n += 1
                fn(arg)
        finally:
            self.events_processed += n
        if self._crash is not None:
            raise self._crash
        return self.next_time()

    # ------------------------------------------------------ coroutine driver
    def _start(self, worker: "Worker") -> None:
        coro = worker.run()
        if not isinstance(coro, Coroutine):
            raise KernelError(f"{type(worker).__name__}.run must be 'async def' (vworker {worker.name})")
        worker._coro = coro
        worker._resume(None)

    def _step(self, worker: "Worker", value: Any = None) -> None:
        """Resume ``worker``'s coroutine with ``value`` until it suspends again (the hot path)."""
        self._current = worker
        coro = worker._coro
        exc: BaseException | None = None
        while True:
            try:
                cmd = coro.throw(exc) if exc is not None else coro.send(value)
            except StopIteration:
                worker._finished()
                return
            except BaseException as e:  # a strategy bug: stop the run, name the vworker
                self._fail(worker, e)
                return
            if type(cmd) is int:
                # even a zero-length sleep goes through the heap, after the events already due
                if cmd < self.now:
                    exc = KernelError(f"vworker {worker.name} asked to resume in the past ({cmd} < {self.now})")
                    continue
                worker._seq += 1
                heapq.heappush(self._heap, (cmd, PRIO_RESUME, worker.id, worker._seq, self._step, worker))
                return
            if cmd is PARKED:
                return
            exc = ForeignAwaitableError(
                f"vworker {worker.name} awaited {cmd!r}, which is not a lockstep kernel awaitable; "
                "inside Worker.run use only self.sleep / self.compute / self.recv / self.wait / "
                "await on a send handle (no asyncio, no real sleeps)")
            value = None

    def _fail(self, worker: "Worker", e: BaseException) -> None:
        if isinstance(e, RuntimeError) and "event loop" in str(e):
            # asyncio.sleep(x) and friends look for a loop before yielding anything
            e = ForeignAwaitableError(
                f"vworker {worker.name} used asyncio ({e}); it is not a lockstep kernel awaitable: "
                "inside Worker.run use self.sleep / self.compute / self.recv / self.wait")
        if self._crash is None:
            self._crash = WorkerCrashed(worker.name, self.now, e)
            self._crash.__cause__ = e
        self._stop_at = self.now
        self._heap.clear()

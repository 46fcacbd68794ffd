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

For the controller's window ends (docs/distributed.md, "Window ends") a kernel
also knows when it can next *act* on another agent: :meth:`Kernel.output_bound`
is the earliest time any queued event could resume a vworker or post a remote
event (an ``"arrive"`` of S bytes cannot deliver before S bytes have crossed),
and once it posts a remote event that the receiver could act on at ``e``, it
stops its window at ``e + reply_lookahead``, the earliest an answer can come back.
"""
from __future__ import annotations

import heapq
import types
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Coroutine

from agents.sim.types import INFINITY, VirtualTime, VWorkerId

if TYPE_CHECKING:  # pragma: no cover
    from agents.sim.worker import Worker

__all__ = [
    "Kernel", "RemoteEvent", "Timer", "KernelError", "ForeignAwaitableError", "WorkerCrashed",
    "PRIO_NET", "PRIO_RESUME", "PARKED", "suspend_until", "park",
]

PRIO_NET = 0
"""Network events (arrival, tail, link completion, delivery) run before resumes at one instant."""
PRIO_RESUME = 1

# The heap key (time, priority, origin, seq) is stored as (time, order) with the last three packed into
# one int, which compares faster: 4 bits of priority, 24 of vworker id (16 M vworkers), 36 of sequence.
_ORIGIN_SHIFT = 36
_PRIO_SHIFT = 60
_RESUME_BITS = PRIO_RESUME << _PRIO_SHIFT
MAX_VWORKERS = 1 << (_PRIO_SHIFT - _ORIGIN_SHIFT)


def _order(priority: int, origin: int, seq: int) -> int:
    """The packed (priority, origin, seq) part of a heap key; run_until inlines it for plain resumes."""
    return (priority << _PRIO_SHIFT) | (origin << _ORIGIN_SHIFT) | seq


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


class _Halted:
    """The coroutine of a crashed vworker: whatever resumes it finds it parked for ever."""

    __slots__ = ()

    def send(self, value: Any) -> Any:
        return PARKED

    def throw(self, *exc: Any) -> Any:
        return PARKED

    def close(self) -> None:
        pass


HALTED = _Halted()


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
    origin: VWorkerId
    seq: int
    dst: VWorkerId
    kind: str
    data: Any
    effect: VirtualTime | None = None  # earliest time it can make ``dst`` act (None: ``time``)

    @property
    def acts_at(self) -> VirtualTime:
        return self.time if self.effect is None else self.effect


class Timer:
    """A scheduled call that can be cancelled (:meth:`Kernel.timer`); a cancelled one is no event at all."""

    __slots__ = ("fn", "cancelled")

    def __init__(self, fn: Callable[[], None]):
        self.fn, self.cancelled = fn, False

    def cancel(self) -> None:
        self.cancelled = True


def _fire(timer: Timer) -> None:
    timer.fn()


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
        self.current: "Worker | None" = None  # the vworker whose coroutine is running
        self._effects: dict[Callable[[Any], None], Callable[[Any, VirtualTime], VirtualTime]] = {}
        # when set (several agents, lookahead > 0): a window stops L after the earliest moment a
        # remote event posted in it lets the receiver act, the earliest an answer can be back
        self.reply_lookahead: VirtualTime | None = None
        self._cap: VirtualTime = INFINITY

    # ----------------------------------------------------------------- setup
    def add_worker(self, worker: "Worker", start: VirtualTime = 0) -> None:
        """Host ``worker`` here and schedule the start of its ``run()`` at ``start`` (``compute.start_spread``)."""
        if worker.id in self.workers:
            raise KernelError(f"vworker id {worker.id} ({worker.name}) added twice")
        if not 0 <= worker.id < MAX_VWORKERS:
            raise KernelError(f"vworker id {worker.id} outside [0, {MAX_VWORKERS})")
        self.workers[worker.id] = worker
        worker.attach(self)
        self.schedule(start, PRIO_RESUME, worker, self._start, worker)

    def is_local(self, vworker_id: int) -> bool:
        return vworker_id in self.workers

    def on_remote(self, kind: str, handler: Callable[[Any], None],
                  effect: Callable[[Any, VirtualTime], VirtualTime] | None = None) -> None:
        """Register the handler that runs a :class:`RemoteEvent` of ``kind`` when it comes due.

        ``effect(data, t)``, when given, is the earliest time such an event at ``t`` can resume a
        vworker or post anything (>= t); without it, ``t``.
        """
        self._remote_handlers[kind] = handler
        if effect is not None:
            self._effects[handler] = effect

    # ------------------------------------------------------------ scheduling
    def schedule(self, t: VirtualTime, priority: int, owner: "Worker",
                 fn: Callable[[Any], None], arg: Any = None) -> None:
        """Run ``fn(arg)`` at virtual time ``t``; the event is keyed by ``owner``'s counter."""
        if t < self.now:
            raise KernelError(f"event scheduled in the past: {t} < now {self.now} (owner {owner.name})")
        owner.origin_seq += 1
        heapq.heappush(self._heap, (t, _order(priority, owner.id, owner.origin_seq), fn, arg))

    def timer(self, t: VirtualTime, priority: int, owner: "Worker", fn: Callable[[], None]) -> Timer:
        """Like :meth:`schedule`, but cancellable: a cancelled timer neither runs nor counts as an event."""
        timer = Timer(fn)
        self.schedule(t, priority, owner, _fire, timer)
        return timer

    def post(self, t: VirtualTime, priority: int, owner: "Worker", dst: int, kind: str, data: Any,
             effect: VirtualTime | None = None) -> None:
        """An event for vworker ``dst``: scheduled here when ``dst`` is local, else sent via the outbox.

        ``effect`` (>= t) is the earliest time it can make ``dst`` act, as the ``effect`` function
        registered for ``kind`` computes it (None: ``t``).
        """
        owner.origin_seq += 1
        if dst in self.workers:
            if t < self.now:
                raise KernelError(f"event posted in the past: {t} < now {self.now}")
            heapq.heappush(self._heap, (t, _order(priority, owner.id, owner.origin_seq), self._remote_handlers[kind], data))
        else:
            self.outbox.append(RemoteEvent(t, priority, owner.id, owner.origin_seq, dst, kind, data, effect))
            if self.reply_lookahead is not None:
                cap = (t if effect is None else effect) + self.reply_lookahead
                if cap < self._cap:
                    self._cap = cap

    def inject(self, ev: RemoteEvent) -> None:
        """Insert an event that another agent posted for one of our vworkers (same heap key)."""
        if ev.dst not in self.workers:
            raise KernelError(f"event for vworker {ev.dst}, which this agent does not host")
        if ev.time < self.now:
            raise KernelError(f"causality violated: event at {ev.time} ns injected at {self.now} ns")
        handler = self._remote_handlers.get(ev.kind)
        if handler is None:
            raise KernelError(f"no handler for remote event kind {ev.kind!r}")
        heapq.heappush(self._heap, (ev.time, _order(ev.priority, ev.origin, ev.seq), handler, ev.data))

    def wake(self, worker: "Worker", value: Any = None, at: VirtualTime | None = None) -> None:
        """Resume a parked vworker at ``at`` (default: now) with ``value`` as the await's result."""
        self.schedule(self.now if at is None else at, PRIO_RESUME, worker, worker.resume, value)

    # -------------------------------------------------------------- stopping
    def request_stop(self) -> None:
        """Stop after every event of the current instant has run (DESIGN §5: stop conditions)."""
        if self._stop_at is None or self.now < self._stop_at:  # (also before a later stop.virtual_time)
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
        heap = self._heap
        while heap and heap[0][2] is _fire and heap[0][3].cancelled:
            heapq.heappop(heap)
        if not heap:
            return INFINITY
        t = heap[0][0]
        if self._stop_at is not None and t > self._stop_at:
            return INFINITY
        return t

    def output_bound(self) -> VirtualTime:
        """The earliest time a queued event could resume a vworker or post a remote event.

        At least :meth:`next_time`; later when the first events are arrivals still crossing
        (their ``effect``). INFINITY when nothing is queued or the run has stopped.
        """
        return self.first_output()[0]

    def first_output(self) -> tuple[VirtualTime, Callable[[Any], None] | None, Any]:
        """:meth:`output_bound` with the queued event that gives it: ``(bound, fn, arg)`` (fn None: a
        vworker's plain resume; ``(INFINITY, None, None)`` when nothing can act)."""
        best, first, first_i = INFINITY, (None, None), -1
        effects = self._effects
        heap = self._heap
        n = len(heap)
        # an event acts no earlier than its time, and a heap entry's children are no earlier than it: a
        # subtree whose root is after the best bound so far cannot hold a better one (ties go to the
        # lowest heap index, as a scan of the heap's list would give them)
        todo = [0] if n else []
        while todo:
            i = todo.pop()
            t, _, fn, arg = heap[i]
            if t > best:
                continue
            if not (fn is _fire and arg.cancelled):
                f = effects.get(fn) if effects and fn is not None else None
                b = t if f is None else f(arg, t)
                if b < best or (b == best and i < first_i):
                    best, first, first_i = b, (fn, arg), i
            c = 2 * i + 1
            if c < n:
                todo.append(c)
                if c + 1 < n:
                    todo.append(c + 1)
        if self._stop_at is not None and best > self._stop_at:
            return INFINITY, None, None
        return best, *first

    def run_until(self, window_end: VirtualTime = INFINITY, max_events: int | None = None) -> VirtualTime:
        """Run every event with time < ``window_end`` (and ≤ the stop time); return the next event time.

        ``max_events`` returns early (for progress reports of a single agent); the
        next call simply continues, so results do not depend on it.
        """
        heap = self._heap
        pop = heapq.heappop
        push = heapq.heappush
        n = 0
        limit = max_events if max_events is not None else -1
        self._cap = INFINITY
        try:
            while heap and n != limit:
                ev = pop(heap)
                t = ev[0]
                if t >= window_end or t >= self._cap or (self._stop_at is not None and t > self._stop_at):
                    push(heap, ev)  # not ours to run (yet): put it back
                    break
                fn = ev[2]
                if fn is _fire and ev[3].cancelled:
                    continue  # superseded: no event at all
                self.now = t
                n += 1
                if fn is not None:
                    fn(ev[3])
                    continue
                # the hot path, inlined: resume a vworker that slept until t
                w = ev[3]
                self.current = w
                try:
                    cmd = w.coro.send(None)
                except StopIteration:
                    w.mark_finished()
                    continue
                except BaseException as e:  # a strategy bug: stop the run, name the vworker
                    self._fail(w, e)
                    continue
                if type(cmd) is int and cmd >= t:
                    w.origin_seq += 1
                    push(heap, (cmd, _RESUME_BITS | (w.id << _ORIGIN_SHIFT) | w.origin_seq, None, w))
                else:
                    self._suspend(w, cmd)
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
        worker.coro = coro
        worker.resume(None)

    def drive(self, worker: "Worker", value: Any = None) -> None:
        """Resume ``worker``'s coroutine with ``value`` until it suspends again."""
        if worker.frozen_until > self.now:  # frozen by a fault: the wake-up waits for the thaw
            self.schedule(worker.frozen_until, PRIO_RESUME, worker, worker.resume, value)
            return
        self.current = worker
        try:
            cmd = worker.coro.send(value)
        except StopIteration:
            worker.mark_finished()
            return
        except BaseException as e:  # a strategy bug: stop the run, name the vworker
            self._fail(worker, e)
            return
        self._suspend(worker, cmd)

    def _suspend(self, worker: "Worker", cmd: Any) -> None:
        """Act on what a coroutine yielded: a wake-up time, PARKED, or a foreign awaitable."""
        while True:
            if type(cmd) is int:
                if cmd >= self.now:
                    # even a zero-length sleep goes through the heap, after the events already due;
                    # fn=None marks a plain resume, which run_until drives inline
                    worker.origin_seq += 1
                    heapq.heappush(self._heap, (cmd, _RESUME_BITS | (worker.id << _ORIGIN_SHIFT) | worker.origin_seq,
                                                None, worker))
                    return
                exc: BaseException = KernelError(
                    f"vworker {worker.name} asked to resume in the past ({cmd} < {self.now})")
            elif cmd is PARKED:
                return
            else:
                exc = ForeignAwaitableError(
                    f"vworker {worker.name} awaited {cmd!r}, which is not a lockstep kernel awaitable; "
                    "inside Worker.run use only self.sleep / self.compute / self.recv / self.wait / "
                    "await on a send handle (no asyncio, no real sleeps)")
            try:
                cmd = worker.coro.throw(exc)
            except StopIteration:
                worker.mark_finished()
                return
            except BaseException as e:
                self._fail(worker, e)
                return

    # ----------------------------------------------------------------- faults
    def halt(self, worker: "Worker") -> None:
        """A crash: ``worker``'s coroutine is closed and every pending resume of it forgotten."""
        if worker.coro is HALTED:
            return  # already down
        self._retime(worker, None)
        worker.incarnation += 1
        coro, worker.coro = worker.coro, HALTED
        if coro is not None and coro is not HALTED:
            coro.close()

    def freeze(self, worker: "Worker", until: VirtualTime) -> None:
        """``worker``'s coroutine runs nothing before ``until``: its pending resumes move there."""
        worker.frozen_until = max(worker.frozen_until, until)
        self._retime(worker, worker.frozen_until)

    def restart(self, worker: "Worker") -> None:
        """Start ``worker``'s ``run()`` afresh now (after :meth:`halt` and a re-initialisation)."""
        self.schedule(self.now, PRIO_RESUME, worker, self._start, worker)

    def _retime(self, worker: "Worker", until: VirtualTime | None) -> None:
        """Drop (``until`` None) or postpone to ``until`` every queued resume of ``worker``'s coroutine.

        Each keeps its (priority, origin, seq) order, so the heap's order stays placement-independent."""
        keep, moved = [], []
        for ev in self._heap:
            t, order, fn, arg = ev
            mine = ((fn is None and arg is worker) or (fn == self._start and arg is worker)
                    or (getattr(fn, "__self__", None) is worker and getattr(fn, "__name__", "") == "resume"))
            if mine and (until is None or t < until):
                if until is not None:
                    moved.append((until, order, fn, arg))
                continue
            keep.append(ev)
        keep.extend(moved)
        heapq.heapify(keep)
        self._heap[:] = keep

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

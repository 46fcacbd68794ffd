"""The Worker API (DESIGN §3): what a strategy writes against.

A strategy subclasses :class:`Worker` and implements ``async def run(self)``.
Inside it, only the kernel awaitables below advance virtual time::

    class PingPong(Worker):
        async def run(self):
            if self.name == "w0":
                self.send("w1", torch.zeros(1000))
            msg = await self.recv()
            ...
"""
from __future__ import annotations

import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agents.sim.kernel import PRIO_RESUME, Kernel, KernelError, park, suspend_until
from agents.sim.resume import continues, finishes, leaf
from agents.sim.types import VirtualTime

if TYPE_CHECKING:  # pragma: no cover
    from agents.sim.env import Environment

__all__ = ["Worker", "Message", "SendHandle", "Condition"]


class Message:
    """A delivered message. ``sent_at``/``delivered_at`` are virtual ns."""

    __slots__ = ("src", "dst", "tag", "payload", "nbytes", "sent_at", "delivered_at", "seq")

    def __init__(self, src: str, dst: str, tag: Any, payload: Any, nbytes: int, sent_at: VirtualTime, seq: int):
        self.src, self.dst, self.tag, self.payload = src, dst, tag, payload
        self.nbytes, self.sent_at, self.seq = nbytes, sent_at, seq
        self.delivered_at: VirtualTime | None = None

    def __repr__(self) -> str:
        return (f"Message({self.src}->{self.dst}, tag={self.tag!r}, {self.nbytes} B, "
                f"sent {self.sent_at}, delivered {self.delivered_at})")


class SendHandle:
    """Returned by :meth:`Worker.send`; ``await handle`` resumes when the last byte left the NIC."""

    __slots__ = ("done_at", "_waiters", "_kernel", "then")

    def __init__(self, kernel: Kernel, done_at: VirtualTime | None):
        self._kernel = kernel
        self.done_at = done_at  # None while a shared (fair) egress has not finished it
        self._waiters: list[tuple[Worker, int]] = []  # (vworker, its incarnation: a crash forgets the wait)
        self.then: SendHandle | None = None  # a send held by a partition completes when this one does

    @property
    def done(self) -> bool:
        return self.done_at is not None and self.done_at <= self._kernel.now

    def complete(self, t: VirtualTime) -> None:
        """The last byte left the NIC at ``t``: wake whoever awaits the handle (network side)."""
        self.done_at = t
        for w, incarnation in self._waiters:
            if w.incarnation == incarnation:
                self._kernel.wake(w, None)
        self._waiters.clear()
        if self.then is not None:
            self.then.finish(t)

    def finish(self, t: VirtualTime) -> None:
        """Like :meth:`complete` for a time ``t`` that may lie ahead: waiters resume at ``t``."""
        self.done_at = t
        for w, incarnation in self._waiters:
            if w.incarnation == incarnation:
                self._kernel.wake(w, None, at=max(t, self._kernel.now))
        self._waiters.clear()

    def __await__(self):
        if self.done_at is None:
            me = self._kernel.current
            self._waiters.append((me, me.incarnation))
            yield from park()
        elif self.done_at > self._kernel.now:
            yield from suspend_until(self.done_at)
        return self.done_at


class Condition:
    """A doorbell owned by one vworker: only the owner waits, anyone may notify.

    A notification from another vworker arrives after the network latency
    between the two (so it respects causality across agents); the owner's own
    notification is immediate.
    """

    __slots__ = ("owner", "name")

    def __init__(self, owner: "Worker", name: str):
        self.owner, self.name = owner, name

    def __repr__(self) -> str:
        return f"Condition({self.owner.name}.{self.name})"


class _Expiry:
    """A ``recv`` timeout: resume the vworker with None unless a message came first (an object, not a
    closure, so that a checkpoint can save the pending timer)."""

    __slots__ = ("worker", "incarnation")

    def __init__(self, worker: "Worker"):
        self.worker, self.incarnation = worker, worker.incarnation

    def __call__(self) -> None:  # (not after a crash: the restarted vworker never asked)
        w = self.worker
        if w._recv_filter is not None and w.incarnation == self.incarnation:
            w._recv_filter = None
            w._kernel.drive(w, None)


class Worker:
    """A virtual worker: one emulated machine running a strategy's coroutine."""

    def __init__(self, name: str, vid: int, env: "Environment"):
        self.name = name
        self.id = vid
        self.env = env
        self.origin_seq = 0  # events this vworker has created: the last part of the heap key
        self._kernel: Kernel | None = None
        self.coro = None
        self._mailbox: list[Message] = []
        self._recv_filter: tuple[Any, Any] | None = None  # set while parked in recv
        self._waiting_on: str | None = None  # condition name while parked in wait
        self._rang: set[str] = set()
        self.msg_seq = 0  # messages sent, for keyed latency draws
        self.compute_seq = 0  # compute calls, for keyed duration draws
        self.finished = False
        self.incarnation = 0  # crashes so far (faults: a restart forgets what the crashed one waited for)
        self.frozen_until: VirtualTime = 0  # faults: a frozen vworker's coroutine waits until then
        self.restarted = False  # faults: this incarnation started after a crash (a strategy rejoins)
        self._handlers: dict[Any, Any] = {}  # tag -> called with each message of that tag on delivery

    # -------------------------------------------------- lifecycle (kernel side)
    # The kernel drives a vworker through these and through ``coro`` (its running ``run()``) and
    # ``origin_seq`` (the events it has created: the last part of every heap key it owns).
    def attach(self, kernel: Kernel) -> None:
        """Called once by :meth:`Kernel.add_worker`."""
        self._kernel = kernel

    def resume(self, value: Any) -> None:
        """Continue ``run()`` with ``value`` as the result of the pending await (kernel side)."""
        self._kernel.drive(self, value)

    def mark_finished(self) -> None:
        self.finished = True

    def parked_on(self) -> str | None:
        """What this vworker's coroutine is parked on — ``recv(...)`` or ``wait(...)`` — or None (finished,
        crashed, or waiting for a time). A run that ends with no event left and vworkers parked names them."""
        from agents.sim.kernel import HALTED

        if self.finished or self.coro is None or self.coro is HALTED:
            return None
        f = self._recv_filter
        if f is not None:
            return f"recv(src={'any' if f[0] is None else f[0]}, tag={'any' if f[1] is None else repr(f[1])})"
        if self._waiting_on is not None:
            return f"wait({self._waiting_on})"
        return None

    async def run(self) -> None:  # pragma: no cover - subclasses implement it
        raise KernelError(f"{type(self).__name__} must implement async def run(self)")

    # ----------------------------------------------------------- the API
    @property
    def now(self) -> VirtualTime:
        """Current virtual time in integer nanoseconds."""
        return self._kernel.now

    @types.coroutine
    def sleep(self, dt: VirtualTime):
        """``await self.sleep(dt)``: resume at ``now + dt`` (ns). A bare generator: the hottest await."""
        if dt < 0:
            raise KernelError(f"{self.name}: sleep({dt}) with a negative duration")
        yield self._kernel.now + dt

    async def compute(self, fn: Callable[..., Any], *args: Any, kind: str = "gradient",
                      cost: float | None = None, **kwargs: Any) -> Any:
        """Run ``fn(*args)`` for real; resume after the modelled duration (DESIGN §4.2).

        With ``compute.batch`` set, the call is deferred: it becomes a task of the agent's executor
        (:mod:`agents.sim.executor`), which computes its value no later than this vworker resumes.
        """
        ex = self.env.executor
        if ex is not None:
            d = self.env.compute.ahead(self, kind, fn, args, cost)
            if d is not None:
                start = self._kernel.now
                task = ex.issue(self, kind, fn, args, kwargs, start)
                self.compute_seq += 1
                self.env.on_compute(self, kind, start, start + d, 0.0)  # wall time: added when it runs
                await suspend_until(start + d)
                return ex.result(task)
        t0 = time.perf_counter()
        result = fn(*args, **kwargs)
        wall = time.perf_counter() - t0
        d = self.env.compute.duration(self, kind, fn, args, wall, cost)
        self.compute_seq += 1
        start = self._kernel.now
        self.env.on_compute(self, kind, start, start + d, wall)
        await suspend_until(start + d)
        return result

    def send(self, dst: str | int, payload: Any, nbytes: int | None = None, tag: Any = None) -> SendHandle:
        """Queue ``payload`` on this vworker's NIC towards ``dst``; see DESIGN §4.1 for timing.

        A network partition between the two (``faults:``) holds the message until it heals."""
        d = self.env.resolve(dst)
        faults = self.env.faults
        if faults.partitions:
            heal = faults.heals_at(self.id, d, self._kernel.now)
            if heal is not None:
                return self.env.hold(self, d, payload, nbytes, tag, heal)
        return self.env.network.send(self, d, payload, nbytes, tag)

    async def recv(self, src: str | None = None, tag: Any = None, timeout: VirtualTime | None = None) -> Message:
        """Wait until a message matching ``src``/``tag`` (None = any) is delivered; return it.

        With ``timeout`` (ns), return None when none came within it (a round deadline)."""
        msg = self.recv_nowait(src, tag)
        if msg is not None:
            return msg
        self._recv_filter = (src, tag)
        if timeout is None:
            return await park()
        timer = self._kernel.timer(self._kernel.now + timeout, PRIO_RESUME, self, _Expiry(self))
        msg = await park()
        timer.cancel()
        return msg

    def recv_nowait(self, src: str | None = None, tag: Any = None) -> Message | None:
        """A delivered message matching ``src``/``tag``, or None."""
        box = self._mailbox
        for i, m in enumerate(box):
            if (src is None or m.src == src) and (tag is None or m.tag == tag):
                return box.pop(i)
        return None

    def handle(self, tag: Any, fn) -> None:
        """Call ``fn(msg)`` for every message of ``tag`` as it is delivered, instead of keeping it for ``recv``:
        what a transport's own thread does with its control messages whatever the application awaits.
        ``fn=None`` stops it: later messages of ``tag`` are kept for ``recv`` again."""
        if fn is None:
            self._handlers.pop(tag, None)
        else:
            self._handlers[tag] = fn

    def condition(self, name: str) -> Condition:
        """A doorbell owned by this vworker (see :class:`Condition`)."""
        return Condition(self, name)

    async def wait(self, cond: Condition) -> None:
        """Wait until ``cond`` is notified (a notification before the wait is remembered once)."""
        if cond.owner is not self:
            raise KernelError(f"{self.name} waits on {cond!r}: only its owner may wait on a condition")
        if cond.name in self._rang:
            self._rang.discard(cond.name)
            return
        self._waiting_on = cond.name
        await park()

    def notify(self, cond: Condition) -> None:
        """Ring ``cond``: its owner wakes now (own condition) or after the network latency."""
        self.env.network.notify(self, cond.owner.id, cond.name)

    def stop_run(self) -> None:
        """The run's stop condition fired: finish this virtual instant, then stop everything."""
        self._kernel.request_stop()

    # ------------------------------------------------- delivery (network side)
    def deliver(self, msg: Message) -> None:
        """The network delivered ``msg``: hand it to its tag's handler, wake a matching ``recv`` or keep it."""
        if self._handlers:
            fn = self._handlers.get(msg.tag)
            if fn is not None:
                fn(msg)
                return
        f = self._recv_filter
        if f is not None and (f[0] is None or msg.src == f[0]) and (f[1] is None or msg.tag == f[1]):
            self._recv_filter = None
            self._kernel.schedule(self._kernel.now, PRIO_RESUME, self, self.resume, msg)
        else:
            self._mailbox.append(msg)

    def ring(self, name: str) -> None:
        """A notification of condition ``name`` reached this vworker (network side)."""
        if self._waiting_on == name:
            self._waiting_on = None
            self._kernel.wake(self, None)
        else:
            self._rang.add(name)


# ------------------------------------------------------------------ checkpoints (agents.checkpoint)
# The rest of each API await, for a coroutine rebuilt from a checkpoint: what the frame does after the
# kernel resumed it with ``value``. Keep each in step with the method it continues.
leaf(Worker.sleep)


@continues(SendHandle.__await__)
async def _(f: dict[str, Any], value: Any, below: str) -> Any:
    return f["self"].done_at


@continues(Worker.compute)
async def _(f: dict[str, Any], value: Any, below: str) -> Any:
    return f["ex"].result(f["task"]) if "task" in f else f["result"]


@continues(Worker.recv)
async def _(f: dict[str, Any], value: Any, below: str) -> Any:
    if "timer" in f:
        f["timer"].cancel()
    return value


finishes(Worker.wait, None)

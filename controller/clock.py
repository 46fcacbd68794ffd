"""The controller's window loop — DESIGN §5, conservative time windows.

Repeat: ``T`` = the earliest next event of any agent or undelivered message;
give each agent ``a`` its own window end ``W_a`` (:func:`window_ends`: the
lookahead — the minimum latency between vworkers on different agents — after
the earliest moment any *other* agent could act on it, so nothing sent in this
window can arrive before ``W_a``; with zero lookahead ``W = T + 1``: the single
instant ``T``, repeated until nothing more happens at it); advance every agent
with work before its end; route what they sent (each event keeps its heap key,
so no clock moves backwards).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from agents.common.windows import ends_from_first
from agents.core import Reached
from agents.sim.kernel import RemoteEvent
from agents.sim.types import INFINITY, VirtualTime

__all__ = ["AgentHandle", "Window", "run_windows"]


class AgentHandle(Protocol):
    """What the loop needs of an agent: an in-process AgentCore or a gRPC proxy."""

    def next_time(self) -> VirtualTime: ...

    def output_bound(self) -> VirtualTime: ...

    def advance(self, window_end: VirtualTime, inbound: list[RemoteEvent],
                stop_at: VirtualTime | None, max_events: int | None) -> Reached: ...


@dataclass
class Window:
    start: VirtualTime  # T: no event of any agent was earlier (each agent had its own end)
    reached: list[Reached]
    stop_time: VirtualTime | None
    barrier_wall_s: float
    next_start: VirtualTime  # lower bound of every later event (rows before it are final)
    count: int = 1  # windows this report covers (direct windows report several at once)


def run_windows(handles: Sequence[AgentHandle], placement: Sequence[int], lookahead: VirtualTime,
                on_window: Callable[[Window], None], chunk_events: int = 5000,
                should_abort: Callable[[], None] | None = None,
                between: Callable[[Callable[[], dict]], None] | None = None,
                start: dict | None = None) -> VirtualTime | None:
    """Drive the agents to the end of the run; return the stop time (None: ran out of events).

    ``between(view)``: called between every two windows (a checkpoint may be taken there; ``view()`` is
    this loop's state then). ``start``: such a view, to go on from (the agents were restored from it).
    """
    n = len(handles)
    next_t = [h.next_time() for h in handles]
    bound = [h.output_bound() for h in handles]
    pending: list[list[RemoteEvent]] = [[] for _ in handles]
    stop_time: VirtualTime | None = None
    if start is not None:
        next_t, bound = list(start["next_t"]), list(start["bound"])
        pending, stop_time = [list(p) for p in start["pending"]], start["stop_time"]

    def view() -> dict:
        return {"next_t": list(next_t), "bound": list(bound), "pending": [list(p) for p in pending],
                "stop_time": stop_time}

    while True:
        if should_abort is not None:
            should_abort()
        if between is not None:
            between(view)
        T = _earliest(next_t, pending)
        if T >= INFINITY or (stop_time is not None and T > stop_time):
            return stop_time
        ends = window_ends(T, bound, pending, lookahead)
        max_events = chunk_events if n == 1 else None  # one agent: chunks only feed progress
        t0 = time.perf_counter()
        reached = []
        # remote agents (begin_advance/end_advance) run the window in parallel; results are taken in agent order
        started: list[tuple[int, AgentHandle, Reached | None]] = []
        for a, h in enumerate(handles):
            W = ends[a]
            if next_t[a] < W or pending[a]:
                inbound, pending[a] = pending[a], []
                begin = getattr(h, "begin_advance", None)
                if begin is not None:
                    begin(W, inbound, stop_time, max_events)
                    started.append((a, h, None))
                else:
                    started.append((a, h, h.advance(W, inbound, stop_time, max_events)))
        for a, h, r in started:
            if r is None:
                r = h.end_advance()
            next_t[a] = r.next_time
            bound[a] = r.horizon
            for ev in r.outbound:
                pending[placement[ev.dst]].append(ev)
            if r.stop_time is not None:
                stop_time = r.stop_time if stop_time is None else min(stop_time, r.stop_time)
            reached.append(r)
        on_window(Window(T, reached, stop_time, time.perf_counter() - t0, _earliest(next_t, pending)))


def window_ends(T: VirtualTime, bound: Sequence[VirtualTime], pending: Sequence[Sequence[RemoteEvent]],
                lookahead: VirtualTime) -> list[VirtualTime]:
    """Each agent's window end (docs/distributed.md, "Window ends"): :func:`agents.common.windows.ends_from_first`
    with ``first(b)`` the earlier of agent ``b``'s output ``bound`` and the ``acts_at`` of any event in
    ``pending[b]``, the events routed to it.
    """
    n = len(bound)
    if n == 1 or lookahead >= INFINITY or lookahead <= 0:
        return ends_from_first(T, bound, lookahead)
    return ends_from_first(T, [min([bound[b], *(ev.acts_at for ev in pending[b])]) for b in range(n)], lookahead)


def _earliest(next_t: list[VirtualTime], pending: list[list[RemoteEvent]]) -> VirtualTime:
    """The earliest next event of any agent or undelivered message (DESIGN §5 step 1)."""
    return min([*next_t, *(ev.time for p in pending for ev in p)])

"""The controller's window loop — DESIGN §5, conservative time windows.

Repeat: ``T`` = the earliest next event of any agent or undelivered message;
``W = T + lookahead`` (the minimum latency between vworkers on different
agents, so nothing sent at ``t >= T`` can arrive before ``W``; with zero
lookahead ``W = T + 1``: the single instant ``T``, repeated until nothing more
happens at it); advance every agent with work before ``W``; route what they
sent (each event keeps its heap key, so no clock moves backwards).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

from agents.core import Reached
from agents.kernel import RemoteEvent
from agents.types import INFINITY, VirtualTime

__all__ = ["AgentHandle", "Window", "run_windows"]


class AgentHandle(Protocol):
    """What the loop needs of an agent: an in-process AgentCore or a gRPC proxy."""

    def next_time(self) -> VirtualTime: ...

    def advance(self, window_end: VirtualTime, inbound: list[RemoteEvent],
                stop_at: VirtualTime | None, max_events: int | None) -> Reached: ...


@dataclass
class Window:
    start: VirtualTime
    end: VirtualTime
    reached: list[Reached]
    stop_time: VirtualTime | None
    barrier_wall_s: float
    next_start: VirtualTime  # lower bound of every later event (rows before it are final)


def run_windows(handles: Sequence[AgentHandle], placement: Sequence[int], lookahead: VirtualTime,
                on_window: Callable[[Window], None], chunk_events: int = 5000,
                should_abort: Callable[[], None] | None = None) -> VirtualTime | None:
    """Drive the agents to the end of the run; return the stop time (None: ran out of events)."""
    n = len(handles)
    next_t = [h.next_time() for h in handles]
    pending: list[list[RemoteEvent]] = [[] for _ in handles]
    stop_time: VirtualTime | None = None
    while True:
        if should_abort is not None:
            should_abort()
        T = _earliest(next_t, pending)
        if T >= INFINITY or (stop_time is not None and T > stop_time):
            return stop_time
        if n == 1:
            W, max_events = INFINITY, chunk_events  # nothing to synchronise: chunks only feed progress
        else:
            W, max_events = (INFINITY if lookahead >= INFINITY else T + max(lookahead, 1)), None
        t0 = time.perf_counter()
        reached = []
        # remote agents (begin_advance/end_advance) run the window in parallel; results are taken in agent order
        started: list[tuple[int, AgentHandle, Reached | None]] = []
        for a, h in enumerate(handles):
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
            for ev in r.outbound:
                pending[placement[ev.dst]].append(ev)
            if r.stop_time is not None:
                stop_time = r.stop_time if stop_time is None else min(stop_time, r.stop_time)
            reached.append(r)
        on_window(Window(T, W, reached, stop_time, time.perf_counter() - t0, _earliest(next_t, pending)))


def _earliest(next_t: list[VirtualTime], pending: list[list[RemoteEvent]]) -> VirtualTime:
    """The earliest next event of any agent or undelivered message (DESIGN §5 step 1)."""
    return min([*next_t, *(ev.time for p in pending for ev in p)])

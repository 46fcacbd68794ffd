"""The controller's side of direct windows (``controller.windows=direct``, agents/mesh.py).

The controller asks every agent where it accepts direct-window streams (call ``mesh_open``),
hands each the others' addresses and the key for each agent it dials (``pair_key``), with
everyone's first next-event time and output bound (call ``mesh_run``), and from then on only
listens: each agent streams its rows and counters as ``Reached`` frames, with the frontier of the
windows it has run (no later window has an event before it), and answers the call with
``(stop time, windows)`` when the run is over.
Rows are merged and written in their global order as the frontier of every agent passes them,
exactly as with the controller's own window loop. Dead and silent agents are found as there:
the launcher's check and ``controller.agent_timeout_s``.
"""
from __future__ import annotations

import queue
from collections import deque
import threading
import time
from typing import Any, Callable

from agents.common import wire
from agents.core import Reached
from agents.direct import pair_key
from agents.sim.types import VirtualTime
from controller.checkpoints import Checkpointer
from controller.clock import Window
from protos.lockstep.v1 import agent_pb2 as pb

__all__ = ["run_direct"]

_POLL_S = 0.02


def run_direct(handles: list[Any], on_window: Callable[[Window], None], report_s: float = 0.05,
               should_abort: Callable[[], None] | None = None, checkpoints: Checkpointer | None = None,
               start: dict[str, Any] | None = None) -> tuple[VirtualTime | None, int]:
    """Run the windows over the agents' direct streams; return (stop time, windows).

    ``checkpoints``: take coordinated checkpoints (controller/checkpoints.py). ``start``: the agents were
    restored from a checkpoint; its view of the windows (what :meth:`Checkpointer.finish` was given).
    """
    n = len(handles)
    opened = []
    for h in handles:
        uds, tcp, secret = h._call("mesh_open")
        opened.append((h.agent_id, uds, tcp, secret))
    next_times = [h.next_time() for h in handles]
    horizons = [h.output_bound() for h in handles]
    ids = {}
    for h in handles:
        h._calls += 1
        ids[h.agent_id] = h._calls
        f = pb.ControllerFrame()
        f.call.id, f.call.method = h._calls, "mesh_run"
        # each agent gets the key for each agent it dials, never a secret: no agent can speak for another
        me = h.agent_id
        peers = [(a, uds, tcp, pair_key(secret, me, a) if a > me else b"") for a, uds, tcp, secret in opened]
        wire.encode_value((peers, next_times, horizons, report_s, start is not None), f.call.args)
        h.session.send(f)
    frontier = [0] * n
    stop: VirtualTime | None = None
    windows = [0] * n
    counted = 0
    if start is not None:
        frontier, stop = list(start["frontier"]), start["stop"]
        windows, counted = list(start["windows"]), int(start["counted"])
    results: dict[int, tuple] = {}
    t_last = time.perf_counter()
    ck = checkpoints
    later: list[deque] = [deque() for _ in handles]  # frames of an agent held during a checkpoint round
    while len(results) < n or (ck is not None and ck.round is not None):
        progressed = False
        if ck is not None and len(results) < n:
            k = ck.due(max(windows))
            if k is not None:
                asked = {}
                for h in handles:
                    h._calls += 1
                    asked[h.agent_id] = h._calls
                    f = pb.ControllerFrame()
                    f.call.id, f.call.method = h._calls, "checkpoint"
                    wire.encode_value((k,), f.call.args)
                    h.session.send(f)
                ck.asked(k, asked)
        for a, h in enumerate(handles):
            if a in results and (ck is None or ck.round is None or a in ck.round.answered):
                continue
            inbox = h.session.inbox
            if ck is not None and ck.holding(a):
                # its checkpoint is in: what it sends next belongs after the checkpoint. Kept aside here, not
                # in the session's inbox, which is bounded
                while inbox.qsize():
                    later[a].append(inbox.get_nowait())
                continue
            if later[a]:
                item = later[a].popleft()
            else:
                try:
                    item = inbox.get_nowait()
                except queue.Empty:
                    continue
            progressed = True
            msg, blobs = _interpret(h, item)
            body = msg.WhichOneof("body")
            if body == "reply" and ck is not None and ck.is_answer(h.agent_id, msg.reply.id):
                try:
                    ck.answer(a, wire.decode_value(msg.reply.value, blobs))
                except (wire.WireError, ValueError) as e:
                    raise h.fail(f"sent a malformed answer to checkpoint: {e}") from e
                if ck.complete():
                    ck.finish({"frontier": list(frontier), "stop": stop, "windows": list(windows),
                               "counted": counted})
                continue
            if body == "reply" and msg.reply.id == ids[h.agent_id]:
                try:
                    res = wire.decode_value(msg.reply.value, blobs)
                except wire.WireError as e:
                    raise h.fail(f"sent a malformed reply to mesh_run: {e}") from e
                if not (isinstance(res, tuple) and len(res) == 2):
                    raise h.fail(f"sent a malformed reply to mesh_run: {res!r}")
                results[a] = res
                continue
            if body != "reached":
                raise h.fail(f"protocol error: expected progress of the direct windows, got {body}")
            r = _progress(h, msg.reached, blobs)
            frontier[a] = max(frontier[a], r.next_time)
            windows[a] = max(windows[a], msg.reached.window)
            if r.stop_time is not None:
                stop = r.stop_time if stop is None else min(stop, r.stop_time)
            now = time.perf_counter()
            # windows are counted once: by how far the furthest agent's reports have come
            count, counted = max(windows) - counted, max(windows)
            on_window(Window(min(frontier), [r], stop, now - t_last, min(frontier), count))
            t_last = now
        if not progressed:
            for h in handles:
                h._poll()
                silent = time.monotonic() - h.session.last_seen
                if silent > h.timeout_s:
                    raise h.fail(f"sent nothing for {silent:.1f} s during the direct windows "
                                 f"(controller.agent_timeout_s={h.timeout_s:g})", lost=True)
            if should_abort is not None:
                should_abort()
            threading.Event().wait(_POLL_S)
    outcomes = set(results.values())
    if len(outcomes) != 1:
        raise handles[0].fail(f"the agents ended the direct windows differently: {sorted(results.items())}")
    end_stop, n_windows = outcomes.pop()
    if n_windows != counted:
        raise handles[0].fail(f"the agents reported {counted} windows in their progress but {n_windows} at the end")
    return end_stop, int(n_windows)


def _interpret(h: Any, item: tuple) -> tuple[Any, dict]:
    """An inbox item of agent ``h``; a failure (e.g. a lost peer) prefers the launcher's account."""
    try:
        return h.interpret(item)
    except Exception as first:
        # an agent whose peer died reports the broken stream; the launcher knows who really died
        deadline, nap = time.monotonic() + 1.0, threading.Event()
        while time.monotonic() < deadline:
            h._poll()
            nap.wait(0.02)
        raise first


def _progress(h: Any, r: Any, blobs: dict) -> Reached:
    updates, evals, events, stats = h.decode_rows(r, blobs, "progress report")
    return Reached(r.next_time, [], r.stop_time if r.HasField("stop_time") else None, r.horizon,
                   updates, evals, events, stats)

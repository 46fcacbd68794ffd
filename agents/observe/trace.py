"""The run's timeline in Chrome trace-event format (``trace.json``, opens in Perfetto) — DESIGN §8.

Two halves, so that agents stay cheap and transport-independent:

* :class:`Tracer` lives in each agent (``Environment.tracer``). Its hooks append
  small plain tuples to the agent's ``Recorder.events`` (kind ``"trace"``), so
  they reach the controller with the rows of their window over any transport.
  A compute record is ``("c", vid, kind, t0, t1)``; a message record, made at
  delivery when all its times are known, is ``("m", src, dst, seq, tag, nbytes,
  sent_at, e0, e1, arrival, delivered)`` (DESIGN §4.1: egress ``[e0, e1)`` on
  the sender, first byte at ``arrival = e0 + L``, delivery at
  ``max(ingress done, e1 + L)``).
* :class:`TraceWriter` (controller) turns the records into trace events: a
  process per agent, a thread per vworker with its compute spans (by kind) and
  the waits between them, and for each vworker "egress"/"ingress" threads with
  one span per transfer and a flow arrow from each send to its receiver.

Concurrent transfers of one NIC overlap in time, which a single Chrome thread
cannot show, so they are packed greedily into lanes (``w3 egress``, ``w3 egress
2``, …); a lane never reuses the instant its previous span ended, so a flow end
binds to exactly one span. Times: ``ts``/``dur`` are microseconds, as the format
requires (``ns / 1000``, exact to the nanosecond in a double for runs shorter than
about 100 days of virtual time).

Size: ``mode=full`` traces everything up to ``max_events``; ``sample`` keeps the
servers (vworkers that hold no data) and every ``sample_every``-th worker;
``window`` keeps what overlaps ``[start, end]`` seconds; ``off`` builds no tracer.
Messages in flight when the run stops are not drawn.
"""
from __future__ import annotations

import heapq
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.common.files import atomic_file
from agents.sim.types import VirtualTime, seconds_to_ns

if TYPE_CHECKING:  # pragma: no cover
    from agents.sim.network import Transfer
    from agents.sim.worker import Worker

__all__ = ["MODES", "TRACE_KIND", "Tracer", "TraceSpec", "TraceWriter", "trace_spec", "tracer_for", "spool_path"]

MODES = ("full", "sample", "window", "off")
TRACE_KIND = "trace"
"""``Recorder.events`` kind of every trace record."""

DEFAULT_MAX_EVENTS = 1_000_000


def spool_path(trace_path: str | os.PathLike[str]) -> Path:
    """Where the records of ``trace.json`` wait while the run goes (``trace.records.jsonl``)."""
    return Path(trace_path).with_name("trace.records.jsonl")


@dataclass(frozen=True)
class TraceSpec:
    """What an agent records for trace.json (``Plan.trace``); ``mode="off"`` records nothing."""

    mode: str = "off"
    keep: tuple[int, ...] | None = None  # sample: the vworker ids kept (servers and every N-th worker)
    window_ns: tuple[VirtualTime, VirtualTime] | None = None
    max_events: int | None = DEFAULT_MAX_EVENTS

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TraceSpec":
        keep, w = d.get("keep"), d.get("window_ns")
        return cls(d["mode"], None if keep is None else tuple(keep), None if w is None else (int(w[0]), int(w[1])),
                   d.get("max_events"))


def trace_spec(mode: str = "full", sample_every: int = 8, window_s: Sequence[float] | None = None,
               max_events: int | None = DEFAULT_MAX_EVENTS, holds_data: Sequence[bool] = ()) -> TraceSpec:
    """The trace settings of a run. ``holds_data[vid]`` tells servers (False) from workers (True) for ``sample``."""
    keep = None
    if mode == "sample":
        keep, k = [], 0
        for vid, holder in enumerate(holds_data):
            if not holder or k % sample_every == 0:
                keep.append(vid)
            k += bool(holder)
    window = None
    if mode == "window" and window_s is not None:
        window = (seconds_to_ns(window_s[0]), seconds_to_ns(window_s[1]))
    return TraceSpec(mode, None if keep is None else tuple(keep), window, max_events)


def tracer_for(spec: TraceSpec) -> "Tracer | None":
    """The agent's Tracer for ``spec``, or None when tracing is off."""
    if spec.mode == "off":
        return None
    return Tracer(keep=spec.keep, window_ns=spec.window_ns, max_records=spec.max_events)


class Tracer:
    """Agent-side hooks (called by ``Environment``): record compute spans and delivered messages."""

    __slots__ = ("keep", "window", "max_records", "records", "dropped")

    def __init__(self, keep: Iterable[int] | None = None, window_ns: tuple[VirtualTime, VirtualTime] | None = None,
                 max_records: int | None = None):
        self.keep = None if keep is None else frozenset(keep)
        self.window = window_ns
        self.max_records = max_records  # a guard per agent; the writer enforces the global cap
        self.records = 0
        self.dropped = 0

    def _take(self, t0: VirtualTime, t1: VirtualTime) -> bool:
        w = self.window
        if w is not None and (t1 < w[0] or t0 > w[1]):
            return False
        if self.max_records is not None and self.records >= self.max_records:
            self.dropped += 1
            return False
        self.records += 1
        return True

    def send(self, w: "Worker", tr: "Transfer") -> None:
        """Nothing yet: under a fair egress the transfer's end is known only at delivery."""

    def compute(self, w: "Worker", kind: str, t0: VirtualTime, t1: VirtualTime) -> None:
        if (self.keep is None or w.id in self.keep) and self._take(t0, t1):
            w.env.recorder.events.append(((t0, w.id, 0), TRACE_KIND, w.name, ("c", w.id, kind, t0, t1)))

    def deliver(self, w: "Worker", tr: "Transfer", t: VirtualTime) -> None:
        keep = self.keep
        if keep is not None and tr.src not in keep and tr.dst not in keep:
            return
        if self._take(tr.e0, t):
            tag = tr.tag if tr.tag is None or isinstance(tr.tag, (str, int)) else str(tr.tag)
            rec = ("m", tr.src, tr.dst, tr.seq, tag, tr.nbytes, tr.sent_at, tr.e0, tr.tail - tr.latency,
                   tr.e0 + tr.latency, t)
            w.env.recorder.events.append(((t, w.id, 0), TRACE_KIND, w.name, rec))


def _us(ns: VirtualTime) -> float:
    return ns / 1000


def write_compact_json(doc: dict[str, Any], f: Any, chunk: int = 4096) -> None:
    """``json.dump(doc, f, separators=(",", ":"))`` and a newline: the same bytes, by the C encoder.

    ``json.dump`` encodes with the pure-Python encoder (only one-shot ``dumps`` uses the C one); here each
    trace event is a ``dumps``, written ``chunk`` at a time, so the document is never one string in memory.
    """
    enc = json.JSONEncoder(separators=(",", ":")).encode
    events = doc["traceEvents"]
    head = enc({**doc, "traceEvents": []})  # the keys in the document's order, the events last
    assert head.endswith('"traceEvents":[]}'), "traceEvents must be the document's last key"
    f.write(head[:-2])
    for i in range(0, len(events), chunk):
        f.write(("," if i else "") + ",".join(map(enc, events[i:i + chunk])))
    f.write("]}\n")


class TraceWriter:
    """Collects trace records of every agent and writes ``trace.json`` at :meth:`close`."""

    def __init__(self, path: str | os.PathLike[str], names: Sequence[str], placement: Sequence[int],
                 keep: Iterable[int] | None = None, window_ns: Sequence[int] | None = None,
                 max_events: int | None = DEFAULT_MAX_EVENTS, meta: dict[str, Any] | None = None):
        self.path = Path(path)
        self.names, self.placement = list(names), list(placement)
        self.keep = None if keep is None else frozenset(keep)
        self.window = None if window_ns is None else (int(window_ns[0]), int(window_ns[1]))
        self.max_events = max_events
        self.meta = dict(meta or {})
        self.compute: list[tuple] = []
        self.messages: list[tuple] = []
        self.n_events = 0
        self.truncated = False
        # the earliest start (a compute's t0, a transfer's send time) of a record left out at max_events: every
        # record that started before it is in the file (otherData.truncated_at_ns; None: nothing left out)
        self.truncated_at: int | None = None
        # records also go to a spool file as they arrive (flush, every window): a controller killed
        # before close() leaves them there, and `lockstep inspect` reads them (read_spool)
        self.spool = spool_path(self.path)
        self._spool: Any = None
        self._unspooled: list[tuple] = []

    def add(self, rec: tuple) -> None:
        """One record from an agent (see the module docstring)."""
        keep = self.keep
        if keep is not None and (rec[1] not in keep if rec[0] == "c" else rec[1] not in keep and rec[2] not in keep):
            return
        cost = 2 if rec[0] == "c" else 4  # a compute span (+ a wait); 2 transfer spans + 2 flow ends
        if self.max_events is not None and self.n_events + cost > self.max_events:
            self.truncated = True
            start = int(rec[3] if rec[0] == "c" else rec[6])
            self.truncated_at = start if self.truncated_at is None else min(self.truncated_at, start)
            return
        self.n_events += cost
        (self.compute if rec[0] == "c" else self.messages).append(rec)
        self._unspooled.append(rec)

    def flush(self) -> None:
        """Append the records received since the last flush to the spool file."""
        if not self._unspooled:
            return
        if self._spool is None:
            self._spool = open(self.spool, "w")
        self._spool.write("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in self._unspooled))
        self._spool.flush()
        self._unspooled = []

    def document(self, stop_time: VirtualTime | None = None) -> dict[str, Any]:
        """The trace-event document; records after ``stop_time`` (other agents ran past it) are left out."""
        if stop_time is not None:
            self.compute = [r for r in self.compute if r[3] <= stop_time]
            self.messages = [r for r in self.messages if r[10] <= stop_time]
        return {"displayTimeUnit": "ns",
                "otherData": {**self.meta, "clock": "virtual", "truncated": self.truncated,
                              "truncated_at_ns": self.truncated_at, "max_events": self.max_events},
                "traceEvents": self._metadata_and_spans()}

    def close(self, stop_time: VirtualTime | None = None, keep_spool: bool = False) -> Path:
        """Write ``trace.json`` (see :meth:`document`) and remove the spool — unless ``keep_spool``: a run that
        did not complete (stopped by a signal, or failed) keeps it for ``lockstep resume``, whose checkpoint
        counted its bytes (docs/recovery.md)."""
        doc = self.document(stop_time)
        with atomic_file(self.path) as f:
            write_compact_json(doc, f)
        if self._spool is not None:
            self._spool.close()
        if not keep_spool:
            self.spool.unlink(missing_ok=True)
        return self.path

    @classmethod
    def read_spool(cls, path: str | os.PathLike[str], names: Sequence[str],
                   placement: Sequence[int]) -> dict[str, Any]:
        """The trace document of a run whose controller died before writing ``trace.json``, from its spool
        (records up to its last window; a torn last line is left out)."""
        from agents.observe.statelog import read_jsonl

        w = cls(Path(path).with_name("trace.json"), names, placement, max_events=None,
                meta={"from_spool": True})
        for rec in read_jsonl(path):
            w.add(tuple(rec))
        return w.document()

    # -------------------------------------------------------------- building
    def _pid(self, vid: int) -> int:
        return self.placement[vid] + 1  # pid 0 is special in some viewers

    def _metadata_and_spans(self) -> list[dict[str, Any]]:
        names, out = self.names, []
        shown = sorted(set(range(len(names))) if self.keep is None else self.keep)
        for agent in sorted({self.placement[v] for v in shown}):
            out.append({"ph": "M", "name": "process_name", "pid": agent + 1, "tid": 0,
                        "args": {"name": f"agent {agent}"}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": agent + 1, "tid": 0,
                        "args": {"sort_index": agent}})
        for vid in shown:
            self._thread(out, vid, vid, names[vid], vid * 100_000)

        # compute spans, and the waits between consecutive ones, on each vworker's own thread
        self.compute.sort(key=lambda r: (r[1], r[3], r[4]))
        spans: list[dict[str, Any]] = []
        prev_end: dict[int, int] = {}
        w0 = 0 if self.window is None else self.window[0]
        for _, vid, kind, t0, t1 in self.compute:
            pid = self._pid(vid)
            start = prev_end.get(vid, w0)
            if t0 > start:
                spans.append({"ph": "X", "cat": "wait", "name": "wait", "pid": pid, "tid": vid,
                              "ts": _us(start), "dur": _us(t0 - start)})
            spans.append({"ph": "X", "cat": "compute", "name": kind, "pid": pid, "tid": vid,
                          "ts": _us(t0), "dur": _us(t1 - t0)})
            prev_end[vid] = max(t1, start)

        # transfers: lanes per (vworker, direction), then spans and flows
        self.messages.sort(key=lambda r: (r[10], r[2], r[1], r[3]))
        egress = self._lanes(0, [(r[1], r[7], r[8], i) for i, r in enumerate(self.messages)])
        ingress = self._lanes(1, [(r[2], r[9], r[10], i) for i, r in enumerate(self.messages)])
        tids: dict[tuple[int, int, int], int] = {}
        next_tid = len(names)
        for key in sorted(set(egress.values()) | set(ingress.values())):
            vid, direction, lane = key
            tids[key] = next_tid
            label = ("egress", "ingress")[direction] + ("" if lane == 0 else f" {lane + 1}")
            self._thread(out, vid, next_tid, f"{names[vid]} {label}", vid * 100_000 + 1 + direction * 50_000 + lane)
            next_tid += 1
        for i, (_, src, dst, seq, tag, nbytes, sent_at, e0, e1, arrival, done) in enumerate(self.messages):
            name = "msg" if tag is None else str(tag)
            fid = (src << 32) | seq
            args = {"src": names[src], "dst": names[dst], "bytes": nbytes, "sent_ns": sent_at}
            if i in egress:
                tid, pid = tids[egress[i]], self._pid(src)
                spans.append({"ph": "X", "cat": "egress", "name": f"{name} → {names[dst]}", "pid": pid, "tid": tid,
                              "ts": _us(e0), "dur": _us(e1 - e0), "args": args})
                if i in ingress:
                    spans.append({"ph": "s", "cat": "flow", "name": name, "id": fid, "pid": pid, "tid": tid,
                                  "ts": _us(e0)})
            if i in ingress:
                tid, pid = tids[ingress[i]], self._pid(dst)
                spans.append({"ph": "X", "cat": "ingress", "name": f"{name} ← {names[src]}", "pid": pid,
                              "tid": tid, "ts": _us(arrival), "dur": _us(done - arrival), "args": args})
                if i in egress:
                    spans.append({"ph": "f", "bp": "e", "cat": "flow", "name": name, "id": fid, "pid": pid,
                                  "tid": tid, "ts": _us(arrival)})
        out.extend(spans)
        return out

    def _thread(self, out: list, vid: int, tid: int, name: str, sort_index: int) -> None:
        pid = self._pid(vid)
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                    "args": {"sort_index": sort_index}})

    def _lanes(self, direction: int, spans: list[tuple[int, int, int, int]]) -> dict[int, tuple[int, int, int]]:
        """Greedy interval packing: message index -> (vid, direction, lane), for shown vworkers only."""
        by_vid: dict[int, list[tuple[int, int, int]]] = {}
        for vid, t0, t1, i in spans:
            if self.keep is None or vid in self.keep:
                by_vid.setdefault(vid, []).append((t0, t1, i))
        out: dict[int, tuple[int, int, int]] = {}
        for vid, items in by_vid.items():
            items.sort()
            free: list[tuple[int, int]] = []  # (end of last span, lane)
            n_lanes = 0
            for t0, t1, i in items:
                if free and free[0][0] < t0:
                    _, lane = heapq.heappop(free)
                else:
                    lane, n_lanes = n_lanes, n_lanes + 1
                heapq.heappush(free, (t1, lane))
                out[i] = (vid, direction, lane)
        return out

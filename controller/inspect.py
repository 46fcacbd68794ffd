"""``lockstep inspect RUN --at T [--worker W] [--json] [--write-model out.pt]``.

What each vworker was doing and holding at virtual time ``T``, read back from a
run directory: the activity from ``trace.json`` (the compute span, or the
transfers, covering ``T``; ``waiting`` otherwise), or from the state log for
vworkers and times the trace left out; the model version held, the last
training loss and staleness from ``statelog.jsonl`` (thesis §5.2), the rows of
``metrics.csv``, or — for the workers of a replica strategy that records its
updates on one worker only — the worker's own ``update`` computes in the trace.
What the outputs do not determine is ``unknown``, with a note on stderr saying
why, never a made-up ``waiting`` or version 0. Spans are half-open: at the
instant a compute ends the vworker is no longer computing, and an update at
``T`` counts as applied at ``T``.
"""
from __future__ import annotations

import argparse
import bisect
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any

from agents.common.trust import Trust, UntrustedClass
from agents.observe.statelog import StateLog, read_jsonl
from agents.observe.trace import TraceWriter, spool_path
from controller.outputs import read_csv
from agents.common.units import UnitError, parse_duration

__all__ = ["REPLICAS", "RunView", "main", "parse_time"]

USAGE = "lockstep inspect RUN --at T [--worker W] [--json] [--write-model out.pt [--trust]]"

REPLICAS = frozenset({"ring_allreduce", "hierarchical_allreduce", "gossip"})
"""Strategies whose every worker applies one update per step (one ``update`` compute, which ends when the
update is applied) and counts its model version by them, while only one worker records the updates in
metrics.csv: the version of any other worker is the number of its own ``update`` spans in the trace."""

_ACCEPTED = "seconds as a number, or a string with ns, us, ms, s, min, h"
_ACCEPTED_OUT = "a file path in an existing directory you can write to"


def parse_time(text: str) -> int:
    """``12.5s``, ``250ms``, ``51906560ns`` or a number of seconds, as integer ns."""
    t = text.strip()
    if t.endswith("ns") and t[:-2].strip().isdigit():
        return int(t[:-2])
    ns = parse_duration(t, "--at") * 1e9
    if not math.isfinite(ns):  # 1e400 reads as inf
        raise UnitError(f"--at: {text!r} is not a finite time; accepted: {_ACCEPTED}")
    return int(round(ns))


def _secs(ns: int) -> str:
    """``0.05 s``: seconds, exact to the nanosecond, without trailing zeros."""
    return f"{ns / 1e9:.9f}".rstrip("0").rstrip(".") + " s"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except ValueError as e:  # (UnicodeDecodeError too)
        raise ValueError(f"{path} is not valid JSON ({e}): the file is cut short or corrupt") from e


def _malformed(path: Path, what: str, e: Exception, item: str = "a record") -> ValueError:
    """``PATH is not a trace lockstep wrote (an event has no 'ph')``: one sentence for a file that does not hold
    what lockstep writes there."""
    why = f"{item} has no {e.args[0]!r}" if isinstance(e, KeyError) and e.args else f"{type(e).__name__}: {e}"
    return ValueError(f"{path} is not {what} lockstep wrote ({why})")


class RunView:
    """A run directory read back for inspection."""

    def __init__(self, run_dir: str | Path, trust: bool = False):
        self.dir = Path(run_dir)
        self.trust = trust  # instantiate what config.yaml names (--trust); else only lockstep's own models
        plan_path = self.dir / "plan.json"
        if not plan_path.exists():
            raise FileNotFoundError(f"{self.dir} is not a lockstep run directory (no plan.json)")
        plan = _read_json(plan_path)
        self._check_plan(plan, plan_path)
        self.names: list[str] = [v["name"] for v in plan["vworkers"]]
        self.placement: list[int] = list(plan["placement"])
        self.servers = {v["name"] for v in plan["vworkers"] if not v.get("holds_data")}
        self.result: str = plan["result"]
        self.strategy: str | None = plan.get("strategy")
        self._classes: list[Any] = [v.get("cls") for v in plan["vworkers"]]
        spec = plan.get("trace") if isinstance(plan.get("trace"), dict) else {}
        self.trace_mode: str | None = spec.get("mode")
        w = spec.get("window_ns")
        self.window: tuple[int, int] | None = (int(w[0]), int(w[1])) if self.trace_mode == "window" and w else None
        self.updates = self._csv_rows("metrics.csv")
        self._rows: dict[str, list[dict[str, Any]]] = {}  # vworker -> its metrics.csv rows, in time order
        for r in sorted(self.updates, key=lambda r: r["virtual_time_ns"]):
            self._rows.setdefault(r["vworker"], []).append(r)
        self._row_times = {n: [r["virtual_time_ns"] for r in rows] for n, rows in self._rows.items()}
        self.statelog, self._statelog_end = self._load_statelog()
        self.traced: set[str] = set()  # vworkers with a thread of their own in the trace
        self.trace_file: Path | None = None
        self.trace_truncated = False
        self.trace_cut_ns: int | None = None  # otherData.truncated_at_ns, where the writer recorded it
        self.spans, self.transfers = self._trace()
        self.trace_end_ns = self._trace_end()
        self.end_ns, self.complete = self._end()

    @staticmethod
    def _check_plan(plan: Any, path: Path) -> None:
        def bad(what: str) -> ValueError:
            return ValueError(f"{path} is not a lockstep plan: {what}")

        if not isinstance(plan, dict):
            raise bad("it is not a JSON object")
        vws = plan.get("vworkers")
        if not isinstance(vws, list) or not vws or not all(isinstance(v, dict) and isinstance(v.get("name"), str)
                                                            for v in vws):
            raise bad("it has no 'vworkers' list of objects with a 'name'")
        placement = plan.get("placement")
        if not isinstance(placement, list) or len(placement) != len(vws) or not all(
                type(a) is int and a >= 0 for a in placement):
            raise bad("its 'placement' is not a list of one agent number per vworker")
        if plan.get("result") not in {v["name"] for v in vws}:
            raise bad("its 'result' is not one of its vworkers")

    def _csv_rows(self, name: str) -> list[dict[str, Any]]:
        path = self.dir / name
        if not path.exists():
            return []
        try:
            rows = read_csv(path)  # a torn last row (a killed run) is left out
            for r in rows:
                r["virtual_time_ns"] = int(r["virtual_time_ns"])
                r["iteration"] = int(r["iteration"])
                r["loss"] = float(r["loss"])
                r["staleness"] = int(r["staleness"])
                if not isinstance(r["vworker"], str):
                    raise TypeError("a row with too few columns")
        except (KeyError, TypeError, ValueError) as e:
            raise _malformed(path, "a metrics.csv", e, "a row") from e
        return rows

    def _load_statelog(self) -> tuple[StateLog | None, int | None]:
        """The state log and the time of its last row (None, None without statelog.jsonl)."""
        path = self.dir / "statelog.jsonl"
        if not path.exists():
            return None, None
        rows = read_jsonl(path)  # (a bad line is an error naming the file and line; a torn last one is left out)
        try:
            return StateLog(rows, self.dir), max((int(r["t"]) for r in rows), default=None)
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise _malformed(path, "a state log", e) from e

    def _trace(self) -> tuple[dict[str, list[tuple[int, int, str]]], dict[str, list[tuple[int, int, str, str]]]]:
        """Per vworker: main-thread spans ``(t0, t1, name)`` and transfer spans ``(t0, t1, direction, name)``."""
        path = self.dir / "trace.json"
        spans: dict[str, list] = {}
        transfers: dict[str, list] = {}
        if path.exists():
            doc = _read_json(path)
        elif spool_path(path).exists():  # the controller died before writing trace.json: its records
            path = spool_path(path)
            try:
                doc = TraceWriter.read_spool(path, self.names, self.placement)
            except (KeyError, TypeError, IndexError) as e:  # (a bad line is a ValueError naming the file)
                raise _malformed(path, "a trace spool", e, "a line") from e
        else:
            return spans, transfers
        self.trace_file = path
        if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
            raise ValueError(f"{path} is not a trace lockstep wrote (it has no 'traceEvents' list)")
        try:
            events = doc["traceEvents"]
            other = doc.get("otherData") or {}
            self.trace_truncated = bool(other.get("truncated"))
            cut = other.get("truncated_at_ns")
            self.trace_cut_ns = cut if isinstance(cut, int) and not isinstance(cut, bool) and cut >= 0 else None
            owner: dict[tuple[int, int], tuple[str, str | None]] = {}
            for e in events:
                if e["ph"] == "M" and e["name"] == "thread_name":
                    label = e["args"]["name"]
                    name, _, rest = label.partition(" ")
                    owner[(e["pid"], e["tid"])] = (name, rest.split(" ")[0] if rest else None)
                    if not rest:
                        self.traced.add(name)
            for e in events:
                if e["ph"] != "X":
                    continue
                name, direction = owner[(e["pid"], e["tid"])]
                t0 = round(e["ts"] * 1000)
                t1 = round((e["ts"] + e["dur"]) * 1000)
                if direction is None:
                    spans.setdefault(name, []).append((t0, t1, e["name"]))
                else:
                    transfers.setdefault(name, []).append((t0, t1, direction, e["name"]))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise _malformed(path, "a trace", e, "an event") from e
        for v in spans.values():
            v.sort()
        return spans, transfers

    def _trace_end(self) -> int | None:
        """Where a trace cut at ``trace.max_events`` stops saying what the vworkers did (None: not cut).

        The writer keeps records in the order the agents made them (a compute when it starts, a transfer when it
        is delivered) and drops the rest, so each vworker's thread stops at its last recorded compute; up to the
        earliest end of those every vworker's computes, and the waits between them, are all there (a transfer
        delivered after the cut is not). A trace written since 2026-12-02 also says when the cut was
        (``otherData.truncated_at_ns``: every compute and transfer that started before it is in the file; a
        smaller record kept after a larger one was left out cannot hide one before it): the earlier of the two."""
        if not self.trace_truncated:
            return None
        ends = [max(t1 for _, t1, what in self.spans[n] if what != "wait") for n in self.traced
                if any(what != "wait" for _, _, what in self.spans.get(n, ()))]
        end = min(ends) if len(ends) == len(self.traced) else 0
        return end if self.trace_cut_ns is None else min(end, self.trace_cut_ns)

    def _end(self) -> tuple[int | None, bool]:
        """``(end, complete)``: the virtual time a complete run ended at (summary.json), or else the last time
        its outputs recorded (the last row of metrics.csv or of the state log; None when they have none)."""
        try:
            summary = json.loads((self.dir / "summary.json").read_text())
        except (OSError, ValueError):
            summary = None
        if isinstance(summary, dict) and summary.get("complete", True) and isinstance(
                summary.get("virtual_time_ns"), int):
            return summary["virtual_time_ns"], True
        ends = [r["virtual_time_ns"] for r in self.updates[-1:]] + [self._statelog_end]
        ends = [e for e in ends if e is not None]
        return (max(ends) if ends else None), False

    # ---------------------------------------------------------------- state
    def state(self, name: str, t: int) -> dict[str, Any]:
        """What ``name`` did and held at ``t``; ``unknown`` says why a ``doing`` or ``version`` is unknown."""
        if name not in self.names:
            raise KeyError(f"no vworker {name!r} in this run; vworkers: {', '.join(self.names)}")
        s: dict[str, Any] = {"vworker": name, "role": "server" if name in self.servers else "worker",
                             "at_ns": t}
        unknown: dict[str, str] = {}
        activity = self._activity(name, t)
        if "why" in activity:
            unknown["doing"] = activity.pop("why")
        s.update(activity)
        sl = self.statelog
        if name not in self.servers and sl is not None and name in sl.exchanges:
            held = self._worker_state(name, t)
        elif (sl is not None and name in sl.versions) or name in self._rows:
            held = self._server_state(name, t)
        elif self.strategy in REPLICAS:
            held = self._replica_state(name, t)
        else:
            held = self._unknown_version("no statelog.jsonl (statelog.enabled=false) and no rows in metrics.csv"
                                         if sl is None else "no exchanges in statelog.jsonl and no rows in "
                                         "metrics.csv")
        if "why" in held:
            unknown["version"] = held.pop("why")
        s.update(held)
        s["unknown"] = unknown
        return s

    def _trace_gap(self, name: str, t: int) -> str | None:
        """None when the trace records what ``name`` did at ``t``; else why it does not."""
        if self.trace_file is None:
            return "there is no trace (trace.mode=off)" if self.trace_mode == "off" else "there is no trace.json"
        if name not in self.traced:
            return ("the trace samples other workers (trace.mode=sample)" if self.trace_mode == "sample"
                    else f"{self.trace_file.name} shows other vworkers only")
        w = self.window
        if w is not None and not w[0] <= t <= w[1]:
            return f"the trace covers only [{_secs(w[0])}, {_secs(w[1])}] (trace.mode=window)"
        end = self.trace_end_ns
        if end is not None and t >= end:
            return f"{self.trace_file.name} stops at trace.max_events (it records up to {_secs(end)})"
        return None

    def _activity(self, name: str, t: int) -> dict[str, Any]:
        down = None if self.statelog is None else self.statelog.down_at(name, t)
        if down is not None:  # a crash fault (docs/faults.md): it does nothing until it recovers
            return {"doing": "crashed", "since_ns": down[0], "until_ns": down[1], "transfers": [],
                    "source": "statelog"}
        gap = self._trace_gap(name, t)
        moving = [f"{d} {n}" for t0, t1, d, n in self.transfers.get(name, []) if t0 <= t < t1]
        spans = self.spans.get(name, [])
        i = bisect.bisect_right(spans, (t, float("inf"), "")) - 1
        # a recorded compute covering T is a fact even outside trace.window; a wait only inside it
        if i >= 0 and spans[i][0] <= t < spans[i][1] and (gap is None or spans[i][2] != "wait"):
            t0, t1, what = spans[i]
            doing = "waiting" if what == "wait" else f"computing {what}"
            if what == "wait" and moving:
                doing = "sending" if any(m.startswith("egress") for m in moving) else "receiving"
            if what == "wait" and self.window is not None and t0 == self.window[0] > 0:
                t0 = None  # the wait began before the window: the trace does not say when
            return {"doing": doing, "since_ns": t0, "until_ns": t1, "transfers": moving, "source": "trace"}
        if gap is None and moving:
            return {"doing": "sending" if any(m.startswith("egress") for m in moving) else "receiving",
                    "since_ns": None, "until_ns": None, "transfers": moving, "source": "trace"}
        sl = self.statelog
        if sl is not None and name in sl.exchanges:
            ex = sl.exchange_at(name, t)
            if ex is not None:
                if ex.sent_ns is not None and t < ex.sent_ns:
                    return {"doing": "computing", "since_ns": ex.begin_ns, "until_ns": ex.sent_ns,
                            "transfers": [], "source": "statelog"}
                if ex.end_ns is not None and ex.sent_ns is not None and t < ex.end_ns:
                    return {"doing": "sending", "since_ns": ex.sent_ns, "until_ns": ex.end_ns,
                            "transfers": [], "source": "statelog"}
            # between its exchanges the state log cannot tell waiting for a model from receiving it
        if gap is None:
            return {"doing": "waiting", "since_ns": None, "until_ns": None, "transfers": moving, "source": "trace"}
        return {"doing": "unknown", "since_ns": None, "until_ns": None, "transfers": moving, "source": None,
                "why": gap}

    @staticmethod
    def _unknown_version(why: str) -> dict[str, Any]:
        return {"version": None, "crc": None, "loss": None, "staleness": None, "last_update_ns": None,
                "version_source": None, "why": why}

    def _server_state(self, name: str, t: int) -> dict[str, Any]:
        """A vworker that records its updates in metrics.csv or its versions in the state log."""
        rows = self._rows.get(name, [])
        i = bisect.bisect_right(self._row_times.get(name, []), t)
        last = rows[i - 1] if i else None
        version, crc, source = (last["iteration"] if last else 0), None, "metrics.csv"
        if self.statelog is not None and name in self.statelog.versions:
            rec = self.statelog.version_record_at(name, t)
            if rec is not None:
                version, crc, source = rec[1], rec[2], "statelog"
        return {"version": version, "crc": crc,
                "loss": last["loss"] if last else None,
                "staleness": last["staleness"] if last else None,
                "last_update_ns": last["virtual_time_ns"] if last else None,
                "version_source": source}

    def _replica_state(self, name: str, t: int) -> dict[str, Any]:
        """A worker of a replica strategy (REPLICAS) that does not record the updates: its own update spans."""
        why = self._trace_gap(name, t)
        w = self.window
        if why is None and w is not None and w[0] > 0:
            why = f"the trace covers only [{_secs(w[0])}, {_secs(w[1])}] (trace.mode=window)"
        recorders = ", ".join(sorted(self._rows)) or self.result
        if why is not None:
            return self._unknown_version(f"{self.strategy} records its updates on {recorders} only, and {why}")
        crashes = [] if self.statelog is None else [at for at, _ in self.statelog.crashes.get(name, ()) if at <= t]
        if crashes:
            return self._unknown_version("it crashed (docs/faults.md), and the version it restarted from is not "
                                         "recorded")
        ends = [t1 for _, t1, what in self.spans.get(name, []) if what == "update" and t1 <= t]
        return {"version": len(ends), "crc": None, "loss": None, "staleness": None,
                "last_update_ns": ends[-1] if ends else None, "version_source": "trace"}

    def _worker_state(self, name: str, t: int) -> dict[str, Any]:
        sl = self.statelog
        ex = sl.exchange_at(name, t)
        done = [e for e in sl.exchanges[name] if e.sent_ns is not None and e.sent_ns <= t]
        applied = sl.last_applied(name, t)
        return {"version": None if ex is None else ex.version, "crc": None if ex is None else ex.crc,
                "loss": done[-1].loss if done else None,
                "staleness": None if applied is None else applied.staleness,
                "exchange": None if ex is None else ex.index,
                "model_received_ns": None if ex is None else ex.begin_ns,
                "version_source": "statelog"}

    # ---------------------------------------------------------------- model
    def write_model(self, t: int, out: Path) -> dict[str, Any]:
        """Save the result vworker's model as it was at ``t`` (from the newest snapshot at or before it)."""
        import torch
        from omegaconf import OmegaConf

        from agents.workloads.models import build_model, set_flat_params

        if self.statelog is None:
            raise FileNotFoundError("no statelog.jsonl in this run (statelog.enabled=false)")
        path = self.statelog.snapshot_at(self.result, t)
        if path is None:
            missing = f"--write-model: no parameter snapshot of {self.result} at or before {t} ns"
            if self._has_parameter_server():
                raise FileNotFoundError(f"{missing}; run with statelog.snapshot_every=N to keep the model every N "
                                        "versions")
            # (the run refuses statelog.snapshot_every with such a strategy: controller/config/validate.py)
            final = self.dir / "params.pt"
            instead = (f"{final} holds its final model (the parameters as one flat tensor)" if final.exists()
                       else "this run has no params.pt with its final model either")
            raise FileNotFoundError(f"{missing}: strategy {self.strategy or 'of this run'} has no parameter server, "
                                    "and only a parameter server's versions are kept as snapshots "
                                    "(statelog.snapshot_every, accepted with ps_sync, ps_async, ssp), so its runs "
                                    f"keep none; {instead}")
        snap = torch.load(path, weights_only=True)  # tensors and plain values only: no pickled code
        cfg = OmegaConf.load(self.dir / "config.yaml")
        model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
        if not self.trust:
            try:
                Trust().check_model(model_cfg, f"{self.dir / 'config.yaml'}: model._target_",
                                    "lockstep inspect builds only its own models from a run directory: pass "
                                    "--trust if you trust this one (its config.yaml then runs as code)")
            except UntrustedClass as e:
                raise PermissionError(str(e)) from e
        model = build_model(model_cfg, int(cfg.seed))
        set_flat_params(model, snap["params"])
        try:
            torch.save(model.state_dict(), out)
        except (OSError, RuntimeError) as e:  # (main checked the path; the disk can still fill up)
            raise ValueError(f"--write-model {str(out)!r} cannot be written: {e}; accepted: {_ACCEPTED_OUT}") from e
        at_t = self.statelog.version_at(self.result, t)
        return {"vworker": self.result, "version": snap["version"], "snapshot_ns": snap["virtual_time_ns"],
                "version_at_t": at_t, "exact": at_t == snap["version"], "path": str(out)}

    def _has_parameter_server(self) -> bool:
        """Whether a vworker of the plan runs a parameter server, the only vworker that logs versions and so
        the only one statelog.snapshot_every keeps snapshots of. A class that is not lockstep's own is imported
        only with --trust (importing runs its code); one not imported, or that does not import, may be one."""
        from agents.strategies import import_path
        from agents.strategies.ps import ParameterServer

        for name in self._classes:
            if isinstance(name, str) and not name.startswith("agents.") and not self.trust:
                return True
            try:
                cls = import_path(name) if isinstance(name, str) else None
            except (ImportError, AttributeError, ValueError):
                return True
            if isinstance(cls, type) and issubclass(cls, ParameterServer):
                return True
        return False


def _unwritable(out: Path) -> str | None:
    """Why ``--write-model out`` cannot be written (None: it can), checked before any work."""
    parent = out.parent
    if out.is_dir():
        return "it is a directory"
    if not parent.exists():
        return f"its directory {parent} does not exist"
    if not parent.is_dir():
        return f"{parent} is not a directory"
    if not os.access(parent, os.W_OK | os.X_OK) or (out.exists() and not os.access(out, os.W_OK)):
        return f"{out if out.exists() else parent} is not writable by this user"
    return None


def _fmt_ns(ns: int | None) -> str:
    return "" if ns is None else f"{ns / 1e9:.6f}s"


def _table(states: list[dict[str, Any]], t: int) -> str:
    head = ("vworker", "doing", "since", "until", "version", "loss", "staleness", "crc")
    rows = [head]
    for s in states:
        rows.append((s["vworker"], s["doing"], _fmt_ns(s.get("since_ns")), _fmt_ns(s.get("until_ns")),
                     str(s["version"]) if s.get("version") is not None
                     else "unknown" if "version" in (s.get("unknown") or {}) else "",
                     "" if s.get("loss") is None else f"{s['loss']:.4f}",
                     "" if s.get("staleness") is None else str(s["staleness"]), s.get("crc") or ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [f"virtual time {t / 1e9:.9f} s ({t} ns)"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


def _join_negative_at(argv: list[str]) -> list[str]:
    """``--at -1s`` as ``--at=-1s``: argparse takes ``-1s`` (not a plain negative number) for an option and says
    only "expected one argument"; joined, it gets the one sentence on times below 0."""
    out: list[str] = []
    it = iter(argv)
    for a in it:
        if a == "--at":
            value = next(it, None)
            if value is not None and re.match(r"-[0-9.]", value):
                out.append(f"--at={value}")
                continue
            out.append(a)
            if value is not None:
                out.append(value)
        else:
            out.append(a)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="lockstep inspect", usage=USAGE,
                                 description="What each vworker was doing and holding at virtual time T.")
    ap.add_argument("run", help="a run directory (with plan.json, metrics.csv, trace.json, statelog.jsonl)")
    ap.add_argument("--at", required=True, help="virtual time: 12.5s, 250ms, 51906560ns, or seconds")
    ap.add_argument("--worker", help="only this vworker (e.g. w3, ps0)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--write-model", metavar="OUT.pt", help="save the global model as it was at T (needs snapshots)")
    ap.add_argument("--trust", action="store_true",
                    help="build the model class the run's config.yaml names even when it is not one of lockstep's "
                         "own (that runs code from the run directory: only for runs you trust)")
    args = ap.parse_args(_join_negative_at(sys.argv[1:] if argv is None else list(argv)))
    try:
        t = parse_time(args.at)
    except UnitError as e:
        print(f"lockstep inspect: --at {args.at!r}: {e}", file=sys.stderr)
        return 2
    if t < 0:
        print(f"lockstep inspect: --at {args.at!r} is not valid; accepted: a virtual time >= 0 (e.g. 12.5s)",
              file=sys.stderr)
        return 2
    out = Path(args.write_model) if args.write_model else None
    why = None if out is None else _unwritable(out)
    if why is not None:
        print(f"lockstep inspect: --write-model {args.write_model!r} cannot be written: {why}; accepted: "
              f"{_ACCEPTED_OUT}", file=sys.stderr)
        return 2
    try:
        view = RunView(args.run, trust=args.trust)
        # a T after the run's (recorded) end gives the states at that end, the time they are shown as of
        at = t if view.end_ns is None or t <= view.end_ns else view.end_ns
        names = [args.worker] if args.worker is not None else view.names  # ("": no vworker, not all)
        states = [view.state(n, at) for n in names]
        model = view.write_model(at, out) if out is not None else None
    except (FileNotFoundError, KeyError, PermissionError, ValueError) as e:
        print(f"lockstep inspect: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    for note in _notes(view, states, t):
        print(f"lockstep inspect: note: {note}", file=sys.stderr)
    if args.json:
        print(json.dumps({"at_ns": at, "states": states, **({"model": model} if model else {})}, indent=2))
    else:
        print(_table(states, at))
        if model is not None:
            exact = "" if model["exact"] else (f" (the newest snapshot at or before T; at T the model was version "
                                               f"{model['version_at_t']})")
            print(f"wrote {model['path']}: {model['vworker']} version {model['version']}{exact}")
    return 0


def _notes(view: RunView, states: list[dict[str, Any]], t: int) -> list[str]:
    """The notes for stderr: T after the run's (recorded) end, and why a doing or version is unknown (one
    note per reason, naming its vworkers)."""
    notes = []
    end = view.end_ns
    if end is not None and t > end:
        notes.append(f"T is after the run's end ({end / 1e9:.9f} s): the states are those at its end"
                     if view.complete else
                     f"T is after the last time the run recorded ({end / 1e9:.9f} s; it has not finished: no "
                     f"complete summary.json): the states are those at that time")
    for key, what in (("doing", "what {} {} doing at T is unknown: {}"),
                      ("version", "the model version of {} at T is unknown: {}")):
        by_why: dict[str, list[str]] = {}
        for s in states:
            why = (s.get("unknown") or {}).get(key)
            if why is not None:
                by_why.setdefault(why, []).append(s["vworker"])
        for why, names in by_why.items():
            who = ", ".join(names)
            notes.append(what.format(who, "was" if len(names) == 1 else "were", why) if key == "doing"
                         else what.format(who, why))
    return notes


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

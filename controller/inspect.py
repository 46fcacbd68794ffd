"""``lockstep inspect RUN --at T [--worker W] [--json] [--write-model out.pt]``.

What each vworker was doing and holding at virtual time ``T``, read back from a
finished run directory: the activity from ``trace.json`` (the compute span, or
the transfers, covering ``T``; ``waiting`` otherwise), or from the state log
for vworkers the trace left out; the model version held, the last training
loss and staleness from ``statelog.jsonl`` (thesis §5.2) and ``metrics.csv``.
Spans are half-open: at the instant a compute ends the vworker is no longer
computing, and an update at ``T`` counts as applied at ``T``.
"""
from __future__ import annotations

import argparse
import bisect
import json
import sys
from pathlib import Path
from typing import Any

from agents.common.trust import Trust, UntrustedClass
from agents.observe.statelog import StateLog
from agents.observe.trace import TraceWriter, spool_path
from controller.outputs import read_csv
from agents.common.units import UnitError, parse_duration

__all__ = ["RunView", "main", "parse_time"]

USAGE = "lockstep inspect RUN --at T [--worker W] [--json] [--write-model out.pt [--trust]]"


def parse_time(text: str) -> int:
    """``12.5s``, ``250ms``, ``51906560ns`` or a number of seconds, as integer ns."""
    t = text.strip()
    if t.endswith("ns") and t[:-2].strip().isdigit():
        return int(t[:-2])
    return int(round(parse_duration(t, "--at") * 1e9))


class RunView:
    """A run directory read back for inspection."""

    def __init__(self, run_dir: str | Path, trust: bool = False):
        self.dir = Path(run_dir)
        self.trust = trust  # instantiate what config.yaml names (--trust); else only lockstep's own models
        plan_path = self.dir / "plan.json"
        if not plan_path.exists():
            raise FileNotFoundError(f"{self.dir} is not a lockstep run directory (no plan.json)")
        plan = json.loads(plan_path.read_text())
        self.names: list[str] = [v["name"] for v in plan["vworkers"]]
        self.placement: list[int] = list(plan["placement"])
        self.servers = {v["name"] for v in plan["vworkers"] if not v.get("holds_data")}
        self.result: str = plan["result"]
        self.updates = self._csv_rows("metrics.csv")
        self.statelog = StateLog.load(self.dir) if (self.dir / "statelog.jsonl").exists() else None
        self.spans, self.transfers = self._trace()

    def _csv_rows(self, name: str) -> list[dict[str, Any]]:
        path = self.dir / name
        if not path.exists():
            return []
        rows = read_csv(path)  # a torn last row (a killed run) is left out
        for r in rows:
            r["virtual_time_ns"] = int(r["virtual_time_ns"])
        return rows

    def _trace(self) -> tuple[dict[str, list[tuple[int, int, str]]], dict[str, list[tuple[int, int, str, str]]]]:
        """Per vworker: main-thread spans ``(t0, t1, name)`` and transfer spans ``(t0, t1, direction, name)``."""
        path = self.dir / "trace.json"
        spans: dict[str, list] = {}
        transfers: dict[str, list] = {}
        if path.exists():
            events = json.loads(path.read_text())["traceEvents"]
        elif spool_path(path).exists():  # the controller died before writing trace.json: its records
            events = TraceWriter.read_spool(spool_path(path), self.names, self.placement)["traceEvents"]
        else:
            return spans, transfers
        owner: dict[tuple[int, int], tuple[str, str | None]] = {}
        for e in events:
            if e["ph"] == "M" and e["name"] == "thread_name":
                label = e["args"]["name"]
                name, _, rest = label.partition(" ")
                owner[(e["pid"], e["tid"])] = (name, rest.split(" ")[0] if rest else None)
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
        for v in spans.values():
            v.sort()
        return spans, transfers

    # ---------------------------------------------------------------- state
    def state(self, name: str, t: int) -> dict[str, Any]:
        if name not in self.names:
            raise KeyError(f"no vworker {name!r} in this run; vworkers: {', '.join(self.names)}")
        s: dict[str, Any] = {"vworker": name, "role": "server" if name in self.servers else "worker",
                             "at_ns": t}
        s.update(self._activity(name, t))
        if name in self.servers or (self.statelog is None or name not in self.statelog.exchanges):
            s.update(self._server_state(name, t))
        else:
            s.update(self._worker_state(name, t))
        return s

    def _activity(self, name: str, t: int) -> dict[str, Any]:
        down = None if self.statelog is None else self.statelog.down_at(name, t)
        if down is not None:  # a crash fault (docs/faults.md): it does nothing until it recovers
            return {"doing": "crashed", "since_ns": down[0], "until_ns": down[1], "transfers": [],
                    "source": "statelog"}
        moving = [f"{d} {n}" for t0, t1, d, n in self.transfers.get(name, []) if t0 <= t < t1]
        spans = self.spans.get(name)
        if spans:
            i = bisect.bisect_right(spans, (t, float("inf"), "")) - 1
            if i >= 0 and spans[i][0] <= t < spans[i][1]:
                t0, t1, what = spans[i]
                doing = "waiting" if what == "wait" else f"computing {what}"
                if what == "wait" and moving:
                    doing = "sending" if any(m.startswith("egress") for m in moving) else "receiving"
                return {"doing": doing, "since_ns": t0, "until_ns": t1, "transfers": moving, "source": "trace"}
            if moving:
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
        return {"doing": "waiting" if spans or (sl is not None and name in sl.exchanges) else "unknown",
                "since_ns": None, "until_ns": None, "transfers": moving,
                "source": "trace" if spans else "statelog" if sl is not None else None}

    def _server_state(self, name: str, t: int) -> dict[str, Any]:
        rows = [r for r in self.updates if r["vworker"] == name and r["virtual_time_ns"] <= t]
        last = rows[-1] if rows else None
        version, crc = (int(last["iteration"]) if last else 0), None
        if self.statelog is not None and name in self.statelog.versions:
            rec = self.statelog.version_record_at(name, t)
            if rec is not None:
                version, crc = rec[1], rec[2]
        return {"version": version, "crc": crc,
                "loss": float(last["loss"]) if last else None,
                "staleness": int(last["staleness"]) if last else None,
                "last_update_ns": last["virtual_time_ns"] if last else None}

    def _worker_state(self, name: str, t: int) -> dict[str, Any]:
        sl = self.statelog
        ex = sl.exchange_at(name, t)
        done = [e for e in sl.exchanges[name] if e.sent_ns is not None and e.sent_ns <= t]
        applied = sl.last_applied(name, t)
        return {"version": None if ex is None else ex.version, "crc": None if ex is None else ex.crc,
                "loss": done[-1].loss if done else None,
                "staleness": None if applied is None else applied.staleness,
                "exchange": None if ex is None else ex.index,
                "model_received_ns": None if ex is None else ex.begin_ns}

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
            raise FileNotFoundError(f"no parameter snapshot of {self.result} at or before {t} ns; run with "
                                    "statelog.snapshot_every=N to keep the model every N versions")
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
        torch.save(model.state_dict(), out)
        at_t = self.statelog.version_at(self.result, t)
        return {"vworker": self.result, "version": snap["version"], "snapshot_ns": snap["virtual_time_ns"],
                "version_at_t": at_t, "exact": at_t == snap["version"], "path": str(out)}


def _fmt_ns(ns: int | None) -> str:
    return "" if ns is None else f"{ns / 1e9:.6f}s"


def _table(states: list[dict[str, Any]], t: int) -> str:
    head = ("vworker", "doing", "since", "until", "version", "loss", "staleness", "crc")
    rows = [head]
    for s in states:
        rows.append((s["vworker"], s["doing"], _fmt_ns(s.get("since_ns")), _fmt_ns(s.get("until_ns")),
                     "" if s.get("version") is None else str(s["version"]),
                     "" if s.get("loss") is None else f"{s['loss']:.4f}",
                     "" if s.get("staleness") is None else str(s["staleness"]), s.get("crc") or ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [f"virtual time {t / 1e9:.9f} s ({t} ns)"]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return "\n".join(lines)


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
    args = ap.parse_args(argv)
    try:
        t = parse_time(args.at)
    except UnitError as e:
        print(f"lockstep inspect: --at {args.at!r}: {e}", file=sys.stderr)
        return 2
    if t < 0:
        print(f"lockstep inspect: --at {args.at!r} is not valid; accepted: a virtual time >= 0 (e.g. 12.5s)",
              file=sys.stderr)
        return 2
    try:
        view = RunView(args.run, trust=args.trust)
        names = [args.worker] if args.worker else view.names
        states = [view.state(n, t) for n in names]
        model = view.write_model(t, Path(args.write_model)) if args.write_model else None
    except (FileNotFoundError, KeyError, PermissionError, ValueError) as e:
        print(f"lockstep inspect: {e.args[0] if e.args else e}", file=sys.stderr)
        return 2
    end = _end_ns(Path(args.run))
    if end is not None and t > end:
        print(f"lockstep inspect: note: T is after the run's end ({end / 1e9:.9f} s): the states are those at its end",
              file=sys.stderr)
    if args.json:
        print(json.dumps({"at_ns": t, "states": states, **({"model": model} if model else {})}, indent=2))
    else:
        print(_table(states, t))
        if model is not None:
            exact = "" if model["exact"] else (f" (the newest snapshot at or before T; at T the model was version "
                                               f"{model['version_at_t']})")
            print(f"wrote {model['path']}: {model['vworker']} version {model['version']}{exact}")
    return 0


def _end_ns(run_dir: Path) -> int | None:
    """The virtual time a complete run ended at (summary.json), or None."""
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    end = summary.get("virtual_time_ns")
    return end if isinstance(end, int) and summary.get("complete", True) else None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""Measured runs as ``lockstep calibrate`` and ``lockstep validate`` read them: one JSON object per line.

The format is ``../shared/realrun``'s (torch.distributed/gloo on emulated hosts) and
``lockstep measure``'s; only these fields are required (docs/engine.md, "Results files"):

==============  =====================================================================
``scenario``    ``ring`` (all-reduce step), ``ps_sync`` (PS step), ``ps_async``
                (updates/s), ``p2p`` (one transfer of ``M_bytes``), ``fanin`` (K
                concurrent transfers into one host)
``K``           workers (ring members, PS workers, or senders)
``L_ms``        one-way latency between hosts, ms (>= 0)
``B_mbit``      NIC line rate, Mbit/s (> 0)
``M_bytes``     model (message) bytes (> 0)
``C_ms``        compute per step, ms (>= 0; ring and PS scenarios)
``median_s``    measured median step (ring, ps_sync) or transfer time (p2p, fanin), s
``updates_per_s``  measured updates per second (ps_async, instead of ``median_s``), counted as realrun
                   counts them: worker steps >= warmup, up to the first worker's last (docs/engine.md)
==============  =====================================================================

Optional: ``N`` (measured steps, default 10), ``warmup`` (steps before them, default 2),
``ps_average_s_median`` (the PS's averaging time per step; validate uses it as the
emulation's aggregate time), ``p2p`` (``rtt_small_s``: a tiny ping-pong's round trip, used by
calibrate), ``hystart_detect`` (which of CUBIC's HyStart detections the hosts ran: 0 = HyStart off, 1 = the
ACK train, 2 = the delay increase, 3 = both, Linux's default and the default here — ``tcp_cubic``'s
``hystart`` and ``hystart_detect`` module parameters; validate emulates the same). Everything else (realrun
records much more) is ignored.

A configuration measured more than once (the same scenario, K, L, B, M, C, N and warmup on several lines:
one measurement is one draw of a noisy testbed) is one point for ``validate`` unless it is asked for
every run: :func:`group_repeats` gives it the median of its runs and keeps them (``Point.runs``).
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["ResultsError", "Point", "SCENARIOS", "load_results", "group_repeats"]

SCENARIOS = ("ring", "ps_sync", "ps_async", "p2p", "fanin")
# how a point measured with other HyStart detections than Linux's default (3: both) is described
HYSTART_NAMES = {0: " HyStart off", 1: " HyStart ACK train only", 2: " HyStart delay only", 3: ""}


class ResultsError(ValueError):
    """A results file that cannot be used; the message is one sentence naming the line and field."""


@dataclass(frozen=True)
class Point:
    """One measured run."""

    scenario: str
    K: int
    L_s: float
    B_bps: float  # line rate, bits/s
    M_bytes: int
    C_s: float
    measured: float  # seconds (step or transfer) or updates/s (ps_async)
    N: int = 10
    warmup: int = 2
    rtt_small_s: float | None = None
    aggregate_s: float = 0.0  # the PS's averaging time per step, when the run measured it
    line: int = 0
    runs: tuple[float, ...] = ()  # group_repeats: the measured value of each run, in file order
    hystart: int = 3  # CUBIC's HyStart detections on the measured hosts: bit 1 ACK train, bit 2 delay (0: off)

    @property
    def metric(self) -> str:
        return "updates/s" if self.scenario == "ps_async" else "s"

    def describe(self) -> str:
        return (f"{self.scenario} K={self.K} L={self.L_s * 1e3:g}ms B={self.B_bps / 1e6:g}Mbit/s "
                f"M={self.M_bytes / 1e6:g}MB C={self.C_s * 1e3:g}ms" + HYSTART_NAMES[self.hystart])

    @property
    def setup(self) -> tuple:
        """What the emulation of this point depends on, but the PS's measured averaging time."""
        return (self.scenario, self.K, self.L_s, self.B_bps, self.M_bytes, self.C_s, self.N, self.warmup, self.hystart)


def group_repeats(points: list[Point]) -> list[Point]:
    """One point per configuration, in the order of first appearance: the median of its runs' measured
    values (and of their averaging times and small round trips), with every run's value in ``runs``."""
    groups: dict[tuple, list[Point]] = {}
    for p in points:
        groups.setdefault(p.setup, []).append(p)
    out = []
    for runs in groups.values():
        first = runs[0]
        rtts = [r.rtt_small_s for r in runs if r.rtt_small_s is not None]
        out.append(Point(first.scenario, first.K, first.L_s, first.B_bps, first.M_bytes, first.C_s,
                         statistics.median(r.measured for r in runs), first.N, first.warmup,
                         statistics.median(rtts) if rtts else None, statistics.median(r.aggregate_s for r in runs),
                         first.line, tuple(r.measured for r in runs), first.hystart))
    return out


def _number(rec: dict[str, Any], key: str, where: str, lo: float, lo_open: bool = False, integer: bool = False,
            default: Any = None) -> Any:
    v = rec.get(key, default)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok and integer:
        ok = float(v).is_integer()
    if ok:
        ok = v > lo if lo_open else v >= lo
    if not ok:
        if key not in rec and default is None:
            raise ResultsError(f"{where}: the field {key!r} is missing; accepted: "
                               f"{'an integer' if integer else 'a number'} {'>' if lo_open else '>='} {lo:g}.")
        raise ResultsError(f"{where}: {key}={v!r} is not valid; accepted: "
                           f"{'an integer' if integer else 'a number'} {'>' if lo_open else '>='} {lo:g}.")
    return int(v) if integer else float(v)


def parse_point(rec: Any, where: str, line: int = 0) -> Point:
    if not isinstance(rec, dict):
        raise ResultsError(f"{where}: a line must be a JSON object, got {type(rec).__name__}.")
    scen = rec.get("scenario")
    if scen not in SCENARIOS:
        raise ResultsError(f"{where}: scenario={scen!r} is not valid; accepted: {' | '.join(SCENARIOS)}.")
    K = _number(rec, "K", where, 1, integer=True)
    L = _number(rec, "L_ms", where, 0) / 1e3
    B = _number(rec, "B_mbit", where, 0, lo_open=True) * 1e6
    M = _number(rec, "M_bytes", where, 0, lo_open=True, integer=True)
    C = _number(rec, "C_ms", where, 0, default=0.0) / 1e3
    key = "updates_per_s" if scen == "ps_async" else "median_s"
    measured = _number(rec, key, where, 0, lo_open=True)
    N = _number(rec, "N", where, 1, integer=True, default=10)
    warmup = _number(rec, "warmup", where, 0, integer=True, default=2)
    rtt = None
    p2p = rec.get("p2p")
    if isinstance(p2p, dict) and isinstance(p2p.get("rtt_small_s"), (int, float)):
        rtt = float(p2p["rtt_small_s"])
    agg = rec.get("ps_average_s_median")
    agg = float(agg) if isinstance(agg, (int, float)) and not isinstance(agg, bool) and agg >= 0 else 0.0
    hystart = rec.get("hystart_detect", 3)
    if not isinstance(hystart, int) or isinstance(hystart, bool) or hystart not in HYSTART_NAMES:
        raise ResultsError(f"{where}: hystart_detect={hystart!r} is not valid; accepted: 0 (HyStart off), 1 (ACK "
                           "train), 2 (delay) or 3 (both, the default).")
    return Point(scen, K, L, B, M, C, measured, N, warmup, rtt, agg, line, (), hystart)


def load_results(path: str | Path, scenarios: tuple[str, ...] = SCENARIOS) -> list[Point]:
    """Every point of a results file whose scenario is in ``scenarios``; ResultsError on any bad line."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ResultsError(f"{p}: cannot be read ({e.strerror}).") from e
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{p}, line {i}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ResultsError(f"{where}: not valid JSON ({e.msg} at column {e.colno}).") from e
        pt = parse_point(rec, where, i)
        if pt.scenario in scenarios:
            out.append(pt)
    if not out:
        raise ResultsError(f"{p}: no measured point with scenario {' | '.join(scenarios)}.")
    return out

"""``lockstep calibrate RESULTS.jsonl [--out conf/network/NAME.yaml] [overrides...]``: fit the tcp transport.

Each fitted parameter comes from the measurement that isolates it (docs/engine.md,
"Calibration"), never from a search over step times:

* ``host_latency`` — a tiny message's one-way time beyond the wire: half a ping-pong round
  trip (``p2p.rtt_small_s``) less ``L`` and the two tiny frames' line time; without
  ping-pongs, the intercept of transfer time against bytes (below) less ``L``;
* ``frame_bytes`` (the goodput) — the slope of point-to-point transfer time against bytes at
  one (L, B): ``1/slope = B · (MTU − header)/(MTU + frame)``, so ``frame = (MTU − header) ·
  slope · B − MTU``; from p2p records, or realrun's per-run p2p transfer (``p2p.bytes``,
  ``p2p.transfer_s``) of runs with different M.

The result is a network preset (``network=NAME`` once written under conf/network) and the
error of that preset on every point of the file (``lockstep validate``'s summary).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

from agents.sim.tcp import TcpSpec
from controller.results import Point, ResultsError, load_results

__all__ = ["main", "fit", "Fit"]


class Fit(dict):
    """Fitted parameters (``host_latency_ns``, ``frame_bytes``) and how each was obtained (``notes``)."""


def _tiny_line_time(spec: TcpSpec, B_bps: float) -> float:
    """Seconds a 4-byte message's frame takes on a link of B bit/s."""
    return (4 + spec.header_bytes + spec.frame_bytes) * 8 / B_bps


def _p2p_samples(points: list[Point], raw: dict[int, dict]) -> dict[tuple[float, float], dict[int, list[float]]]:
    """(L, B) -> bytes -> one-way transfer times, from p2p records and realrun's per-run p2p."""
    out: dict[tuple[float, float], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        if p.scenario == "p2p":
            out[(p.L_s, p.B_bps)][p.M_bytes].append(p.measured)
        rec = raw.get(p.line) or {}
        q = rec.get("p2p") if isinstance(rec, dict) else None
        if p.scenario != "p2p" and isinstance(q, dict) and isinstance(q.get("transfer_s"), (int, float)) \
                and isinstance(q.get("bytes"), int):
            out[(p.L_s, p.B_bps)][q["bytes"]].append(float(q["transfer_s"]))
    return out


def fit(points: list[Point], raw: dict[int, dict] | None = None, spec: TcpSpec = TcpSpec()) -> Fit:
    """Estimate host latency and frame bytes from the points (see the module docstring)."""
    raw = raw or {}
    result = Fit(notes=[])
    samples = _p2p_samples(points, raw)
    slopes, intercepts = [], []
    for (L, B), by_size in sorted(samples.items()):
        sizes = sorted(by_size)
        if len(sizes) < 2:
            continue
        m1, m2 = sizes[0], sizes[-1]
        t1, t2 = statistics.median(by_size[m1]), statistics.median(by_size[m2])
        slope = (t2 - t1) / (m2 - m1)
        if slope <= 0:
            continue
        slopes.append(slope * B / 8)  # dimensionless: line time per payload byte
        intercepts.append(t1 - m1 * slope - L)
    if slopes:
        ratio = statistics.median(slopes)  # (MTU + frame) / (MTU - header)
        frame = int(round(ratio * spec.mss - spec.mtu))
        result["frame_bytes"] = max(0, frame)
        result["notes"].append(f"frame_bytes={result['frame_bytes']}: a goodput of {100 / ratio:.2f} % of the line "
                               f"rate, the slope of transfer time against bytes at {len(slopes)} (L, B) pairs")
    rtts = [p.rtt_small_s / 2 - p.L_s - 2 * _tiny_line_time(spec, p.B_bps) for p in points
            if p.rtt_small_s is not None]
    if rtts:
        o = max(0.0, statistics.median(rtts))
        result["host_latency_ns"] = int(round(o * 1e9))
        result["notes"].append(f"host_latency={o * 1e6:.0f}us: half the median tiny ping-pong round trip of "
                               f"{len(rtts)} runs, less L and two tiny frames")
    elif intercepts:
        o = max(0.0, statistics.median(intercepts))
        result["host_latency_ns"] = int(round(o * 1e9))
        result["notes"].append(f"host_latency={o * 1e6:.0f}us: the intercept of transfer time against bytes, "
                               f"less L ({len(intercepts)} (L, B) pairs)")
    return result


def preset_yaml(f: Fit, source: str) -> str:
    lines = [f"# Calibrated by `lockstep calibrate {source}` on {time.strftime('%Y-%m-%d')}:"]
    lines += [f"#   {n}" for n in f["notes"]] or ["#   (nothing to fit: the tcp defaults)"]
    lines += ["defaults:", "  - tcp", "  - _self_", "", "tcp:"]
    if "host_latency_ns" in f:
        lines.append(f"  host_latency: {f['host_latency_ns'] / 1e9!r}")
    if "frame_bytes" in f:
        lines.append(f"  frame_bytes: {f['frame_bytes']}")
    if len(lines[-1]) == 4:  # nothing under tcp:
        lines[-1] = "tcp: {}"
    return "\n".join(lines) + "\n"


def overrides_for(f: Fit) -> list[str]:
    ov = ["network=tcp"]
    if "host_latency_ns" in f:
        ov.append(f"network.tcp.host_latency={f['host_latency_ns'] / 1e9!r}")
    if "frame_bytes" in f:
        ov.append(f"network.tcp.frame_bytes={f['frame_bytes']}")
    return ov


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="lockstep calibrate", description=__doc__.split("\n")[0])
    ap.add_argument("results")
    ap.add_argument("overrides", nargs="*", help="applied when validating the fit, e.g. strategy.collective=gloo")
    ap.add_argument("--out", default=None, help="write the preset here (e.g. conf/network/mycluster.yaml)")
    ap.add_argument("--no-validate", action="store_true", help="only fit; skip emulating the points")
    a = ap.parse_intermixed_args(argv)  # overrides before, between and after the options
    import json

    from controller.validate import refused_override

    why = refused_override(a.overrides)
    if why:  # before the fit, not when validating it
        print(f"lockstep calibrate: {why}", file=sys.stderr)
        return 2

    if a.out:
        from controller.outputs import unwritable

        why = unwritable(a.out)
        if why:
            print(f"lockstep calibrate: --out {a.out}: {why}; accepted: a file to write the preset to.",
                  file=sys.stderr)
            return 2
    try:
        points = load_results(a.results)
    except ResultsError as e:
        print(f"lockstep calibrate: {e}", file=sys.stderr)
        return 2
    raw = {}
    for i, line in enumerate(Path(a.results).read_text().splitlines(), 1):
        if line.strip():
            raw[i] = json.loads(line)
    f = fit(points, raw)
    print("lockstep calibrate: fitted", file=sys.stderr)
    for n in f["notes"] or ["nothing (no p2p transfers or ping-pongs in the file): the tcp defaults"]:
        print(f"  {n}", file=sys.stderr)
    text = preset_yaml(f, a.results)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text)
        print(f"lockstep calibrate: preset written to {a.out}", file=sys.stderr)
    else:
        print(text)
    if a.no_validate:
        return 0
    from controller.validate import main as validate_main

    timed = [p for p in points if p.scenario != "p2p"] or points
    print(f"lockstep calibrate: the fit's error on {len(timed)} points (lockstep validate):", file=sys.stderr)
    scen = ",".join(dict.fromkeys(p.scenario for p in timed))
    return validate_main([a.results, *overrides_for(f), *a.overrides, "--only", scen])

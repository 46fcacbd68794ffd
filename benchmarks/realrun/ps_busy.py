#!/usr/bin/env python3
"""How busy an asynchronous PS's links are, on the testbed and in the model (docs/benchmarks.md, "HyStart decides
the PS points").

  python benchmarks/realrun/ps_busy.py CAPTURE/summary.json M_BYTES
  python benchmarks/realrun/ps_busy.py --emulate K L_MS B_MBIT M_BYTES [override ...]

Over the middle 60 % of the run it prints the fraction of time the PS's egress carries at least one parameter
transfer and its ingress at least one gradient, and how often 0, 1, ... parameter transfers run at once. The
first form reads a capture's per-burst summary (``analyse_capture.py DIR --json``; bursts of at least 30 % of
M). ``--emulate`` runs the point as ``lockstep validate`` does (its testbed settings, ``network=tcp
strategy.collective=gloo``, then the overrides, with ``trace.mode=full``) and prints its updates/s, the same
fractions from the trace, each PS downlink's congestion window when a transfer starts, and when and at what
window every connection left slow start (instrumenting ``agents.sim.tcp._Sender``: a diagnostic, not a test).
"""
from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def busy(spans: list[tuple[float, float]], lo: float, hi: float) -> Counter:
    """Time in [lo, hi) with 0, 1, 2, ... of ``spans`` open."""
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    open_, last, out = 0, None, Counter()
    for t, step in edges:
        if last is not None and min(t, hi) > max(last, lo):
            out[open_] += min(t, hi) - max(last, lo)
        open_, last = open_ + step, t
    if last is not None and hi > max(last, lo):
        out[open_] += hi - max(last, lo)
    return out


def report(egress: list[tuple[float, float]], ingress: list[tuple[float, float]]) -> None:
    t0 = min(a for a, _ in egress + ingress)
    t1 = max(b for _, b in egress + ingress)
    lo, hi = t0 + 0.2 * (t1 - t0), t0 + 0.8 * (t1 - t0)
    for name, spans in (("egress (parameters)", egress), ("ingress (gradients)", ingress)):
        h = busy(spans, lo, hi)
        total = sum(h.values())
        shares = ", ".join(f"{k}: {v / total:.0%}" for k, v in sorted(h.items()))
        print(f"PS {name}: busy {1 - h[0] / total:.0%}; transfers at once {shares}")


def from_capture(summary: str, m_bytes: float) -> None:
    bursts = [b for b in json.loads(Path(summary).read_text()) if b["bytes"] >= 0.3 * m_bytes]
    span = [(b["first_out_ms"], b["last_in_ms"]) for b in bursts]
    report([s for b, s in zip(bursts, span) if b["flow"].startswith("h0>")],
           [s for b, s in zip(bursts, span) if b["flow"].endswith(">h0")])


def emulate(K: int, L_ms: float, B_mbit: float, M: int, overrides: list[str]) -> None:
    from agents.sim import tcp
    from controller import validate
    from controller.config import load
    from controller.results import Point

    windows: dict[tuple[int, int], list[int]] = {}
    exits: list[tuple[float, int, int, int]] = []
    write, hystart = tcp._Sender.write, tcp._Sender._hystart_update

    def logged_write(self, msg, size):
        if size > 0.3 * M:
            windows.setdefault((self.host.worker.id, self.dst), []).append(self.cwnd)
        return write(self, msg, size)

    def logged_hystart(self, delay):
        found = self.found
        hystart(self, delay)
        if self.found and not found:
            exits.append((self.net.kernel.now / 1e6, self.host.worker.id, self.dst, self.cwnd))

    tcp._Sender.write, tcp._Sender._hystart_update = logged_write, logged_hystart
    p = Point("ps_async", K, L_ms / 1e3, B_mbit * 1e6, M, 0.02, 1.0)
    ov = [o for o in validate._overrides_for(p) if not o.startswith("trace.mode=")]
    rc = load(ov + ["network=tcp", "strategy.collective=gloo", *overrides, "trace.mode=full"])
    with tempfile.TemporaryDirectory() as d:
        rate = validate._async_rate(p, validate.observed_updates(rc, Path(d)))
        events = json.loads((Path(d) / "trace.json").read_text())["traceEvents"]
    print(f"updates/s {rate:.2f}")

    def spans(prefix):
        return [(e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3) for e in events
                if e.get("ph") == "X" and e["name"].startswith(prefix)]

    report(spans("params → "), spans("grad → "))
    ps = K  # the PS is the last vworker of the layout
    for (src, dst), w in sorted(windows.items()):
        if src == ps:
            print(f"downlink to w{dst}: window at each transfer's start {w}")
    for t, src, dst, cwnd in exits:
        print(f"{t:9.2f} ms  {src} -> {dst} left slow start at {cwnd} segments")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--emulate"] and len(argv) >= 5:
        emulate(int(argv[1]), float(argv[2]), float(argv[3]), int(float(argv[4])), argv[5:])
    elif len(argv) == 2:
        from_capture(argv[0], float(argv[1]))
    else:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

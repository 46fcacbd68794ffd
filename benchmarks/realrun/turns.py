#!/usr/bin/env python3
"""How the PS's NIC takes turns between its connections: on the testbed, read off a packet capture of its host,
and in the model, off its token bucket.

  python benchmarks/realrun/capture.py --scenario ps_sync ... --sample-us 0 --pcap-hosts 0 --no-trace --out-dir DIR
  python benchmarks/realrun/turns.py DIR [--from-s 1 --to-s 3]
  python benchmarks/realrun/turns.py --emulate RESULTS.jsonl SCENARIO K L_MS B_MBIT M_BYTES [--hystart N]
      [--from-s 1 --to-s 3] [override ...]

Over the window (seconds from the PS's first data packet) it prints one JSON line: how many data packets the
PS's host handed its NIC, their commonest sizes, and how many packets of one connection left back to back
before another connection's ("turns": {packets in a row: how often}). Linux's TCP small queues let a
connection keep two packets of its size in the qdisc (docs/engine.md, "TCP small queues"), so a FIFO of
several connections goes round in turns of one or two packets; a model that let a third in would show turns
of three. ``--steps`` adds, for a synchronous PS, when each connection's last packet of every step left
(ms from the step's first; a step begins after ``--gap-ms`` of silence). The capture's tcpdump runs on the
host's ``eth0``, after its qdisc: a packet's time is when the token bucket released it, as in the model.
``--emulate`` runs the point as ``lockstep validate`` does (seed 0; ``--hystart`` picks a point of a
``hystart_detect`` file).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PS = "10.77.0.1"


def from_pcap(path: str) -> list[tuple[float, str, int]]:
    """(seconds, peer, payload bytes) of every data packet the PS's host sent, in order."""
    out = subprocess.run(["tcpdump", "-r", path, "-nn", "-tt"], capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) < 6 or not f[2].startswith(PS + ".") or f[-2] != "length":
            continue
        n = int(f[-1])
        if n > 1000:  # data, not gloo's 48-byte notifications or ACKs
            rows.append((float(f[0]), "w%d" % (int(f[4].split(".")[3]) - 2), n))
    return rows


def from_model(results: str, scenario: str, K: int, L_ms: float, B_mbit: float, M: int, hystart: int | None,
               overrides: list[str]) -> list[tuple[float, str, int]]:
    from agents.sim import tcp
    from controller.results import group_repeats, load_results
    from controller.validate import emulate

    points = [p for p in group_repeats(load_results(results, (scenario,))) if (p.K, p.M_bytes) == (K, M)
              and abs(p.L_s * 1e3 - L_ms) < 1e-9 and abs(p.B_bps / 1e6 - B_mbit) < 1e-6
              and (hystart is None or p.hystart == hystart)]
    if not points:
        raise SystemExit(f"{results}: no {scenario} point with K={K} L={L_ms} ms B={B_mbit} Mbit/s M={M}")
    rows: list[tuple[float, str, int]] = []
    serve = tcp.TcpNetwork._serve

    def logged(self, host):
        head = host.queue[0] if host.queue else None
        serve(self, host)
        if (host.worker.id == K and head is not None and not head.ack and (not host.queue or host.queue[0] is not head)
                and head.end - head.start > 1000):
            rows.append((self.kernel.now / 1e9, f"w{head.dst}", head.end - head.start))

    tcp.TcpNetwork._serve = logged
    try:
        value = emulate(points[0], ["network=tcp", "strategy.collective=gloo", "seed=0", *overrides])
    finally:
        tcp.TcpNetwork._serve = serve
    print(json.dumps({"emulated": value, "measured": points[0].measured}))
    return rows


def summary(rows: list[tuple[float, str, int]], lo: float, hi: float) -> dict:
    t0 = rows[0][0]
    mid = [r for r in rows if lo <= r[0] - t0 < hi]
    turns: list[int] = []
    last = None
    for _, peer, _ in mid:
        if peer == last:
            turns[-1] += 1
        else:
            turns.append(1)
        last = peer
    return {"window_s": [lo, hi], "packets": len(mid), "bytes": sum(n for _, _, n in mid),
            "sizes": Counter(n for _, _, n in mid).most_common(4), "turns": dict(sorted(Counter(turns).items()))}


def steps(rows: list[tuple[float, str, int]], gap: float) -> list[dict]:
    out: list[list] = [[rows[0]]]
    for r in rows[1:]:
        if r[0] - out[-1][-1][0] > gap:
            out.append([])
        out[-1].append(r)
    lines = []
    for st in out:
        t0 = st[0][0]
        ends = {peer: round((t - t0) * 1e3, 1) for t, peer, _ in st}
        lines.append({"first_s": round(t0 - rows[0][0], 4), "ends_ms": dict(sorted(ends.items()))})
    return lines


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir", nargs="?")
    p.add_argument("--emulate", nargs=6, metavar=("RESULTS", "SCENARIO", "K", "L_MS", "B_MBIT", "M_BYTES"))
    p.add_argument("--hystart", type=int)
    p.add_argument("--from-s", type=float, default=1.0)
    p.add_argument("--to-s", type=float, default=3.0)
    p.add_argument("--steps", action="store_true")
    p.add_argument("--gap-ms", type=float, default=20.0)
    a, overrides = p.parse_known_args(argv)
    if a.emulate and a.dir is not None:  # the positional took the first override
        overrides, a.dir = [a.dir, *overrides], None
    if a.emulate:
        r, sc, K, L, B, M = a.emulate
        rows = from_model(r, sc, int(K), float(L), float(B), int(float(M)), a.hystart, overrides)
    elif a.dir and not overrides:
        rows = from_pcap(os.path.join(a.dir, "h0.pcap"))
    else:
        p.error("give a capture directory (capture.py --pcap-hosts 0), or --emulate")
    print(json.dumps(summary(rows, a.from_s, a.to_s)))
    if a.steps:
        for line in steps(rows, a.gap_ms / 1e3):
            print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

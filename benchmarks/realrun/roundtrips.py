#!/usr/bin/env python3
"""What the hosts add to each round trip of a slow start, read off the receivers' packet captures.

  python benchmarks/realrun/capture.py --scenario ps_async --workers 2 --latency-ms 0.5 --rate-mbit 2500 \
      --model-bytes 10MB --steps 4 --warmup 1 --sample-us 0 --pcap-hosts 1,2 --no-trace --out-dir DIR
  python benchmarks/realrun/roundtrips.py DIR [DIR ...] [--rounds 4] [--gap-ms 0.15] [--busy-ms 0.3]

In its first rounds a connection's slow start is clean: the sender sends a window, the receiver acknowledges
each packet as it arrives, and each ACK of n segments releases 2n at once (slow start), so the first ACK of a
round releases the first packet of the next. On a path with one-way latency L and line rate B, that packet
reaches the receiver 2L + its line time after the ACK left it, plus what the hosts and the network's emulator
add: the sender's stack acting on the ACK, the bridge, delayd's
wake-ups. One JSON line per round: the capture's point, the receiving host, the sending host, the round's
index and its segments, and that excess (µs). Rounds are bursts of packets (a gap of at least ``--gap-ms``
before each); only the first ``--rounds`` are read (later rounds merge into each other), and a round whose
first packet may have queued behind another connection's (a packet of another flow arrived at a captured
host less than ``--busy-ms`` before it) is left out, and so is a burst less than 2L after the previous one
began: a second clump of the same round (gloo's small operations ahead of a tensor split a connection's ACKs
into two clumps per round trip), not the next round. The last line gives the mean, the median and
nearest-rank quantiles.

In the model this excess is what a sender waits before it acts on an ACK: the connection's ``host_rtt`` plus a
keyed exponential draw of mean ``network.tcp.ack_delay`` (docs/engine.md, "The hosts' share of a round trip"):
``ack_delay`` is the measured mean less ``host_rtt``'s (docs/benchmarks.md, same title).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from analyse_capture import load_pcap  # noqa: E402

MSS, HEADERS = 1448, 90  # a segment's payload; TCP/IP headers and Ethernet framing per segment


def line_us(payload: int, rate_bps: float) -> float:
    segs = -(-payload // MSS)
    return (payload + segs * HEADERS) * 8 / rate_bps * 1e6


def rounds_of(d: str, n_rounds: int, gap_us: float, busy_us: float) -> list[dict]:
    with open(os.path.join(d, "record.json")) as f:
        rec = json.load(f)
    with open(os.path.join(d, "meta.json")) as f:
        meta = json.load(f)
    L_us, B = rec["L_ms"] * 1e3, rec["B_mbit"] * 1e6
    hosts = {ip: int(h) for h, ip in meta["hosts"].items()}
    pkts = {}
    for h in hosts.values():
        path = os.path.join(d, f"h{h}.pcap")
        if os.path.exists(path):
            pkts[h] = load_pcap(path, 0)
    arrivals = sorted((p["t"] * 1e6, (p["src"], p["sport"], p["dst"])) for h, ps in pkts.items() for p in ps
                      if p["len"] > 0 and hosts.get(p["dst"]) == h)
    out = []
    for h, ps in pkts.items():
        ip = meta["hosts"][str(h)]
        flows: dict = {}
        for p in ps:
            if p["dst"] == ip and p["len"] > 0:
                flows.setdefault((p["src"], p["sport"], ip), []).append(p)
        for flow, data in flows.items():
            big = next((i for i, p in enumerate(data) if p["len"] > 2 * MSS), None)
            if big is None:
                continue
            acks = [p["t"] * 1e6 for p in ps if p["src"] == ip and (p["dst"], p["dport"]) == flow[:2] and p["ack"]]
            bursts: list[list[dict]] = []
            for p in data[big:]:
                if bursts and p["t"] * 1e6 - bursts[-1][-1]["t"] * 1e6 < gap_us:
                    bursts[-1].append(p)
                elif len(bursts) == n_rounds:
                    break
                else:
                    bursts.append([p])
            for i, (prev, cur) in enumerate(zip(bursts, bursts[1:]), start=2):
                t = cur[0]["t"] * 1e6
                ack = next((a for a in acks if a >= prev[0]["t"] * 1e6), None)  # the round's first ACK
                if (ack is None or t - prev[0]["t"] * 1e6 < 2 * L_us  # a clump of the same round, not the next
                        or any(t - busy_us < ta < t and f != flow for ta, f in arrivals)):
                    continue
                excess = t - line_us(cur[0]["len"], B) - 2 * L_us - ack
                out.append({"scenario": rec["scenario"], "K": rec["K"], "L_ms": rec["L_ms"], "B_mbit": rec["B_mbit"],
                            "M_bytes": rec["M_bytes"], "dir": os.path.basename(os.path.normpath(d)), "host": h,
                            "from": hosts.get(flow[0]), "round": i,
                            "segments": round(sum(p["len"] for p in cur) / MSS), "excess_us": round(excess, 1)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", help="capture.py output directories with receivers' pcaps")
    ap.add_argument("--rounds", type=int, default=4, help="slow-start rounds read per connection")
    ap.add_argument("--gap-ms", type=float, default=0.15, help="a pause this long starts a round")
    ap.add_argument("--busy-ms", type=float, default=0.3,
                    help="leave out a round whose first packet came this soon after another flow's")
    a = ap.parse_args(argv)
    rows = [r for d in a.dirs for r in rounds_of(d, a.rounds, a.gap_ms * 1e3, a.busy_ms * 1e3)]
    for r in rows:
        print(json.dumps(r))
    ex = sorted(r["excess_us"] for r in rows)
    if ex:
        qs = {f"q{int(q * 100)}": ex[round(q * (len(ex) - 1))] for q in (0, 0.1, 0.25, 0.5, 0.75, 0.9, 1)}
        print(json.dumps({"rounds": len(ex), "mean_us": round(statistics.mean(ex), 1),
                          "median_us": round(statistics.median(ex), 1), **qs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

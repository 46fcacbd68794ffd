#!/usr/bin/env python3
"""A synchronous PS's downlink transfers, read off capture.py's socket samples of the PS's host.

  python benchmarks/realrun/capture.py --scenario ps_sync ... --sample-us 1000 --sample-hosts 0 \
      --pcap-hosts none --no-trace --out-dir DIR
  python benchmarks/realrun/downlinks.py DIR [--at 50,100,150,200,300,500,1000,2000] [--quiet-ms 300]

One JSON line per transfer of at least 0.9 MB (acknowledged bytes moving, until they stop for --quiet-ms) on every
connection of rank 0 (10.77.0.1) that carried at least 10 MB: the peer, when it began (s from the first
sample) and how long it took, ssthresh and the window at its end, and at each offset ``--at`` (ms) the
window, the segments in flight and the smoothed RTT — how the downlinks restart, leave slow start and share
the PS's NIC (docs/benchmarks.md, "CUBIC's clock across idle gaps"). With only the PS's sockets sampled and
no packet capture or trace the run keeps its usual step times (a sample costs tens of microseconds).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

PS = "10.77.0.1"
# tcpsample.c's line: t_ns src dst cwnd ssthresh rtt_us rttvar_us min_rtt_us pacing delivery unacked bytes_sent
# bytes_acked ...
T, CWND, SSTHRESH, RTT, UNACKED, ACKED = 0, 1, 2, 3, 8, 10


def load(path: str) -> dict[str, list[tuple[int, ...]]]:
    rows: dict[str, list[tuple[int, ...]]] = defaultdict(list)
    with open(path) as f:
        for line in f:
            fields = line.split()
            if fields[1].split(":")[0] != PS:
                continue
            rows[fields[2].split(":")[0]].append((int(fields[0]),) + tuple(int(x) for x in fields[3:14]))
    return rows


def transfers(samples: list[tuple[int, ...]], quiet_ns: int = 300_000_000) -> list[list[tuple[int, ...]]]:
    """Runs of samples from the one before acknowledged bytes start moving to the last that moved them."""
    out: list[list[tuple[int, ...]]] = []
    cur: list[tuple[int, ...]] | None = None
    last_move = None
    for a, b in zip(samples, samples[1:]):
        if b[ACKED] > a[ACKED]:
            if cur is None or b[T] - last_move > quiet_ns:
                cur = [a]
                out.append(cur)
            last_move = b[T]
        if cur is not None and b[T] - last_move <= quiet_ns:
            cur.append(b)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir")
    p.add_argument("--at", default="50,100,150,200,300,500,1000,2000")
    p.add_argument("--quiet-ms", type=float, default=300.0,
                   help="a pause in acknowledged bytes this long ends a transfer (shorter than a downlink's idle)")
    a = p.parse_args(argv)
    offsets = [int(x) for x in a.at.split(",")]
    with open(os.path.join(a.dir, "record.json")) as f:
        rec = json.load(f)
    point = {k: rec[k] for k in ("scenario", "K", "L_ms", "B_mbit", "M_bytes", "C_ms", "median_s")}
    with open(os.path.join(a.dir, "meta.json")) as f:
        rec_sample_us = json.load(f).get("sample_us")
    rows = load(os.path.join(a.dir, "tcpsample-h0.txt"))
    big = {peer: s for peer, s in rows.items() if s[-1][ACKED] >= 10_000_000}
    if not big:
        print(f"{a.dir}: no connection of {PS} carried 10 MB", file=sys.stderr)
        return 2
    t0 = min(s[0][T] for s in big.values())
    for peer, samples in sorted(big.items()):
        for tr in transfers(samples, int(a.quiet_ms * 1e6)):
            if tr[-1][ACKED] - tr[0][ACKED] < 900_000:  # gloo's notifications, the final barrier
                continue
            start = tr[0][T]
            end = next(r for r in tr if r[ACKED] == tr[-1][ACKED])
            at = {}
            for ms in offsets:
                r = [s for s in tr if s[T] - start <= ms * 1_000_000][-1]
                at[ms] = {"cwnd": r[CWND], "in_flight": r[UNACKED], "srtt_ms": round(r[RTT] / 1000, 1)}
            print(json.dumps({**point, "sample_us": rec_sample_us, "to": peer, "start_s": round((start - t0) / 1e9, 4),
                              "duration_s": round((end[T] - start) / 1e9, 4),
                              "bytes": tr[-1][ACKED] - tr[0][ACKED], "cwnd_end": end[CWND],
                              "ssthresh_end": tr[-1][SSTHRESH], "at_ms": at}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

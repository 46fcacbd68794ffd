#!/usr/bin/env python3
"""Where each TCP connection of a realrun left slow start: `ss -tin` polled in the host namespaces while the run
lasts (docs/benchmarks.md, "Where the testbed's connections leave slow start").

  python benchmarks/realrun/ss_exits.py poll POLL.jsonl HOSTS [PERIOD_MS]   # start before realrun.py, as root
  python benchmarks/realrun/ss_exits.py record REALRUN.json POLL.jsonl       # one JSON line on stdout
  python benchmarks/realrun/ss_exits.py transfers REALRUN.json POLL.jsonl    # a JSON line per PS downlink transfer

``poll`` waits for realrun's namespace ``rr-h0`` and polls ``rr-h0`` … ``rr-h{HOSTS-1}`` every PERIOD_MS (50) until
``rr-h0`` is gone. ``record`` prints the run's point and updates/s with, for every connection that carried at
least 1 MB, its ``ssthresh`` when first seen set — the congestion window at which it left slow start (CUBIC sets
ssthresh to cwnd on a HyStart exit; no loss happened, ``tcp_retrans_segs`` is 0) — its min RTT and its largest
window. Direction: ``downlink`` for sockets in ``rr-h0`` (the PS sending), ``uplink`` for the others.
``transfers`` prints, for every transfer of one message (at least 1 MB) on a PS downlink (acknowledged bytes
moving, then still for 0.3 s; cut as ``downlinks.py`` cuts socket samples), when it began and ended, the window
and ``ssthresh`` at its first and last sample, the RTO, and the idle time before it: how a synchronous PS's
downlinks restart and share its NIC (docs/benchmarks.md, "The send buffer").
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

KEYS = ("cwnd", "ssthresh", "minrtt", "bytes_acked", "rto", "unacked")


def parse(text: str) -> list[dict]:
    conns: list[dict] = []
    cur = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(("\t", " ")):
            parts = line.split()
            cur = {"local": parts[-2], "peer": parts[-1]}
            conns.append(cur)
        elif cur is not None:
            for k in KEYS:
                m = re.search(rf"(?:^|\s){k}:([\d.]+)", line)
                if m:
                    cur[k] = float(m.group(1))
            m = re.search(r"(?:^|\s)rtt:([\d.]+)/", line)
            if m:
                cur["rtt"] = float(m.group(1))
    return conns


def poll(out: str, hosts: int, period_s: float) -> None:
    names = [f"rr-h{i}" for i in range(hosts)]
    deadline = time.time() + 120
    while not os.path.exists("/run/netns/rr-h0"):
        if time.time() > deadline:
            sys.exit("rr-h0 never appeared")
        time.sleep(0.002)  # polls for the namespace, with the deadline above
    t0 = time.perf_counter()
    with open(out, "w") as f:
        while os.path.exists("/run/netns/rr-h0"):
            for ns in names:
                try:
                    r = subprocess.run(["nsenter", f"--net=/run/netns/{ns}", "ss", "-tinH", "state", "established"],
                                       capture_output=True, text=True, timeout=5)
                except (OSError, subprocess.SubprocessError):
                    continue
                f.write(json.dumps({"t": round(time.perf_counter() - t0, 4), "ns": ns, "period_ms": period_s * 1e3,
                                    "conns": parse(r.stdout)}) + "\n")
            time.sleep(period_s)  # the sampling period: ssthresh, once set, stays until the socket closes


def record(realrun_json: str, poll_jsonl: str) -> dict:
    rr = json.load(open(realrun_json))
    seen: dict[tuple, dict] = {}
    period_ms = None
    for line in open(poll_jsonl):
        r = json.loads(line)
        period_ms = r["period_ms"]
        for c in r["conns"]:
            s = seen.setdefault((r["ns"], c["local"], c["peer"]),
                                {"ssthresh": None, "minrtt_ms": None, "bytes_acked": 0, "cwnd_max": 0})
            s["bytes_acked"] = max(s["bytes_acked"], c.get("bytes_acked", 0))
            s["cwnd_max"] = max(s["cwnd_max"], c.get("cwnd", 0))
            if "minrtt" in c:
                s["minrtt_ms"] = c["minrtt"]
            if "ssthresh" in c and s["ssthresh"] is None:
                s["ssthresh"] = int(c["ssthresh"])
    conns = [{"from": local.rsplit(":", 1)[0], "to": peer.rsplit(":", 1)[0],
              "direction": "downlink" if ns == "rr-h0" else "uplink", "ssthresh_at_exit": s["ssthresh"],
              "minrtt_ms": s["minrtt_ms"], "cwnd_max": int(s["cwnd_max"]), "bytes_acked": int(s["bytes_acked"])}
             for (ns, local, peer), s in sorted(seen.items()) if s["bytes_acked"] >= 1e6]
    keys = ("scenario", "K", "L_ms", "B_mbit", "M_bytes", "C_ms", "updates_per_s", "time", "kernel")
    return {**{k: rr.get(k) for k in keys}, "poll_period_ms": period_ms, "connections": conns}


def transfers(realrun_json: str, poll_jsonl: str, quiet_s: float = 0.3) -> list[dict]:
    from downlinks import transfers as runs  # the same cut of a series into transfers as the socket samples'

    rr = json.load(open(realrun_json))
    series: dict[str, list[tuple[float, dict]]] = {}
    for line in open(poll_jsonl):
        r = json.loads(line)
        if r["ns"] == "rr-h0":
            for c in r["conns"]:
                if "bytes_acked" in c:
                    series.setdefault(c["peer"], []).append((r["t"], c))
    out = []
    for peer, samples in sorted(series.items()):
        if max(c["bytes_acked"] for _, c in samples) < 1e6:
            continue
        last_end = None
        for tr in runs(samples, quiet_s, t=lambda s: s[0], acked=lambda s: s[1]["bytes_acked"]):
            (_, before), (start, first) = tr[0], tr[1]
            end, last = next((t, c) for t, c in tr if c["bytes_acked"] == tr[-1][1]["bytes_acked"])
            x = {"to": peer.rsplit(":", 1)[0], "start_s": start,
                 "idle_s": None if last_end is None else round(start - last_end, 3), "cwnd_first": first.get("cwnd"),
                 "ssthresh_first": first.get("ssthresh"), "rto_ms": first.get("rto"), "end_s": end,
                 "cwnd_last": last.get("cwnd"), "ssthresh_last": last.get("ssthresh"),
                 "bytes": int(last["bytes_acked"] - before["bytes_acked"])}
            if 1e6 <= x["bytes"] <= 1.5 * rr["M_bytes"]:  # one message (not several run together)
                out.append(x)
            last_end = end
    keys = ("scenario", "K", "L_ms", "B_mbit", "M_bytes", "C_ms", "median_s", "time")
    head = {k: rr.get(k) for k in keys}
    return [{**head, **x} for x in sorted(out, key=lambda x: (x["start_s"], x["to"]))]


def main() -> None:
    if len(sys.argv) >= 4 and sys.argv[1] == "poll":
        poll(sys.argv[2], int(sys.argv[3]), (float(sys.argv[4]) if len(sys.argv) > 4 else 50.0) / 1e3)
    elif len(sys.argv) == 4 and sys.argv[1] == "record":
        print(json.dumps(record(sys.argv[2], sys.argv[3])))
    elif len(sys.argv) == 4 and sys.argv[1] == "transfers":
        for x in transfers(sys.argv[2], sys.argv[3]):
            print(json.dumps(x))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()

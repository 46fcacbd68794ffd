#!/usr/bin/env python3
"""Per-connection timelines from a capture.py directory.

  python benchmarks/realrun/analyse_capture.py DIR [--flow 10.77.0.1>10.77.0.2] [--events] [--json OUT]

For every data direction (sender host -> receiver host of one gloo connection) it prints, per burst
of data (a PS step's parameters, a gradient, ...):
  * when the burst's first packet left the sender's NIC queue and when its last byte reached the receiver,
  * the sender's cwnd / ssthresh when the burst began and where it left slow start: ssthresh dropping
    from 2^31-1 to the cwnd of the moment (HyStart), with the gaps between the ACKs just before it and
    the ACK train they form (consecutive gaps <= 2 ms, HyStart's hystart_ack_delta) -- an exit with no
    train is HyStart's delay test. (tcp_probe reports tcp_current_ssthresh, max(ssthresh, 3/4 cwnd)
    outside a cwnd reduction, so later rises of "ssthresh" in congestion avoidance are not exits.)
  * the sizes of the GSO packets the sender handed its NIC (pacing: 200 % of cwnd/srtt in slow start,
    120 % after).
Times are ms from the first data packet of the run, CLOCK_MONOTONIC.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections import defaultdict

INF_SSTHRESH = 2147483647
_PROBE = re.compile(r"\s(\d+\.\d+): tcp_probe: .*?src=([\d.]+):(\d+) dest=([\d.]+):(\d+) .*?data_len=(\d+) "
                    r"snd_nxt=(0x[0-9a-f]+) snd_una=(0x[0-9a-f]+) snd_cwnd=(\d+) ssthresh=(\d+) snd_wnd=(\d+) "
                    r"srtt=(\d+) rcv_wnd=(\d+)")
_PCAP = re.compile(r"^(\d+\.\d+) IP ([\d.]+)\.(\d+) > ([\d.]+)\.(\d+): Flags \[([^\]]*)\](?:, seq (\d+)(?::(\d+))?)?"
                   r"(?:, ack (\d+))?.*?length (\d+)")


def load_probe(path: str) -> list[dict]:
    out = []
    with open(path) as f:
        for line in f:
            m = _PROBE.search(line)
            if not m:
                continue
            t, s, sp, d, dp, dl, nxt, una, cwnd, ssth, swnd, srtt, rwnd = m.groups()
            out.append({"t": float(t), "src": s, "sport": int(sp), "dst": d, "dport": int(dp), "data_len": int(dl),
                        "snd_nxt": int(nxt, 16), "snd_una": int(una, 16), "cwnd": int(cwnd), "ssthresh": int(ssth),
                        "snd_wnd": int(swnd), "srtt_us": int(srtt), "rcv_wnd": int(rwnd)})
    return out


def load_pcap(path: str, offset_ns: int) -> list[dict]:
    """Packets of a host's eth0 (tcpdump text, absolute sequence numbers), times on CLOCK_MONOTONIC."""
    txt = subprocess.run(["tcpdump", "-r", path, "-nn", "-tt", "--nano", "-S"], capture_output=True,
                         text=True).stdout
    out = []
    for line in txt.splitlines():
        m = _PCAP.match(line)
        if not m:
            continue
        t, s, sp, d, dp, flags, seq0, seq1, ack, length = m.groups()
        out.append({"t": float(t) - offset_ns / 1e9, "src": s, "sport": int(sp), "dst": d, "dport": int(dp),
                    "flags": flags, "seq": int(seq0) if seq0 else None, "end": int(seq1) if seq1 else None,
                    "ack": int(ack) if ack else None, "len": int(length)})
    return out


def load_samples(path: str) -> list[dict]:
    keys = ("t", "src", "dst", "cwnd", "ssthresh", "rtt_us", "rttvar_us", "min_rtt_us", "pacing_Bps", "delivery_Bps",
            "unacked", "bytes_sent", "bytes_acked", "bytes_received", "notsent", "rcv_ssthresh", "snd_wnd",
            "wmem_alloc", "wmem_queued", "sndbuf", "rmem_alloc", "rcvbuf", "ca_state", "app_limited", "busy_us",
            "rwnd_limited_us", "sndbuf_limited_us", "delivered")
    out = []
    with open(path) as f:
        for line in f:
            v = line.split()
            r = dict(zip(keys, v))
            for k in keys:
                if k not in ("src", "dst"):
                    r[k] = int(r[k])
            r["t"] /= 1e9
            out.append(r)
    return out


def bursts(pkts: list[dict], gap: float) -> list[list[dict]]:
    """Data packets of one direction, split where the sender was silent for more than ``gap`` s."""
    out: list[list[dict]] = []
    for p in pkts:
        if out and p["t"] - out[-1][-1]["t"] <= gap:
            out[-1].append(p)
        else:
            out.append([p])
    return out


def rendezvous(pkts: list[dict], hosts: dict[str, int], src: str) -> list[str]:
    """For each connection from ``src`` (host 0's capture): gloo's small messages before its first data.

    The last notifications ``src`` sent before the first data packet, the peer's last small message
    before it (its "recv ready"), and whether the notifications were still unacknowledged when the
    data started (its first window then leaves around them)."""
    lines = []
    t0 = min(p["t"] for p in pkts)
    ms = lambda t: round((t - t0) * 1e3, 2)  # noqa: E731
    for dst in sorted({p["dst"] for p in pkts if p["src"] == src and p["dst"] in hosts and p["dst"] != src}):
        data = [p for p in pkts if p["src"] == src and p["dst"] == dst and p["len"] > 1000]
        if not data:
            continue
        first = data[0]
        notes = [p for p in pkts if p["src"] == src and p["dst"] == dst and 0 < p["len"] < 100 and p["t"] < first["t"]]
        peer = [p for p in pkts if p["src"] == dst and p["dst"] == src and 0 < p["len"] < 100 and p["t"] < first["t"]]
        if not notes or not peer:
            continue
        acks = [p["t"] for p in pkts if p["src"] == dst and p["dst"] == src and p["ack"] is not None
                and p["ack"] >= notes[-1]["end"] and p["t"] >= notes[-1]["t"]]
        acked = acks[0] if acks else None
        state = "in flight" if acked is None or acked > first["t"] else "acknowledged"
        lines.append(f"h{hosts[src]}>h{hosts[dst]}: notifications at {[ms(p['t']) for p in notes[-2:]]} ms, the "
                     f"peer's last small message at {ms(peer[-1]['t'])}, first data at {ms(first['t'])} "
                     f"({first['len'] // 1448} segments), notifications acknowledged at "
                     f"{ms(acked) if acked else None}: {state} when the data started")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--flow", action="append", help="SRC>DST host addresses to show (default: all)")
    ap.add_argument("--gap-ms", type=float, default=15.0, help="silence that separates two bursts")
    ap.add_argument("--events", action="store_true", help="print every probe event of the shown flows")
    ap.add_argument("--min-bytes", type=int, default=100_000, help="bursts smaller than this are skipped")
    ap.add_argument("--json", help="write the per-burst summary here")
    ap.add_argument("--rendezvous", action="store_true",
                    help="only gloo's notifications before each of host 0's first transfers")
    a = ap.parse_args()
    meta = json.load(open(os.path.join(a.dir, "meta.json")))
    off = meta["realtime_minus_mono_ns"]
    hosts = {ip: int(h) for h, ip in meta["hosts"].items()}
    probe = load_probe(os.path.join(a.dir, "probe.txt")) if os.path.exists(os.path.join(a.dir, "probe.txt")) else []
    pcaps = {h: load_pcap(os.path.join(a.dir, f"h{h}.pcap"), off) for h in hosts.values()
             if os.path.exists(os.path.join(a.dir, f"h{h}.pcap"))}
    if a.rendezvous:
        src = next(ip for ip, h in hosts.items() if h == 0)
        print("\n".join(rendezvous(pcaps[0], hosts, src)))
        return 0
    # data leaving each sender (its own eth0) and arriving at each receiver (the receiver's eth0)
    sent: dict[tuple, list] = defaultdict(list)
    arrived: dict[tuple, list] = defaultdict(list)
    for h, pk in pcaps.items():
        for p in pk:
            if p["len"] <= 0 or p["src"] not in hosts or p["dst"] not in hosts:
                continue
            key = (p["src"], p["sport"], p["dst"], p["dport"])
            (sent if hosts[p["src"]] == h else arrived)[key].append(p)
    t0 = min(p[0]["t"] for p in sent.values()) if sent else 0.0
    by_conn: dict[tuple, list] = defaultdict(list)  # probe events of a sender: it receives the ACKs
    for e in probe:
        by_conn[(e["src"], e["sport"], e["dst"], e["dport"])].append(e)
    summary = []
    for key in sorted(sent, key=lambda k: (k[0], k[2])):
        src, sport, dst, dport = key
        if a.flow and f"{src}>{dst}" not in a.flow:
            continue
        total = sum(p["len"] for p in sent[key])
        if total < a.min_bytes:
            continue
        evs = by_conn.get(key, [])
        arr = arrived.get(key, [])
        print(f"\n=== h{hosts[src]} {src}:{sport} -> h{hosts[dst]} {dst}:{dport}: {total} bytes in "
              f"{len(sent[key])} packets")
        for bi, b in enumerate(bursts(sent[key], a.gap_ms / 1e3)):
            nbytes = sum(p["len"] for p in b)
            if nbytes < a.min_bytes:
                continue
            tb, te = b[0]["t"], b[-1]["t"]
            last_seq = max(p["end"] for p in b)
            t_arr = next((p["t"] for p in arr if p["end"] is not None and p["end"] >= last_seq), None)
            before = [e for e in evs if e["t"] <= tb]
            during = [e for e in evs if tb <= e["t"] <= (t_arr or te) + 0.05]
            st = before[-1] if before else (during[0] if during else None)
            sizes = [p["len"] for p in b]
            rec = {"flow": f"h{hosts[src]}>h{hosts[dst]}", "burst": bi, "bytes": nbytes, "packets": len(b),
                   "first_out_ms": (tb - t0) * 1e3, "last_out_ms": (te - t0) * 1e3,
                   "last_in_ms": (t_arr - t0) * 1e3 if t_arr else None,
                   "cwnd0": st["cwnd"] if st else None, "ssthresh0": st["ssthresh"] if st else None,
                   "srtt0_us": st["srtt_us"] if st else None,
                   "gso_mean_segs": sum(sizes) / len(sizes) / 1448, "exits": []}
            prev = st
            for i, e in enumerate(during):
                if prev is not None and e["ssthresh"] != prev["ssthresh"] and prev["ssthresh"] == INF_SSTHRESH:
                    # tcp_probe shows the state before an incoming segment is processed: the segment that
                    # changed ssthresh is the one before ``e``
                    j = i - 1 if i else 0
                    acks = during[max(0, j - 8):j + 1]
                    gaps = [round((y["t"] - x["t"]) * 1e3, 3) for x, y in zip(acks, acks[1:])]
                    train = 0.0  # HyStart's ACK train: consecutive ACKs at most 2 ms apart, ending at the exit
                    for g in reversed(gaps):
                        if g > 2.0:
                            break
                        train += g
                    rec["exits"].append({"t_ms": (during[j]["t"] - t0) * 1e3, "ssthresh": e["ssthresh"],
                                         "cwnd": e["cwnd"], "from": prev["ssthresh"], "ack_gaps_ms": gaps,
                                         "train_ms": round(train, 3), "srtt_us": during[j]["srtt_us"]})
                prev = e
            summary.append(rec)
            ex = "; ".join(f"ssthresh {x['from']}->{x['ssthresh']} at {x['t_ms']:.1f} ms (cwnd {x['cwnd']}, "
                           f"ACK gaps {x['ack_gaps_ms']} ms, train {x['train_ms']} ms, srtt {x['srtt_us']} us)"
                           for x in rec["exits"])
            print(f"  burst {bi}: {nbytes} B, {len(b)} pkts (mean {rec['gso_mean_segs']:.1f} segs), out "
                  f"{rec['first_out_ms']:.1f}-{rec['last_out_ms']:.1f} ms, delivered "
                  f"{rec['last_in_ms'] if rec['last_in_ms'] is None else round(rec['last_in_ms'], 1)} ms; "
                  f"start cwnd {rec['cwnd0']} ssthresh {rec['ssthresh0']} srtt {rec['srtt0_us']} us"
                  + (f"\n    {ex}" if ex else ""))
            if a.events:
                for e in during:
                    print(f"    {(e['t'] - t0) * 1e3:9.3f} una {e['snd_una'] - (st or e)['snd_una']:>8d} "
                          f"nxt-una {e['snd_nxt'] - e['snd_una']:>7d} cwnd {e['cwnd']:4d} ssthresh "
                          f"{e['ssthresh'] if e['ssthresh'] != INF_SSTHRESH else 'inf':>5} srtt {e['srtt_us']:6d} "
                          f"swnd {e['snd_wnd']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

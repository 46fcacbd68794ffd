#!/usr/bin/env python3
"""A synchronous PS's downlink transfers: on the testbed, read off capture.py's socket samples of the PS's host,
and in the model, read off its senders at every ACK.

  python benchmarks/realrun/capture.py --scenario ps_sync ... --sample-us 1000 --sample-hosts 0 \
      --pcap-hosts none --no-trace --out-dir DIR
  python benchmarks/realrun/downlinks.py DIR [--at 50,100,150,200,300,500,1000,2000] [--quiet-ms 300]
  python benchmarks/realrun/downlinks.py --emulate RESULTS.jsonl K L_MS B_MBIT M_BYTES [--seeds N]
      [--ps-lead MS] [--first-ms MS] [--at ...] [--quiet-ms ...] [override ...]
  python benchmarks/realrun/downlinks.py DIR --steps
  python benchmarks/realrun/downlinks.py --emulate RESULTS.jsonl K L_MS B_MBIT M_BYTES --steps [override ...]

One JSON line per transfer of at least 0.9 MB (acknowledged bytes moving, until they stop for --quiet-ms) on every
connection of the PS that carried at least 10 MB: the peer, when it began (s from the first sample) and how long
it took, ssthresh and the window at its end, and at each offset ``--at`` (ms) the window, the segments in
flight and the smoothed RTT — how the downlinks restart, leave slow start and share the PS's NIC
(docs/benchmarks.md, "CUBIC's clock across idle gaps"). With only the PS's sockets sampled and no packet capture
or trace, the testbed's run keeps its usual step times (a sample costs tens of microseconds).

``--emulate`` runs the ps_sync point of RESULTS.jsonl with those K, L, B, M as ``lockstep validate`` does
(``network=tcp strategy.collective=gloo``, then the overrides), instrumenting ``agents.sim.tcp._Sender`` (a
diagnostic, not a test). It prints the median step of each seed (``seed=0`` … ``N-1``) and, with one seed, the
model's transfers as above, each with CUBIC's clock (s into its epoch) and target (segments) at its end.
``--first-ms MS`` prints instead, with one seed, every packet the PS's connections hand their NIC and every ACK
they take in the first MS ms (what a capture of the PS's host shows: ``lab/capture/ps4-1-100-1*``). The model's
``wN`` is vworker N, the testbed's rank N + 1.
``--steps`` prints instead one JSON line per step of the synchronous PS, on the testbed or in the model (one
seed), with times in ms from the PS's first parameter write of the step: per worker when the PS wrote its
parameters, when their last byte was acknowledged, and when its gradient's bytes began and stopped arriving
at the PS (``[start, end]``) — how the downlinks share the PS's NIC and how the gradients queue at its port
(docs/benchmarks.md, "Where the model's 7 ms go"). The model's lines also give each uplink's ``ssthresh`` at
the step's end (``null`` while in slow start). The testbed's times carry its sampler's period (about 3.5 ms
at ``--sample-us 1000``: reading every socket of the host takes that long).
``--ps-lead MS`` is a probe, not a setting of the model: every worker starts MS later than the PS
(docs/benchmarks.md, "two regimes").
``--host-rtt US,US,...`` is a probe too: the hosts' share of the minimum RTT (``network.tcp.host_rtt_min`` /
``host_rtt_max``, a keyed draw per connection) is set by hand instead, the N-th value (µs) for the PS's connection
to worker ``wN``, the last for every other connection — ``DIR --min-rtt``'s ``excess_us`` of a capture
(docs/benchmarks.md, "The minimum RTT of a connection").
``DIR --min-rtt`` prints, for every connection the capture sampled (``--sample-hosts``), its minimum RTT at the
end (Linux's ``tcp_min_rtt``, µs) and its excess over 2L plus the line time of a one-segment packet and its
ACK on both lines: what the hosts' stacks and the bridge add to a round trip.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

PS = "10.77.0.1"


class Sample(NamedTuple):
    t_ns: int
    cwnd: int
    ssthresh: int
    srtt_us: int
    in_flight: int
    acked: int  # bytes acknowledged since the connection began
    cubic_clock_s: float | None = None  # the model's only
    cubic_target: int | None = None


def load(path: str) -> dict[str, list[Sample]]:
    """The PS's connections in a tcpsample.c file (``t_ns src dst cwnd ssthresh rtt_us rttvar_us min_rtt_us
    pacing delivery unacked bytes_sent bytes_acked ...``), by peer address."""
    rows: dict[str, list[Sample]] = defaultdict(list)
    with open(path) as f:
        for line in f:
            fields = line.split()
            if fields[1].split(":")[0] != PS:
                continue
            v = [int(x) for x in fields[3:13]]
            rows[fields[2].split(":")[0]].append(Sample(int(fields[0]), v[0], v[1], v[2], v[7], v[9]))
    return rows


def transfers(samples: list, quiet: float, t=lambda s: s.t_ns, acked=lambda s: s.acked) -> list[list]:
    """Runs of samples from the one before acknowledged bytes start moving to the last within ``quiet`` (in the
    unit of ``t``) of the last that moved them."""
    out: list[list] = []
    cur: list | None = None
    last_move = None
    for a, b in zip(samples, samples[1:]):
        if acked(b) > acked(a):
            if cur is None or t(b) - last_move > quiet:
                cur = [a]
                out.append(cur)
            last_move = t(b)
        if cur is not None and t(b) - last_move <= quiet:
            cur.append(b)
    return out


def _steps(events: dict[str, list[dict]], quiet: int = 30_000_000) -> list[dict]:
    """Group per-worker transfers (dicts with ``w``, the write time) into steps: a step begins at a write
    more than ``quiet`` ns after the step before began."""
    flat = sorted((e["w"], peer, e) for peer, evs in events.items() for e in evs)
    steps: list[dict] = []
    for w, peer, e in flat:
        if not steps or w - steps[-1]["t0"] > quiet:
            steps.append({"t0": w, "workers": {}})
        steps[-1]["workers"][peer] = e
    return steps


def _ms(t: int | None, t0: int) -> float | None:
    return None if t is None else round((t - t0) / 1e6, 1)


def print_steps(steps: list[dict], head: dict) -> None:
    prev = None
    for i, st in enumerate(steps):
        t0 = st["t0"]
        workers = {}
        for peer, e in sorted(st["workers"].items()):
            workers[peer] = {"write_ms": _ms(e["w"], t0), "downlink_end_ms": _ms(e["ae"], t0),
                             "gradient_ms": [_ms(e["rs"], t0), _ms(e["re"], t0)]}
            if "ssthresh" in e:
                workers[peer]["uplink_ssthresh"] = e["ssthresh"]
        print(json.dumps({**head, "step": i, "since_last_ms": _ms(t0, prev) if prev is not None else None,
                          "workers": workers}))
        prev = t0


def load_steps(path: str, M: int) -> list[dict]:
    """The PS's steps off a tcpsample.c file: a parameter write where the connection's unacknowledged
    segments leave 0, its end where the acknowledged bytes last moved, the gradient where the received bytes
    moved by more than gloo's notifications after that."""
    rows: dict[str, list[tuple[int, int, int, int]]] = defaultdict(list)
    with open(path) as f:
        for line in f:
            fields = line.split()
            if fields[1].split(":")[0] != PS:
                continue
            peer = "w%d" % (int(fields[2].split(":")[0].rsplit(".", 1)[1]) - 2)  # 10.77.0.2 is rank 1, w0
            rows[peer].append((int(fields[0]), int(fields[10]), int(fields[12]), int(fields[13])))
    events: dict[str, list[dict]] = {}
    for peer, s in rows.items():
        cur, out = None, []
        for a, b in zip(s, s[1:]):
            if a[1] == 0 and b[1] > 0:
                cur = {"w": b[0], "a0": a[2], "ae": None, "rs": None, "re": None}
                out.append(cur)
            if cur is None:
                continue
            if b[2] > a[2]:
                cur["ae"] = b[0]
                cur["a1"] = b[2]
            if b[3] > a[3] + 1000 and cur["ae"] is not None:
                cur["rs"] = a[0] if cur["rs"] is None else cur["rs"]
                cur["re"] = b[0]
        events[peer] = [e for e in out if e.get("a1", 0) - e["a0"] >= 0.9 * M]
    return _steps(events)


def report(by_peer: dict[str, list[Sample]], head: dict, offsets: list[int], quiet_ns: int) -> None:
    big = {peer: s for peer, s in by_peer.items() if s and s[-1].acked >= 10_000_000}
    if not big:
        raise SystemExit(f"no connection of the PS carried 10 MB ({head})")
    t0 = min(s[0].t_ns for s in big.values())
    for peer, samples in sorted(big.items()):
        for tr in transfers(samples, quiet_ns):
            if tr[-1].acked - tr[0].acked < 900_000:  # gloo's notifications, the final barrier
                continue
            start = tr[0].t_ns
            end = next(r for r in tr if r.acked == tr[-1].acked)
            at = {}
            for ms in offsets:
                r = [s for s in tr if s.t_ns - start <= ms * 1_000_000][-1]
                at[ms] = {"cwnd": r.cwnd, "in_flight": r.in_flight, "srtt_ms": round(r.srtt_us / 1000, 1)}
            line = {**head, "to": peer, "start_s": round((start - t0) / 1e9, 4),
                    "duration_s": round((end.t_ns - start) / 1e9, 4), "bytes": tr[-1].acked - tr[0].acked,
                    "cwnd_end": end.cwnd, "ssthresh_end": tr[-1].ssthresh, "at_ms": at}
            if end.cubic_clock_s is not None:
                line.update(cubic_clock_s=round(end.cubic_clock_s, 2), cubic_target=end.cubic_target)
            print(json.dumps(line))


def min_rtts(d: str) -> None:
    """Every sampled connection's minimum RTT at its last sample, and its excess over 2L and the line time of a
    one-segment packet (91 wire bytes) and its ACK (90) on both lines."""
    import glob

    with open(os.path.join(d, "record.json")) as f:
        rec = json.load(f)
    L_us, B = rec["L_ms"] * 1e3, rec["B_mbit"] * 1e6
    small_us = 2 * (91 + 90) * 8 / B * 1e6
    last: dict[tuple[str, str], int] = {}
    for path in sorted(glob.glob(os.path.join(d, "tcpsample-h*.txt"))):
        with open(path) as f:
            for line in f:
                fields = line.split()
                last[fields[1], fields[2]] = int(fields[7])
    for (src, dst), m in sorted(last.items()):
        print(json.dumps({"scenario": rec["scenario"], "K": rec["K"], "L_ms": rec["L_ms"], "B_mbit": rec["B_mbit"],
                          "src": src, "dst": dst, "min_rtt_us": m, "excess_us": round(m - 2 * L_us - small_us, 1)}))


def emulate(results: str, K: int, L_ms: float, B_mbit: float, M: int, seeds: int, ps_lead_ms: float,
            first_ms: float, overrides: list[str], offsets: list[int], quiet_ns: int, steps: bool = False,
            host_rtt: list[int] | None = None) -> None:
    from agents.sim import compute, tcp
    from controller.results import load_results
    from controller.validate import emulate as run_point

    points = [p for p in load_results(results, ("ps_sync",)) if (p.K, p.M_bytes) == (K, M)
              and abs(p.L_s * 1e3 - L_ms) < 1e-9 and abs(p.B_bps / 1e6 - B_mbit) < 1e-6]
    if not points:
        raise SystemExit(f"{results}: no ps_sync point with K={K} L={L_ms} ms B={B_mbit} Mbit/s M={M}")
    p, ps = points[0], K  # the PS is the last vworker of the layout
    samples: dict[str, list[Sample]] = defaultdict(list)
    write, on_ack, start_at = tcp._Sender.write, tcp._Sender.on_ack, compute.ComputeModel.start_at
    enqueue = tcp.TcpNetwork.enqueue

    def sample(self):
        net, clock, target = self.net, None, None
        if self.epoch_start is not None:  # bictcp_update's t and bic_target without a loss (W_max = 0)
            clock = ((net.jiffies(net.kernel.now) - self.epoch_start) / net.tcp.clock_hz
                     + (self.delay_min or 0) / 1e9)
            target = self.origin + int(0.4 * clock ** 3)
        samples[f"w{self.dst}"].append(Sample(net.kernel.now, self.cwnd, self.ssthresh, (self.srtt8 >> 3) // 1000,
                                              self.packets_out, self.una, clock, target))

    def sampled_write(self, msg, size):  # a sample where a transfer begins: the model has none while idle
        write(self, msg, size)
        if self.host.worker.id == ps:
            sample(self)

    def sampled_on_ack(self, ack_seq, tsent):
        if first_ms and self.host.worker.id == ps:
            log(self.net.kernel.now, f"   w{self.dst} ACK {ack_seq}")
        on_ack(self, ack_seq, tsent)
        if self.host.worker.id == ps:
            sample(self)

    t0: list[int] = []

    def log(now, what):
        if now - (t0[0] if t0 else now) <= first_ms * 1e6:
            print(f"{(now - t0[0]) / 1e6 if t0 else 0.0:8.3f} {what}")

    def logged_enqueue(net, host, pkt):
        if host.worker.id == ps and not pkt.ack:
            snd = host.senders[pkt.dst]
            t0[:] = t0 or [net.kernel.now]
            log(net.kernel.now, f"-> w{pkt.dst} {pkt.segs} segs ({pkt.end - pkt.start} B), cwnd {snd.cwnd}")
        enqueue(net, host, pkt)

    def led_start_at(self, vid):
        return start_at(self, vid) + (0 if vid == ps else int(ps_lead_ms * 1e6))

    events: dict[str, list[dict]] = defaultdict(list)  # --steps: per worker, its transfers as load_steps reads them
    arrive = tcp.TcpNetwork._arrive

    def step_write(self, msg, size):
        write(self, msg, size)
        if self.host.worker.id == ps and size >= 0.9 * M:
            events[f"w{self.dst}"].append({"w": self.net.kernel.now, "ae": None, "rs": None, "re": None})

    def step_on_ack(self, ack_seq, tsent):
        on_ack(self, ack_seq, tsent)
        if self.host.worker.id == ps and events[f"w{self.dst}"]:
            events[f"w{self.dst}"][-1]["ae"] = self.net.kernel.now

    def step_arrive(self, data):
        src, dst, ack = data[0], data[1], data[2]
        arrive(self, data)
        if dst == ps and not ack and events[f"w{src}"] and events[f"w{src}"][-1]["ae"] is not None:
            e = events[f"w{src}"][-1]
            e["rs"] = self.kernel.now if e["rs"] is None else e["rs"]
            e["re"] = self.kernel.now
            up = self._hosts[src].senders[ps]
            e["ssthresh"] = None if up.ssthresh >= tcp._INFINITE_SSTHRESH else up.ssthresh

    init = tcp._Sender.__init__

    def set_host_rtt(self, net, host, dst, *args, **kwargs):  # the probe: the share set by hand
        init(self, net, host, dst, *args, **kwargs)
        self.host_rtt = 1000 * (host_rtt[dst] if host.worker.id == ps and dst < K else host_rtt[-1])

    if host_rtt:
        if len(host_rtt) != K + 1:
            raise SystemExit(f"--host-rtt: give {K + 1} values (the PS's {K} connections, then the others)")
        tcp._Sender.__init__ = set_host_rtt
    if steps:
        tcp._Sender.write, tcp._Sender.on_ack, tcp.TcpNetwork._arrive = step_write, step_on_ack, step_arrive
    else:
        tcp._Sender.write, tcp._Sender.on_ack = sampled_write, sampled_on_ack
    if first_ms:
        tcp.TcpNetwork.enqueue = logged_enqueue
    if ps_lead_ms:
        compute.ComputeModel.start_at = led_start_at
    head = {"scenario": "ps_sync", "K": K, "L_ms": L_ms, "B_mbit": B_mbit, "M_bytes": M,
            "measured_s": p.measured, "ps_lead_ms": ps_lead_ms}
    for seed in range(seeds):
        samples.clear()
        events.clear()
        step = run_point(p, ["network=tcp", "strategy.collective=gloo", f"seed={seed}", *overrides])
        print(json.dumps({**head, "seed": seed, "step_s": step}))
        if seeds == 1 and steps:
            print_steps(_steps(events), {**head, "seed": seed})
        elif seeds == 1 and not first_ms:
            report(samples, {**head, "seed": seed}, offsets, quiet_ns)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("dir", nargs="?")
    p.add_argument("--emulate", nargs=5, metavar=("RESULTS", "K", "L_MS", "B_MBIT", "M_BYTES"))
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--ps-lead", type=float, default=0.0, help="ms by which the PS starts before every worker")
    p.add_argument("--first-ms", type=float, default=0.0, help="print the PS's packets and ACKs of the first MS ms")
    p.add_argument("--at", default="50,100,150,200,300,500,1000,2000")
    p.add_argument("--steps", action="store_true",
                   help="one line per step: the downlinks' ends and the gradients' arrival at the PS")
    p.add_argument("--host-rtt", default="", help="the hosts' share of the minimum RTT in µs, set by hand: the PS's "
                   "connection to w0, w1, ..., then every other connection (a probe)")
    p.add_argument("--min-rtt", action="store_true", help="with DIR: every sampled connection's minimum RTT")
    p.add_argument("--quiet-ms", type=float, default=300.0,
                   help="a pause in acknowledged bytes this long ends a transfer (shorter than a downlink's idle)")
    a, overrides = p.parse_known_args(argv)
    if a.emulate and a.dir is not None:  # the positional took the first override
        overrides, a.dir = [a.dir, *overrides], None
    offsets, quiet_ns = [int(x) for x in a.at.split(",")], int(a.quiet_ms * 1e6)
    if a.emulate:
        r, K, L, B, M = a.emulate
        extra = [int(x) for x in a.host_rtt.split(",")] if a.host_rtt else None
        emulate(r, int(K), float(L), float(B), int(float(M)), a.seeds, a.ps_lead, a.first_ms, overrides, offsets,
                quiet_ns, a.steps, extra)
        return 0
    if a.dir is None or overrides:
        p.error("give a capture directory, or --emulate")
    if a.min_rtt:
        min_rtts(a.dir)
        return 0
    with open(os.path.join(a.dir, "record.json")) as f:
        rec = json.load(f)
    with open(os.path.join(a.dir, "meta.json")) as f:
        sample_us = json.load(f).get("sample_us")
    head = {k: rec[k] for k in ("scenario", "K", "L_ms", "B_mbit", "M_bytes", "C_ms", "median_s")}
    if a.steps:
        print_steps(load_steps(os.path.join(a.dir, "tcpsample-h0.txt"), rec["M_bytes"]),
                    {**head, "sample_us": sample_us})
        return 0
    report(load(os.path.join(a.dir, "tcpsample-h0.txt")), {**head, "sample_us": sample_us}, offsets, quiet_ns)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""Run one realrun point (its own worker code, unchanged) and record what TCP does in every host.

  nice -n -10 python benchmarks/realrun/capture.py --scenario ps_sync --workers 2 --latency-ms 1 \
      --rate-mbit 100 --model-bytes 1MB --steps 4 --out-dir /tmp/cap-ps2

Writes into --out-dir:
  record.json          realrun's own result line for the run (step times, p2p, delayd statistics)
  tcpsample-hI.txt     every established connection of host I every --sample-us (tcpsample.c: cwnd,
                       ssthresh, RTT, pacing rate, bytes sent/acked, socket memory), CLOCK_MONOTONIC ns
  probe.txt            the kernel's tcp:tcp_probe events (one per segment a connection receives: snd_nxt,
                       snd_una, cwnd, ssthresh, srtt, before the segment is processed), CLOCK_MONOTONIC,
                       from a private ftrace instance
  hI.pcap              tcpdump of host I's eth0 (headers only, ns timestamps): what leaves the host's
                       qdisc and what delayd released to it
  meta.json            the addresses, the clocks' offset (CLOCK_REALTIME - CLOCK_MONOTONIC), loadavg and
                       trace_events_lost (the oldest events a full trace buffer overwrote; also a warning)

benchmarks/realrun/analyse_capture.py turns these into per-step, per-connection timelines.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(HERE))
REALRUN = os.environ.get("LOCKSTEP_REALRUN") or next(
    (p for p in (os.path.join(_ROOT, "..", "shared", "realrun"), os.path.join(_ROOT, "..", "..", "shared", "realrun"))
     if os.path.isfile(os.path.join(p, "realrun.py"))), "../shared/realrun")
sys.path.insert(0, REALRUN)
import realrun  # noqa: E402

TRACEFS = "/sys/kernel/tracing"
INSTANCE = os.path.join(TRACEFS, "instances", "lockstep-capture")
EVENTS = ["tcp/tcp_probe", "tcp/tcp_retransmit_skb", "tcp/tcp_cong_state_set"]


def build_sampler(build_dir: str) -> str:
    src = os.path.join(HERE, "tcpsample.c")
    out = os.path.join(build_dir, "tcpsample")
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(src):
        os.makedirs(build_dir, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-Wall", "-o", out, src], check=True)
    return out


def _w(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def trace_start(buffer_kb: int) -> None:
    if not os.path.isdir(os.path.join(TRACEFS, "events")):
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS], check=True)
    if os.path.isdir(INSTANCE):
        os.rmdir(INSTANCE)
    os.mkdir(INSTANCE)
    _w(os.path.join(INSTANCE, "trace_clock"), "mono")
    _w(os.path.join(INSTANCE, "buffer_size_kb"), str(buffer_kb))
    _w(os.path.join(INSTANCE, "events/tcp/tcp_probe/filter"), "family == 2")
    for ev in EVENTS:
        _w(os.path.join(INSTANCE, "events", ev, "enable"), "1")
    _w(os.path.join(INSTANCE, "tracing_on"), "1")


def trace_overruns() -> int:
    """Events the ring buffer overwrote (per_cpu/cpuN/stats "overrun"): the *oldest* ones, so a run that
    filled it has lost its first transfers -- raise --trace-buffer-kb or take fewer steps."""
    lost = 0
    per_cpu = os.path.join(INSTANCE, "per_cpu")
    for cpu in sorted(os.listdir(per_cpu)) if os.path.isdir(per_cpu) else []:
        with open(os.path.join(per_cpu, cpu, "stats")) as f:
            for line in f:
                if line.startswith("overrun:"):
                    lost += int(line.split()[1])
    return lost


def trace_stop(out: str) -> int:
    """Write the instance's events to ``out``; returns the number of events lost to overruns."""
    _w(os.path.join(INSTANCE, "tracing_on"), "0")
    lost = trace_overruns()
    with open(os.path.join(INSTANCE, "trace")) as f, open(out, "w") as g:
        for line in f:
            if line.startswith("#") or ("10.77.0." not in line and "tcp_probe" in line):
                continue
            g.write(line)
    for ev in EVENTS:
        _w(os.path.join(INSTANCE, "events", ev, "enable"), "0")
    os.rmdir(INSTANCE)
    return lost



def _await_listening(proc: subprocess.Popen, host: int, timeout_s: float = 30.0) -> None:
    """Wait until tcpdump says it is capturing ("tcpdump: listening on eth0, ..." on its stderr)."""
    import select

    deadline, seen = time.monotonic() + timeout_s, b""
    fd = proc.stderr.fileno()
    while b"listening on" not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise RuntimeError(f"tcpdump on host {host} did not start capturing in {timeout_s:.0f} s")
        chunk = os.read(fd, 4096)
        if not chunk:
            raise RuntimeError(f"tcpdump on host {host} exited ({proc.wait()}): {seen.decode(errors='replace')}")
        seen += chunk


def add_point_arguments(p: argparse.ArgumentParser, warmup: int = 2) -> None:
    """The realrun point a lab tool runs (its scenario, K, L, B, C, M, steps and warm-up): see realrun_args."""
    p.add_argument("--scenario", choices=["ring", "ps_sync", "ps_async"], required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--latency-ms", type=float, required=True)
    p.add_argument("--rate-mbit", type=float, required=True)
    p.add_argument("--compute-ms", type=float, default=20.0)
    p.add_argument("--model-bytes", default="1MB")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=warmup)


def realrun_args(a: argparse.Namespace, p2p_reps: int = 0, sysctls: list[str] | None = None) -> argparse.Namespace:
    """realrun's own arguments for the point of add_point_arguments."""
    return realrun.build_parser().parse_args(
        ["--scenario", a.scenario, "--workers", str(a.workers), "--latency-ms", str(a.latency_ms),
         "--rate-mbit", str(a.rate_mbit), "--compute-ms", str(a.compute_ms), "--model-bytes", a.model_bytes,
         "--steps", str(a.steps), "--warmup", str(a.warmup), "--p2p-reps", str(p2p_reps)]
        + [x for kv in (sysctls or []) for x in ("--sysctl", kv)])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_point_arguments(p)
    p.add_argument("--p2p-reps", type=int, default=0)
    p.add_argument("--sample-us", type=int, default=1000, help="tcpsample interval (0: no sampling)")
    p.add_argument("--sample-hosts", default="all", help="comma-separated host indices, or all")
    p.add_argument("--pcap-hosts", default="all", help="comma-separated host indices, all, or none")
    p.add_argument("--no-trace", action="store_true", help="no ftrace tcp_probe")
    p.add_argument("--trace-buffer-kb", type=int, default=131072,
                   help="ftrace buffer per CPU; 16 MB lost the first 2 s of a 10 MB ps_async run")
    p.add_argument("--sysctl", action="append", help="host sysctl KEY=VAL (repeatable)")
    p.add_argument("--out-dir", required=True)
    a = p.parse_args()

    from topology import Topology

    out_dir = os.path.abspath(a.out_dir)
    os.makedirs(out_dir, exist_ok=True)
    rr_args = realrun_args(a, a.p2p_reps, a.sysctl)
    K = a.workers
    world = K if a.scenario == "ring" else K + 1
    pick = (lambda s: list(range(world)) if s == "all" else [] if s == "none" else [int(x) for x in s.split(",")])
    sample_hosts, pcap_hosts = pick(a.sample_hosts), pick(a.pcap_hosts)
    pred = realrun.predictions(a.scenario, K, a.latency_ms, a.rate_mbit, a.compute_ms, rr_args.model_bytes)
    timeout = 90 + 6 * (a.warmup + a.steps) * max(pred.values()) + 3 * world
    run_dir = tempfile.mkdtemp(prefix="capture-")
    sampler = build_sampler(os.environ.get("REALRUN_BUILD_DIR") or os.path.expanduser("~/.cache/realrun"))
    sysctls = dict(kv.split("=", 1) for kv in (a.sysctl or []))
    topo = Topology(world, a.latency_ms, a.rate_mbit, host_sysctls=sysctls, run_dir=run_dir)
    helpers: list[subprocess.Popen] = []
    t_wall = time.time()
    load0 = open("/proc/loadavg").read().split()[:3]
    try:
        with topo:
            for h in pcap_hosts:
                helpers.append(subprocess.Popen(
                    ["ip", "netns", "exec", topo.host_ns(h), "tcpdump", "-i", "eth0", "-s", "128", "-n",
                     "-j", "adapter_unsynced", "--time-stamp-precision=nano", "-w",
                     os.path.join(out_dir, f"h{h}.pcap")],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=realrun._pdeathsig))
                _await_listening(helpers[-1], h)
            for h in (sample_hosts if a.sample_us > 0 else []):
                sp = subprocess.Popen(["ip", "netns", "exec", topo.host_ns(h), sampler, "--interval-us",
                                       str(a.sample_us), "--prefix", "10.77.0.", "--out",
                                       os.path.join(out_dir, f"tcpsample-h{h}.txt")],
                                      stdout=subprocess.PIPE, text=True, preexec_fn=realrun._pdeathsig)
                assert sp.stdout.readline().strip() == "READY"
                helpers.append(sp)
            lost = None
            if not a.no_trace:
                trace_start(a.trace_buffer_kb)
            offset = time.clock_gettime_ns(time.CLOCK_REALTIME) - time.clock_gettime_ns(time.CLOCK_MONOTONIC)
            try:
                out = realrun._run_workers(topo, rr_args, world, timeout, run_dir)
            finally:
                if not a.no_trace:
                    lost = trace_stop(os.path.join(out_dir, "probe.txt"))
                    if lost:
                        print(f"capture: warning: the trace buffer overflowed and lost the first {lost} tcp_probe "
                              f"events; raise --trace-buffer-kb (now {a.trace_buffer_kb}) or take fewer --steps",
                              file=sys.stderr)
                # the workers have exited, but their last ACKs may still be crossing the delay daemon (one-way
                # latency <= 10 ms here) and nothing says when they have arrived: give them a bounded moment
                time.sleep(0.3)
                for hp in helpers:  # by pid: SIGTERM makes tcpsample write its samples and tcpdump flush
                    hp.terminate()
                for hp in helpers:
                    hp.wait(timeout=30)
        rec = realrun.assemble(rr_args, K, world, pred, wall=time.time() - t_wall, **out)
    finally:
        for hp in helpers:
            if hp.poll() is None:
                hp.kill()
        shutil.rmtree(run_dir, ignore_errors=True)
    with open(os.path.join(out_dir, "record.json"), "w") as f:
        json.dump(rec, f)
    meta = {"hosts": {h: topo.host_ip(h) for h in range(world)}, "realtime_minus_mono_ns": offset,
            "loadavg_before": load0, "loadavg_after": open("/proc/loadavg").read().split()[:3],
            "argv": sys.argv[1:], "sample_us": a.sample_us, "trace_events_lost": lost,
            "priority": {"policy": os.sched_getscheduler(0), "rt_priority": os.sched_getparam(0).sched_priority,
                         "nice": os.getpriority(os.PRIO_PROCESS, 0)}, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"{a.scenario} K={K} L={a.latency_ms} B={a.rate_mbit} M={a.model_bytes}: median "
          f"{rec['median_s'] * 1e3:.1f} ms, steps {[round(t * 1e3, 1) for t in rec['step_times_s']]}, "
          f"updates/s {rec.get('updates_per_s')}, load {meta['loadavg_before']} -> {meta['loadavg_after']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

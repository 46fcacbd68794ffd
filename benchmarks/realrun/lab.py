#!/usr/bin/env python3
"""Instrumented microbenchmarks on the realrun testbed (how benchmarks/data/lab/*.jsonl were measured).

  python lab.py --scenario p2p_gaps --hosts 2 --latency-ms 10 --rate-mbit 1000 --args '{"M": 1000000, ...}' --out f.jsonl

Every process uses CLOCK_MONOTONIC (one machine), so cross-host times compare exactly.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REALRUN = os.environ.get("LOCKSTEP_REALRUN") or next(
    (p for p in (os.path.join(_ROOT, "..", "shared", "realrun"), os.path.join(_ROOT, "..", "..", "shared", "realrun"))
     if os.path.isfile(os.path.join(p, "realrun.py"))), "../shared/realrun")
sys.path.insert(0, REALRUN)
import realrun  # noqa: E402

MASTER_PORT = 29511


def now():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) / 1e9


def sleep_until(t):
    while True:
        d = t - now()
        if d <= 0:
            return
        time.sleep(min(d, 0.05) if d > 0.002 else d)


def tcp_info():
    try:
        return subprocess.run(["ss", "-tinH", "state", "established"], capture_output=True, text=True,
                              timeout=10).stdout
    except Exception as e:
        return repr(e)


def worker(a):
    import datetime
    import threading

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = a.rank, a.world
    P = json.loads(a.args)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
    dist.barrier()
    res = {"rank": rank}
    sc = a.scenario
    M = int(P.get("M", 1_000_000))
    numel = M // 4
    big = torch.zeros(numel)
    small = torch.zeros(1)
    if sc == "p2p_gaps":
        # rank0 -> rank1: per gap: warm transfer (+ack), sleep gap, timed transfer (+ack)
        gaps = P["gaps"]
        reps = P.get("reps", 1)
        warm = P.get("warm", 3)
        out = []
        if rank == 0:
            for _ in range(warm):
                dist.send(big, 1, tag=1)
                dist.recv(small, 1, tag=2)
            for rep in range(reps):
                for g in gaps:
                    dist.send(big, 1, tag=1)
                    dist.recv(small, 1, tag=2)
                    time.sleep(g)
                    t0 = now()
                    dist.send(big, 1, tag=1)
                    dist.recv(small, 1, tag=2)
                    out.append({"gap": g, "t0": t0, "t_ack": now()})
            res["sends"] = out
        elif rank == 1:
            recvs = []
            for _ in range(warm + 2 * reps * len(gaps)):
                dist.recv(big, 0, tag=1)
                recvs.append(now())
                dist.send(small, 0, tag=2)
            res["recvs"] = recvs
    elif sc in ("fanout", "incast"):
        # rank0 <-> ranks 1..K, M each, simultaneously; rounds separated by gap
        K = world - 1
        rounds = P.get("rounds", 6)
        gap = P.get("gap", 0.5)
        offsets = P.get("offsets", [0.0] * K)  # incast: start offset of each sender
        t_base = None
        rows = []
        if rank == 0:
            for rd in range(rounds):
                t_start = now() + 0.05 + (gap if rd else 0.0)
                # tell everyone the start time (tiny messages, before the gap ends)
                tt = torch.tensor([t_start], dtype=torch.float64)
                for w in range(1, K + 1):
                    dist.send(tt, w, tag=10)
                done = {}
                if sc == "fanout":
                    sleep_until(t_start)
                    t0 = now()
                    works = [dist.isend(big, w, tag=11) for w in range(1, K + 1)]
                    for wk in works:
                        wk.wait()
                    t_written = now()
                    acks = {}
                    for w in range(1, K + 1):
                        tw = torch.zeros(1, dtype=torch.float64)
                        dist.recv(tw, w, tag=12)
                        acks[w] = float(tw[0])
                    rows.append({"t0": t0, "t_written": t_written, "done": acks})
                else:
                    bufs = {w: torch.empty(numel) for w in range(1, K + 1)}
                    works = {w: dist.irecv(bufs[w], w, tag=13) for w in range(1, K + 1)}
                    ths = []
                    for w in range(1, K + 1):
                        def wt(w=w):
                            works[w].wait()
                            done[w] = now()
                        th = threading.Thread(target=wt)
                        th.start()
                        ths.append(th)
                    for th in ths:
                        th.join()
                    starts = {}
                    for w in range(1, K + 1):
                        tw = torch.zeros(1, dtype=torch.float64)
                        dist.recv(tw, w, tag=14)
                        starts[w] = float(tw[0])
                    rows.append({"t_start": t_start, "done": done, "starts": starts})
            res["rounds"] = rows
        else:
            for rd in range(rounds):
                tt = torch.zeros(1, dtype=torch.float64)
                dist.recv(tt, 0, tag=10)
                t_start = float(tt[0])
                if sc == "fanout":
                    buf = torch.empty(numel)
                    dist.recv(buf, 0, tag=11)
                    t = now()
                    dist.send(torch.tensor([t], dtype=torch.float64), 0, tag=12)
                else:
                    sleep_until(t_start + offsets[rank - 1])
                    t0 = now()
                    dist.send(big, 0, tag=13)
                    dist.send(torch.tensor([t0], dtype=torch.float64), 0, tag=14)
    elif sc == "ps_trace":
        # realrun's ps_sync with timestamps: PS isend params to 1..K, irecv grads (each waited in a thread)
        K = world - 1
        C = P.get("C", 0.02)
        steps = P.get("steps", 12)
        if rank == 0:
            params = torch.zeros(numel)
            grads = [torch.empty(numel) for _ in range(K)]
            rows = []
            for s in range(steps):
                t0 = now()
                sends = [dist.isend(params, dst=w) for w in range(1, K + 1)]
                recvs = [dist.irecv(grads[w - 1], src=w) for w in range(1, K + 1)]
                got = {}
                ths = []
                for w in range(1, K + 1):
                    def wt(w=w):
                        recvs[w - 1].wait()
                        got[w] = now()
                    th = threading.Thread(target=wt)
                    th.start()
                    ths.append(th)
                for r_ in sends:
                    r_.wait()
                tw = now()
                for th in ths:
                    th.join()
                acc = grads[0].clone()
                for g in grads[1:]:
                    acc.add_(g)
                params.add_(acc, alpha=-0.01 / K)
                rows.append({"t0": t0, "t_written": tw, "grad_done": got, "t_end": now()})
            res["rows"] = rows
        else:
            params = torch.empty(numel)
            grad = torch.ones(numel)
            rows = []
            for s in range(steps):
                t_post = now()
                dist.recv(params, src=0)
                t_got = now()
                time.sleep(C)
                t_send = now()
                dist.send(grad, dst=0)
                rows.append({"t_post": t_post, "t_got": t_got, "t_send": t_send, "t_sent": now()})
            res["rows"] = rows
    elif sc == "ps_async_trace":
        # realrun's asynchronous PS, its loop unchanged, with the time of each step of every update: the
        # arrival handed over by the worker's waiter thread, the gradient applied, the send buffer refilled
        # (after the previous reply to that worker), the reply's isend returned, the waiter released; the PS's
        # first isends (t_start) and, on each worker, its gradient's send called and returned and the reply received
        import queue
        K = world - 1
        C = P.get("C", 0.02)
        total = P.get("steps", 12)
        if rank == 0:
            params = torch.zeros(numel)
            grads = {w: torch.empty(numel) for w in range(1, K + 1)}
            sendbufs = {w: params.clone() for w in range(1, K + 1)}
            arrivals = queue.Queue()
            processed = {w: threading.Event() for w in range(1, K + 1)}
            recv_done = {}

            def waiter(w):
                for s in range(total):
                    dist.irecv(grads[w], src=w, tag=w).wait()
                    recv_done[w, s] = now()
                    arrivals.put((w, s))
                    processed[w].wait()
                    processed[w].clear()

            res["t_start"] = now()  # the first isends
            pending = {w: dist.isend(sendbufs[w], dst=w, tag=w) for w in range(1, K + 1)}
            threads = [threading.Thread(target=waiter, args=(w,), daemon=True) for w in range(1, K + 1)]
            for th in threads:
                th.start()
            rows = []
            for _ in range(K * total):
                w, s = arrivals.get()
                t_got = now()
                params.add_(grads[w], alpha=-0.01)
                t_applied = now()
                pending[w].wait()
                sendbufs[w].copy_(params)
                t_copied = now()
                pending[w] = dist.isend(sendbufs[w], dst=w, tag=w)
                t_sent = now()
                processed[w].set()
                rows.append({"w": w, "s": s, "t_recv": recv_done[w, s], "t_got": t_got, "t_applied": t_applied,
                             "t_copied": t_copied, "t_isend": t_sent, "t_set": now()})
            for r_ in pending.values():
                r_.wait()
            res["rows"] = rows
        else:
            params = torch.empty(numel)
            grad = torch.ones(numel)
            dist.recv(params, src=0, tag=rank)
            rows = [{"t_got": now()}]  # per step: the gradient's send called and returned, the reply received
            for s in range(total):
                time.sleep(C)
                t_send = now()
                dist.send(grad, dst=0, tag=rank)
                t_sent = now()
                dist.recv(params, src=0, tag=rank)
                rows.append({"t_send": t_send, "t_sent": t_sent, "t_got": now()})
            res["rows"] = rows
    elif sc == "ring_trace":
        # all_reduce after sleep(C); per-step times on every rank
        C = P.get("C", 0.02)
        steps = P.get("steps", 12)
        ts = []
        model = torch.zeros(numel)
        for s in range(steps):
            time.sleep(C)
            t0 = now()
            dist.all_reduce(model)
            ts.append((t0, now()))
        res["ar"] = ts
    res["ss"] = tcp_info()
    dist.barrier()
    dist.destroy_process_group()
    with open(a.outfile, "w") as f:
        json.dump(res, f)


def orchestrate(a):
    from topology import Topology

    run_dir = tempfile.mkdtemp(prefix="lab-")
    sysctls = dict(kv.split("=", 1) for kv in (a.sysctl or []))
    topo = Topology(a.hosts, a.latency_ms, a.rate_mbit, host_sysctls=sysctls, run_dir=run_dir,
                    gso_max_size=a.gso_max_size)
    with topo:
        dumps = []
        for h in (a.pcap or []):
            dumps.append(subprocess.Popen(["ip", "netns", "exec", topo.host_ns(h), "tcpdump", "-i", "eth0", "-s", "120",
                                           "-j", "adapter_unsynced", "--time-stamp-precision=nano", "-w",
                                           os.path.join(os.path.abspath(a.pcap_dir), f"h{h}.pcap")],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          preexec_fn=realrun._pdeathsig))
        time.sleep(0.5 if dumps else 0)
        procs = []
        for r in range(a.hosts):
            env = dict(os.environ)
            env.update({"MASTER_ADDR": topo.host_ip(0), "MASTER_PORT": str(MASTER_PORT), "GLOO_SOCKET_IFNAME": "eth0",
                        "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
            cmd = ["ip", "netns", "exec", topo.host_ns(r), sys.executable, os.path.abspath(__file__), "_w",
                   "--rank", str(r), "--world", str(a.hosts), "--scenario", a.scenario, "--args", a.args,
                   "--outfile", os.path.join(run_dir, f"r{r}.json")]
            procs.append(subprocess.Popen(cmd, env=env, stdout=open(os.path.join(run_dir, f"r{r}.log"), "w"),
                                          stderr=subprocess.STDOUT, preexec_fn=realrun._pdeathsig))
        deadline = time.time() + a.timeout
        try:
            while True:
                codes = [p.poll() for p in procs]
                if any(c not in (None, 0) for c in codes):
                    raise RuntimeError(f"rank failed: {codes}\n" + open(os.path.join(run_dir, "r0.log")).read()[-2000:]
                                       + open(os.path.join(run_dir, "r1.log")).read()[-2000:])
                if all(c == 0 for c in codes):
                    break
                if time.time() > deadline:
                    raise RuntimeError("timeout")
                time.sleep(0.1)
        finally:
            realrun._stop(procs)
            time.sleep(0.3 if dumps else 0)
            for d in dumps:
                d.terminate()
                d.wait(timeout=10)
        dstats = topo.stop_delayd()
    ranks = [json.load(open(os.path.join(run_dir, f"r{r}.json"))) for r in range(a.hosts)]
    rec = {"scenario": a.scenario, "hosts": a.hosts, "L_ms": a.latency_ms, "B_mbit": a.rate_mbit,
           "args": json.loads(a.args), "sysctl": sysctls, "ranks": ranks, "delayd": dstats,
           "loadavg": open("/proc/loadavg").read().split()[:3], "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with open(a.out, "a") as f:
        f.write(json.dumps(rec) + "\n")
    return rec


def main():
    if sys.argv[1:2] == ["_w"]:
        p = argparse.ArgumentParser()
        for n, t in (("--rank", int), ("--world", int), ("--scenario", str), ("--args", str), ("--outfile", str)):
            p.add_argument(n, type=t, required=True)
        return worker(p.parse_args(sys.argv[2:]))
    p = argparse.ArgumentParser()
    p.add_argument("--scenario", required=True)
    p.add_argument("--hosts", type=int, default=2)
    p.add_argument("--latency-ms", type=float, default=1.0)
    p.add_argument("--rate-mbit", type=float, default=1000.0)
    p.add_argument("--args", default="{}")
    p.add_argument("--sysctl", action="append")
    p.add_argument("--gso-max-size", type=int, default=65536)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", required=True)
    p.add_argument("--pcap", type=int, action="append")
    p.add_argument("--pcap-dir", default=".")
    a = p.parse_args()
    rec = orchestrate(a)
    print(json.dumps({k: v for k, v in rec.items() if k != "ranks"})[:500])


if __name__ == "__main__":
    main()

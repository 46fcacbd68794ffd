"""``lockstep measure``: real torch.distributed (gloo) microbenchmarks between processes, as RESULTS.jsonl.

The same scenarios as ``../shared/realrun`` and the format ``lockstep calibrate`` and
``lockstep validate`` read (controller/results.py):

* ``p2p`` — rank 0 → rank 1: a tiny ping-pong (round trip ``p2p.rtt_small_s``) and
  ``M`` bytes plus a tiny ack (``median_s`` = median − half the round trip ≈ L + M/B_eff);
* ``fanin`` — K senders → rank 0 at once after a barrier: time until the last arrives;
* ``ring`` — ``sleep(C)``; ``all_reduce`` (gloo's ring); divide: step times on rank 0;
* ``ps_sync`` — K workers + PS (rank 0): isend params, irecv gradients, average, apply;
* ``ps_async`` — K workers + PS applying each gradient on arrival, replying to its sender.

With ``launcher=local`` (this machine) the ranks are subprocesses on loopback; on a
cluster, start one ``lockstep measure --worker ...`` per pod with the kubernetes
launcher's pod template (docs/engine.md, "Measuring a cluster"). A record's ``L_ms`` and
``B_mbit`` describe the network the ranks talked over: ``--latency-ms``/``--rate-mbit``
when given (a cluster's NIC), else what the p2p benchmark shows (loopback: L = 0 and B
the rate that gives the measured bulk goodput).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["main", "worker_main", "run_scenario"]

GOODPUT = 1448 / 1538  # TCP payload per wire byte on Ethernet (docs/engine.md): B_eff = GOODPUT x line rate


def hystart_detect(sysctl: Path = Path("/proc/sys/net/ipv4"),
                   params: Path = Path("/sys/module/tcp_cubic/parameters")) -> int | None:
    """Which of CUBIC's HyStart detections this host runs, as results files record it (``hystart_detect``:
    0 off, 1 ACK train, 2 delay, 3 both), or None where its congestion control is not CUBIC or the module's
    parameters cannot be read."""
    try:
        if (sysctl / "tcp_congestion_control").read_text().strip() != "cubic":
            return None
        on, detect = int((params / "hystart").read_text()), int((params / "hystart_detect").read_text())
    except (OSError, ValueError):
        return None
    return detect & 3 if on else 0


def _now() -> float:
    return time.perf_counter()


# ------------------------------------------------------------------ one rank
def worker_main(a: argparse.Namespace) -> int:
    import threading
    import queue

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world = a.rank, a.world
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=a.timeout))
    numel = max(1, a.model_bytes // 4)
    C = a.compute_ms / 1e3
    total = a.warmup + a.steps
    res: dict[str, Any] = {"rank": rank}
    dist.barrier()
    times: list[float] = []
    if a.scenario == "p2p":
        small, big = torch.zeros(1), torch.zeros(numel)
        rtts, bigs = [], []
        if rank in (0, 1):
            for _ in range(total):
                if rank == 0:
                    t0 = _now()
                    dist.send(small, 1)
                    dist.recv(small, 1)
                    t1 = _now()
                    dist.send(big, 1)
                    dist.recv(small, 1)
                    rtts.append(t1 - t0)
                    bigs.append(_now() - t1)
                else:
                    dist.recv(small, 0)
                    dist.send(small, 0)
                    dist.recv(big, 0)
                    dist.send(small, 0)
                time.sleep(0.05)
        if rank == 0:
            rtt = statistics.median(rtts[a.warmup:])
            # each transfer less half the least disturbed round trip: on a busy host a median ping can take
            # longer than a short bulk transfer's whole exchange, and even the fastest ping longer than the
            # fastest exchange (which holds a one-way ack too), so the ack is never taken for more than half
            # of that exchange: every transfer time stays > 0
            least = min(min(rtts[a.warmup:]), min(bigs[a.warmup:]))
            times = [b - least / 2 for b in bigs]
            # the goodput: the payload's bits over the exchange less the least disturbed round trip (the same
            # guard: a median ping may take longer than the median exchange); None when the exchange took no
            # longer than that round trip, so no rate can be read from it (lockstep measure then says so)
            serial = statistics.median(bigs[a.warmup:]) - least
            res["p2p"] = {"rtt_small_s": rtt, "rtt_small_all_s": rtts, "send_plus_ack_s": bigs,
                          "transfer_s": statistics.median(times[a.warmup:]),
                          "eff_mbit": numel * 32 / serial / 1e6 if serial > 0 else None}
    elif a.scenario == "fanin":
        buf = torch.zeros(numel)
        for _ in range(total):
            if rank == 0:
                bufs = [torch.empty(numel) for _ in range(world - 1)]
                works = [dist.irecv(bufs[w - 1], w) for w in range(1, world)]
                dist.barrier()
                t0 = _now()
                for wk in works:
                    wk.wait()
                times.append(_now() - t0)
            else:
                dist.barrier()
                dist.send(buf, 0)
            dist.barrier()
    elif a.scenario == "ring":
        model = torch.zeros(numel)
        t_prev = _now()
        for s in range(total):
            time.sleep(C)
            dist.all_reduce(model)
            model.div_(world)
            t = _now()
            times.append(t - t_prev)
            t_prev = t
    elif a.scenario == "ps_sync":
        K = world - 1
        if rank == 0:
            params = torch.zeros(numel)
            grads = [torch.empty(numel) for _ in range(K)]
            avg = []
            t_prev = _now()
            for s in range(total):
                sends = [dist.isend(params, w) for w in range(1, K + 1)]
                recvs = [dist.irecv(grads[w - 1], w) for w in range(1, K + 1)]
                for r in sends + recvs:
                    r.wait()
                ta = _now()
                acc = grads[0].clone()
                for g in grads[1:]:
                    acc.add_(g)
                params.add_(acc, alpha=-0.01 / K)
                avg.append(_now() - ta)
                t = _now()
                times.append(t - t_prev)
                t_prev = t
            res["ps_average_s_median"] = statistics.median(avg[a.warmup:])
        else:
            params, grad = torch.empty(numel), torch.ones(numel)
            for s in range(total):
                dist.recv(params, 0)
                time.sleep(C)
                dist.send(grad, 0)
    elif a.scenario == "ps_async":
        K = world - 1
        if rank == 0:
            params = torch.zeros(numel)
            grads = {w: torch.empty(numel) for w in range(1, K + 1)}
            sendbufs = {w: params.clone() for w in range(1, K + 1)}
            arrivals: queue.Queue = queue.Queue()
            processed = {w: threading.Event() for w in range(1, K + 1)}

            def waiter(w: int) -> None:
                for s in range(total):
                    dist.irecv(grads[w], w, tag=w).wait()
                    arrivals.put((w, s))
                    processed[w].wait()
                    processed[w].clear()

            pending = {w: dist.isend(sendbufs[w], w, tag=w) for w in range(1, K + 1)}
            threads = [threading.Thread(target=waiter, args=(w,), daemon=True) for w in range(1, K + 1)]
            for th in threads:
                th.start()
            updates = []
            for _ in range(K * total):
                w, s = arrivals.get(timeout=a.timeout)
                params.add_(grads[w], alpha=-0.01)
                updates.append((_now(), w, s))
                pending[w].wait()
                sendbufs[w].copy_(params)
                pending[w] = dist.isend(sendbufs[w], w, tag=w)
                processed[w].set()
            for r in pending.values():
                r.wait()
            last = {}
            for t_u, w, s in updates:
                last[w] = t_u
            t_end = min(last.values())
            meas = [u for u in updates if u[2] >= a.warmup and u[0] <= t_end]
            if len(meas) < 3:  # uneven workers left too short a common window: every update after warm-up
                meas = [u for u in updates if u[2] >= a.warmup]
            res["updates_per_s"] = (len(meas) - 1) / (meas[-1][0] - meas[0][0])
        else:
            params, grad = torch.empty(numel), torch.ones(numel)
            dist.recv(params, 0, tag=rank)
            for s in range(total):
                time.sleep(C)
                dist.send(grad, 0, tag=rank)
                dist.recv(params, 0, tag=rank)
    else:
        raise ValueError(f"unknown scenario {a.scenario!r}")
    res["step_times_s"] = times[a.warmup:]
    h = hystart_detect()
    if h is not None:
        res["hystart_detect"] = h
    dist.barrier()
    dist.destroy_process_group()
    Path(a.outfile).write_text(json.dumps(res))
    return 0


# -------------------------------------------------------------- orchestrator
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_scenario(scenario: str, K: int, model_bytes: int, compute_ms: float, steps: int, warmup: int,
                 timeout: float = 600.0) -> dict[str, Any]:
    """Run one scenario with local subprocesses on loopback; return rank 0's result (and the world size)."""
    world = {"p2p": 2, "ring": K}.get(scenario, K + 1)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="lockstep-measure-") as d:
        procs = []
        try:
            for r in range(world):
                env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo",
                           OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
                cmd = [sys.executable, "-m", "controller.measure", "--worker", "--rank", str(r), "--world", str(world),
                       "--scenario", scenario, "--model-bytes", str(model_bytes), "--compute-ms", str(compute_ms),
                       "--steps", str(steps), "--warmup", str(warmup), "--timeout", str(int(timeout)),
                       "--outfile", os.path.join(d, f"rank{r}.json")]
                log = open(os.path.join(d, f"rank{r}.log"), "w")
                procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                               cwd=str(Path(__file__).resolve().parent.parent)), log))
            deadline = time.monotonic() + timeout
            for p, _ in procs:
                left = max(1.0, deadline - time.monotonic())
                rc = p.wait(timeout=left)
                if rc != 0:
                    tail = Path(d, f"rank{procs.index((p, _))}.log").read_text()[-1500:]
                    raise RuntimeError(f"measure {scenario}: a rank exited with status {rc}:\n{tail}")
        finally:
            for p, log in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
                log.close()
        out = json.loads(Path(d, "rank0.json").read_text())
    out["world"] = world
    return out


def _record(scenario: str, K: int, L_ms: float, B_mbit: float, M: int, C_ms: float, N: int, warmup: int,
            r0: dict[str, Any]) -> dict[str, Any]:
    rec: dict[str, Any] = {"scenario": scenario, "K": K, "L_ms": L_ms, "B_mbit": B_mbit, "M_bytes": M,
                           "C_ms": C_ms, "N": N, "warmup": warmup, "world_size": r0["world"],
                           "step_times_s": r0["step_times_s"], "source": "lockstep measure (launcher=local)",
                           "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if scenario == "ps_async":
        rec["updates_per_s"] = r0["updates_per_s"]
    else:
        rec["median_s"] = statistics.median(r0["step_times_s"])
    for key in ("p2p", "ps_average_s_median", "hystart_detect"):
        if key in r0:
            rec[key] = r0[key]
    return rec


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="lockstep measure", description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="measure.jsonl", help="append the records here (default: measure.jsonl)")
    ap.add_argument("--scenarios", default="p2p,ring,ps_sync,ps_async",
                    help="comma-separated: p2p, fanin, ring, ps_sync, ps_async")
    ap.add_argument("--workers", type=int, default=2, help="K (ring members, PS workers, fan-in senders)")
    ap.add_argument("--model-bytes", type=int, default=1_000_000, help="M, bytes")
    ap.add_argument("--compute-ms", type=float, default=20.0, help="C, slept per step")
    ap.add_argument("--steps", type=int, default=10, help="N measured steps (or repetitions)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--latency-ms", type=float, default=None, help="L to record (default: 0 on loopback)")
    ap.add_argument("--rate-mbit", type=float, default=None,
                    help="line rate B to record (default: from the p2p goodput)")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--collect", default=None, metavar="RANK0.json",
                    help="turn rank 0's --outfile of a run started elsewhere (pods) into a record of --scenario")
    ap.add_argument("--worker", action="store_true", help="run one rank (MASTER_ADDR/MASTER_PORT set): a pod's command")
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--scenario", help=argparse.SUPPRESS)
    ap.add_argument("--outfile", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return worker_main(a)
    from controller.outputs import unwritable

    why = unwritable(a.out)  # before measuring, not after: the records would be lost
    if why:
        print(f"lockstep measure: --out {a.out}: {why}; accepted: a file to append the records to.", file=sys.stderr)
        return 2
    if a.collect:
        if a.scenario not in ("p2p", "fanin", "ring", "ps_sync", "ps_async") or a.rate_mbit is None:
            print("lockstep measure: --collect needs --scenario (p2p | fanin | ring | ps_sync | ps_async) and "
                  "--rate-mbit (the NICs' line rate).", file=sys.stderr)
            return 2
        try:
            r0 = json.loads(Path(a.collect).read_text())
            if not isinstance(r0, dict):
                raise ValueError(f"a JSON {type(r0).__name__}, not an object")
        except (OSError, ValueError) as e:
            why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            print(f"lockstep measure: --collect {a.collect}: {why}; accepted: rank 0's --outfile (a JSON object).",
                  file=sys.stderr)
            return 2
        r0.setdefault("world", a.world or (2 if a.scenario == "p2p" else a.workers + (a.scenario != "ring")))
        rec = _record(a.scenario, 1 if a.scenario == "p2p" else a.workers, a.latency_ms or 0.0, a.rate_mbit,
                      a.model_bytes, a.compute_ms, a.steps, a.warmup, r0)
        rec["source"] = "lockstep measure --collect"
        with open(a.out, "a") as f:
            f.write(json.dumps(rec) + "\n")
        return 0
    scens = a.scenarios.split(",")
    bad = [s for s in scens if s not in ("p2p", "fanin", "ring", "ps_sync", "ps_async")]
    for name, v, lo in (("--workers", a.workers, 1), ("--model-bytes", a.model_bytes, 4), ("--steps", a.steps, 1),
                        ("--warmup", a.warmup, 0)):
        if v < lo or (name == "--model-bytes" and v % 4):
            print(f"lockstep measure: {name}={v} is not valid; accepted: an integer >= {lo}"
                  f"{', a multiple of 4 (float32 elements)' if name == '--model-bytes' else ''}.", file=sys.stderr)
            return 2
    if bad:
        print(f"lockstep measure: --scenarios={bad[0]!r} is not valid; accepted: p2p, fanin, ring, ps_sync, "
              f"ps_async.", file=sys.stderr)
        return 2
    if a.compute_ms < 0 or (a.latency_ms is not None and a.latency_ms < 0) or (
            a.rate_mbit is not None and a.rate_mbit <= 0) or not a.timeout > 0:
        print("lockstep measure: --compute-ms and --latency-ms must be >= 0, --rate-mbit and --timeout > 0.",
              file=sys.stderr)
        return 2
    p2p = run_scenario("p2p", 1, a.model_bytes, 0.0, a.steps, a.warmup, a.timeout)
    if a.rate_mbit is None and not p2p["p2p"]["eff_mbit"]:
        print(f"lockstep measure: sending {a.model_bytes} bytes took no longer than a round trip of a small message "
              "here, so the line rate cannot be read from it; give --rate-mbit (the NICs' line rate) or a larger "
              "--model-bytes.", file=sys.stderr)
        return 2
    rate = a.rate_mbit if a.rate_mbit is not None else round(p2p["p2p"]["eff_mbit"] / GOODPUT, 3)
    lat = a.latency_ms if a.latency_ms is not None else 0.0
    records = []
    for scen in scens:
        r0 = p2p if scen == "p2p" else run_scenario(scen, a.workers, a.model_bytes, a.compute_ms, a.steps,
                                                     a.warmup, a.timeout)
        K = 1 if scen == "p2p" else a.workers
        records.append(_record(scen, K, lat, rate, a.model_bytes, 0.0 if scen in ("p2p", "fanin") else a.compute_ms,
                               a.steps, a.warmup, r0))
        m = records[-1].get("median_s") or records[-1].get("updates_per_s")
        print(f"lockstep measure: {scen} K={K} M={a.model_bytes} B: {m:.6g} "
              f"{'updates/s' if scen == 'ps_async' else 's'}", file=sys.stderr)
    with open(a.out, "a") as f:
        for rec in records:
            f.write(json.dumps(rec) + "\n")
    print(f"lockstep measure: {len(records)} records appended to {a.out} (L={lat:g} ms, B={rate:g} Mbit/s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":  # the ranks: python -m controller.measure --worker ...
    sys.exit(main(sys.argv[1:]))

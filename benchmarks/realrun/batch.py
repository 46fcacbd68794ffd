#!/usr/bin/env python3
"""Run realrun points one by one, each when the machine is quiet enough (1-min loadavg below a bound).

  python batch.py POINTS.json OUT.jsonl [--max-load 2.0] [--max-wait 900] [--repeat N] [--hystart-detect D]

POINTS.json: a list of dicts {scenario, workers, latency_ms, rate_mbit, model_bytes, compute_ms?, steps?}.
Points already in OUT.jsonl (same scenario, K, L, B, M, C) are skipped, so the batch can be resumed.
``--hystart-detect D`` runs the batch with CUBIC's HyStart detections D (0 off, 1 ACK train, 2 delay, 3 both:
the ``tcp_cubic`` module's ``hystart`` and ``hystart_detect`` parameters, global to the machine, so root and
nothing else measuring meanwhile), puts the previous values back at the end, and records D in every line
(``hystart_detect``, which ``lockstep validate`` emulates).
"""
import argparse
import json
import os
import sys
import time
import traceback

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REALRUN = os.environ.get("LOCKSTEP_REALRUN") or next(
    (p for p in (os.path.join(_ROOT, "..", "shared", "realrun"), os.path.join(_ROOT, "..", "..", "shared", "realrun"))
     if os.path.isfile(os.path.join(p, "realrun.py"))), "../shared/realrun")
sys.path.insert(0, REALRUN)
import realrun  # noqa: E402


def key(scen, K, L, B, M, C):
    return (scen, int(K), float(L), float(B), int(M), float(C))


def load1():
    return float(open("/proc/loadavg").read().split()[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("points")
    ap.add_argument("out")
    ap.add_argument("--max-load", type=float, default=2.0)
    ap.add_argument("--max-wait", type=float, default=900)
    ap.add_argument("--repeat", type=int, default=1, help="measurements per point")
    ap.add_argument("--hystart-detect", type=int, choices=(0, 1, 2, 3), default=None,
                    help="CUBIC's HyStart detections during the batch (0 off, 1 ACK train, 2 delay, 3 both)")
    a = ap.parse_args()
    if a.hystart_detect is None:
        return run_batch(a)
    before = {n: open(os.path.join(CUBIC, n)).read().strip() for n in ("hystart", "hystart_detect")}
    try:
        _set_cubic("hystart", 1 if a.hystart_detect else 0)
        if a.hystart_detect:
            _set_cubic("hystart_detect", a.hystart_detect)
        return run_batch(a)
    finally:
        for n, v in before.items():
            _set_cubic(n, v)


CUBIC = "/sys/module/tcp_cubic/parameters"


def _set_cubic(name, value):
    with open(os.path.join(CUBIC, name), "w") as f:
        f.write(f"{value}\n")


def run_batch(a):
    pts = json.load(open(a.points))
    have = {}
    if os.path.exists(a.out):
        for line in open(a.out):
            r = json.loads(line)
            if r.get("hystart_detect", 3) != (3 if a.hystart_detect is None else a.hystart_detect):
                continue  # measured with other HyStart detections: another configuration
            k = key(r["scenario"], r["K"], r["L_ms"], r["B_mbit"], r["M_bytes"], r["C_ms"])
            have[k] = have.get(k, 0) + 1
    for i, p in enumerate(pts):
        C = p.get("compute_ms", 20.0)
        k = key(p["scenario"], p["workers"], p["latency_ms"], p["rate_mbit"], p["model_bytes"], C)
        if have.get(k, 0) >= a.repeat:
            continue
        t0 = time.time()
        while load1() > a.max_load and time.time() - t0 < a.max_wait:
            time.sleep(5)
        la = open("/proc/loadavg").read().split()[:3]
        argv = ["--scenario", p["scenario"], "--workers", str(p["workers"]), "--latency-ms", str(p["latency_ms"]),
                "--rate-mbit", str(p["rate_mbit"]), "--compute-ms", str(C), "--model-bytes", str(p["model_bytes"]),
                "--steps", str(p.get("steps", 10)), "-q"]
        args = realrun.build_parser().parse_args(argv)
        ts = time.time()
        try:
            rec = realrun.run_one(args, verbose=False)  # no --out: the record is written here, with the setting
            if a.hystart_detect is not None:
                rec["hystart_detect"] = a.hystart_detect
            with open(a.out, "a") as f:
                f.write(json.dumps(rec) + "\n")
            extra = f" ups={rec['updates_per_s']:.2f}" if rec.get("updates_per_s") else ""
            print(f"[{i + 1}/{len(pts)}] {p['scenario']:8s} K={p['workers']} L={p['latency_ms']} B={p['rate_mbit']} "
                  f"M={p['model_bytes']} C={C} median {rec['median_s'] * 1e3:.1f} ms{extra} "
                  f"cpu {rec['cpu_busy_frac']:.2f} "
                  f"load-before {la} took {time.time() - ts:.0f}s waited {ts - t0:.0f}s", flush=True)
        except KeyboardInterrupt:
            raise
        except Exception as e:
            print(f"[{i + 1}/{len(pts)}] FAILED {p}: {e}", flush=True)
            traceback.print_exc()


if __name__ == "__main__":
    main()

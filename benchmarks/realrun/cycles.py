#!/usr/bin/env python3
"""The asynchronous PS's cycle, on the testbed and in the model.

  python benchmarks/realrun/cycles.py benchmarks/data/lab/ps_async-cycles.jsonl
  python benchmarks/realrun/cycles.py --emulate RESULTS.jsonl K L_MS B_MBIT M_BYTES [--seeds N] [override ...]

The first form reads ``lab.py --scenario ps_async_trace`` records (one line per run). Per run it prints the
updates/s realrun would count (worker steps >= 2, up to the first worker's last update), the updates each
worker made in that window, when each worker's first parameters arrived (ms after the PS's first ``isend``),
and the quartiles and mean (ms) of the downloads (the PS's ``isend`` of a reply to the worker's receive
returning) and of the uploads (the worker's ``send`` called to the PS's receive done).

``--emulate`` runs the ps_async point of RESULTS.jsonl with those K, L, B, M as ``lockstep validate`` does
(``network=tcp strategy.collective=gloo``, ``seed=0`` … ``N-1``, then the overrides, with ``trace.mode=full``)
and prints the same per seed: the first downloads in ms of virtual time (to 0.01 ms), the transfers from the
data's send to its delivery (every parameter and gradient message of at least half of M) — a diagnostic, not a
test (docs/benchmarks.md, "How many runs and seeds a point needs"), and the window at which each of the PS's
downlinks and the workers' uplinks left its first slow start ("exits", ``_Sender.on_ack`` observed).

Both forms: ``--from-step S`` keeps the transfers of worker steps >= S only (the steady state), and each line
ends with every worker's mean cycle (ms between its updates, steps >= S); ``--steps`` also prints each worker's
cycles one by one.
"""
from __future__ import annotations

import argparse
import json
import statistics as st
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

WARMUP, STEPS = 2, 12  # realrun's and lab.py's defaults


def q(a: list[float]) -> list[float]:
    return [round(x, 1) for x in st.quantiles(a, n=4)] if len(a) > 1 else a


def window(ups: list[tuple[float, object, int]]) -> tuple[float, list[int]]:
    """realrun's count: updates of worker steps >= WARMUP up to the first worker's last update."""
    last: dict = {}
    for t, w, _ in ups:
        last[w] = t
    t_end = min(last.values())
    meas = [u for u in ups if u[2] >= WARMUP and u[0] <= t_end]
    count: dict = {}
    for _, w, _ in meas:
        count[w] = count.get(w, 0) + 1
    return (len(meas) - 1) / (meas[-1][0] - meas[0][0]), sorted(count.values(), reverse=True)


def line(head: str, rate: float, counts: list[int], firsts: dict, down: list[float], up: list[float],
         cycles: dict) -> str:
    cycle = ", ".join(f"{w}: {st.mean(c):.1f}" for w, c in cycles.items())
    return (f"{head}rate {rate:.2f} counts {counts} firsts {firsts} down q {q(down)} mean {st.mean(down):.1f} "
            f"up q {q(up)} mean {st.mean(up):.1f} cycle {{{cycle}}}")


def worker_cycles(ups: list[tuple[float, object, int]], from_step: int) -> dict:
    """ms between a worker's updates, from its step ``from_step`` on, by worker."""
    by: dict = {}
    for t, w, s in sorted(ups, key=lambda u: u[0]):
        by.setdefault(w, []).append((s, t))
    return {w: [(b - a) * 1e3 for (s, a), (_, b) in zip(v, v[1:]) if s >= from_step] for w, v in sorted(by.items())}


def print_steps(cycles: dict) -> None:
    for w, c in cycles.items():
        print(f"   {w}: " + " ".join(f"{x:.1f}" for x in c))


def from_trace(path: str, from_step: int = 0, steps: bool = False) -> None:
    for text in open(path):
        r = json.loads(text)
        ps = r["ranks"][0]
        t0, rows, K = ps["t_start"], ps["rows"], len(r["ranks"]) - 1
        isend = {(x["w"], x["s"]): x["t_isend"] for x in rows}
        recv = {(x["w"], x["s"]): x["t_recv"] for x in rows}
        down, up = [], []
        for w in range(1, K + 1):
            wr = r["ranks"][w]["rows"]
            for s in range(len(wr) - 1):
                if s >= max(1, from_step):
                    down.append((wr[s]["t_got"] - isend[(w, s - 1)]) * 1e3)
                if s >= from_step:
                    up.append((recv[(w, s)] - wr[s + 1]["t_send"]) * 1e3)
        ups = [(x["t_got"], x["w"], x["s"]) for x in rows]
        rate, counts = window(sorted(ups))
        firsts = {w: round((r["ranks"][w]["rows"][0]["t_got"] - t0) * 1e3) for w in range(1, K + 1)}
        cycles = worker_cycles(ups, from_step)
        print(line(f"{r.get('priority', '')} ", rate, counts, firsts, down, up, cycles))
        if steps:
            print_steps(cycles)


def emulate(results: str, K: int, L_ms: float, B_mbit: float, M: int, seeds: int, overrides: list[str],
            from_step: int = 0, steps: bool = False) -> None:
    from agents.sim import tcp
    from controller.results import load_results
    from controller.validate import observed_updates, point_config

    exits: dict = {}
    on_ack = tcp._Sender.on_ack

    def observed_on_ack(self, ack_seq, tsent):  # the window of each connection's first slow-start exit
        before = self.ssthresh
        on_ack(self, ack_seq, tsent)
        if self.ssthresh != before:
            exits.setdefault((self.host.worker.id, self.dst), self.ssthresh)

    tcp._Sender.on_ack = observed_on_ack

    p = next((p for p in load_results(results, ("ps_async",))
              if (p.K, p.L_s, p.B_bps, p.M_bytes) == (K, L_ms / 1e3, B_mbit * 1e6, M)), None)
    if p is None:
        sys.exit(f"cycles.py: {results} has no ps_async point K={K} L={L_ms}ms B={B_mbit}Mbit/s M={M}")
    for seed in range(seeds):
        rc = point_config(p, ["network=tcp", "strategy.collective=gloo", f"seed={seed}", *overrides,
                              "trace.mode=full"])
        exits.clear()
        with tempfile.TemporaryDirectory() as d:
            updates = observed_updates(rc, Path(d))
            events = json.loads((Path(d) / "trace.json").read_text())["traceEvents"]
        done: dict = {}
        tagged = []
        for t, w in updates:
            done[w] = done.get(w, 0) + 1
            if done[w] <= STEPS:
                tagged.append((t / 1e9, w, done[w] - 1))
        rate, counts = window(tagged)
        big = [e for e in events if e.get("ph") == "X" and e.get("cat") == "ingress"
               and e.get("args", {}).get("bytes", 0) >= M / 2]
        ends = sorted(((e["ts"] + e["dur"]) / 1e3, e["args"]) for e in big)
        nth: dict = {}  # a message's step: its place among the messages of its connection
        down, up = [], []
        for t, a in ends:
            s = nth[a["src"], a["dst"]] = nth.get((a["src"], a["dst"]), -1) + 1
            if s >= from_step:
                (down if a["src"] == "ps0" else up).append(t - a["sent_ns"] / 1e6)
        firsts: dict = {}
        for t, a in sorted(ends, key=lambda x: x[0]):
            if a["src"] == "ps0":
                firsts.setdefault(a["dst"], round(t, 2))
        cycles = worker_cycles(tagged, from_step)
        names = {**{i: f"w{i}" for i in range(K)}, K: "ps0"}  # vworker ids: the workers, then the PS
        print(line(f"seed {seed} ", rate, counts, firsts, down, up, cycles)
              + " exits {" + ", ".join(f"{names.get(a, a)}->{names.get(b, b)}: {w}"
                                      for (a, b), w in sorted(exits.items())) + "}", flush=True)
        if steps:
            print_steps(cycles)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", nargs="?", help="lab.py ps_async_trace records")
    ap.add_argument("--emulate", nargs=5, metavar=("RESULTS", "K", "L_MS", "B_MBIT", "M_BYTES"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--from-step", type=int, default=0, help="transfers and cycles of worker steps >= this only")
    ap.add_argument("--steps", action="store_true", help="print every worker's cycles one by one")
    a, overrides = ap.parse_known_args(argv)
    if a.emulate:
        if a.trace is not None:  # the positional took the first override
            overrides.insert(0, a.trace)
        r, K, L, B, M = a.emulate
        emulate(r, int(K), float(L), float(B), int(float(M)), a.seeds, overrides, a.from_step, a.steps)
    elif a.trace:
        from_trace(a.trace, a.from_step, a.steps)
    else:
        ap.error("give lab.py ps_async_trace records, or --emulate")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

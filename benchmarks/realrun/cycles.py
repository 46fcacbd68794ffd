#!/usr/bin/env python3
"""The asynchronous PS's cycle, from ``lab.py --scenario ps_async_trace`` records (one line per run).

  python benchmarks/realrun/cycles.py benchmarks/data/lab/ps_async-cycles.jsonl

Per run: the updates/s realrun would count (worker steps >= 2, up to the first worker's last update), the
updates each worker made in that window, when each worker's first parameters arrived (ms after the PS's
first ``isend``), and the quartiles and mean (ms) of the downloads (the PS's ``isend`` of a reply to the
worker's receive returning) and of the uploads (the worker's ``send`` called to the PS's receive done)
(docs/benchmarks.md, "How many runs and seeds a point needs").
"""
import json
import statistics as st
import sys


def q(a):
    return [round(x, 1) for x in st.quantiles(a, n=4)] if len(a) > 1 else a


for l in open(sys.argv[1]):
    r = json.loads(l)
    ps = r['ranks'][0]; t0 = ps['t_start']; rows = ps['rows']
    K = len(r['ranks']) - 1
    isend = {(x['w'], x['s']): x['t_isend'] for x in rows}
    recv = {(x['w'], x['s']): x['t_recv'] for x in rows}
    D, U = [], []
    for w in range(1, K + 1):
        wr = r['ranks'][w]['rows']
        for s in range(len(wr) - 1):
            if s >= 1: D.append((wr[s]['t_got'] - isend[(w, s - 1)]) * 1e3)
            U.append((recv[(w, s)] - wr[s + 1]['t_send']) * 1e3)
    ups = sorted((x['t_got'], x['w'], x['s']) for x in rows)
    last = {}
    for t, w, s in ups: last[w] = t
    tend = min(last.values())
    meas = [u for u in ups if u[2] >= 2 and u[0] <= tend]
    rate = (len(meas) - 1) / (meas[-1][0] - meas[0][0])
    cnt = {}
    for u in meas: cnt[u[1]] = cnt.get(u[1], 0) + 1
    firsts = {w: round((r['ranks'][w]['rows'][0]['t_got'] - t0) * 1e3) for w in range(1, K + 1)}
    print(f"{r.get('priority', '')} rate {rate:.2f} counts {sorted(cnt.values(), reverse=True)} firsts {firsts} "
          f"down q {q(D)} mean {st.mean(D):.0f} up q {q(U)} mean {st.mean(U):.0f}")

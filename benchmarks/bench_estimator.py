"""The estimator for unseen shapes (issue 14): held-out accuracy of the cost model and of Tianshu's PC.

Times N random shapes per kind (the shapes ``lockstep profile --estimator N`` draws with ``--seed``)
three times each, in three round-robin passes over all shapes, forward and backward (thread CPU time,
Tianshu's N/M differencing, fastest of ``--repeats``), then reports per kind and pass, for both estimators (``terms``, the
default cost model, and ``pc``, Tianshu's principal component with a small regression):
- the repeat spread: |t1 - t2| / t2 between two measurements of the same shape, minutes apart — a perfect model,
  scored against one measurement, errs by about this much divided by sqrt(2) ("noise floor");
- the in-sample error: the estimator fitted on every shape's first measurement, scored on the second —
  what its form cannot express, plus the noise floor;
- the held-out error, 1 - accuracy as Tianshu defines it (§4.3: mean |predicted - measured| / measured),
  by 10-fold cross-validation grouped by shape: every shape is predicted once by a fit that never saw it
  (each shape is one group: its three timings are all in the same fold); fitted on the first
  measurement and scored on the second ("t1 → t2", the headline), or fitted and scored on the median
  of the three ("median 3").
Run: .venv/bin/python benchmarks/bench_estimator.py [--shapes 200] [--seed 0] [--repeats 5]
     [--save F | --load F [F ...]] [--kinds Linear,Conv2d] | --drift A B
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agents.sim import estimator as E  # noqa: E402

KINDS = ("Linear", "Conv2d")
PASSES = ("forward", "backward")
METHODS = ("pc", "terms")


def measure(kinds: tuple[str, ...], shapes: int, repeats: int, seed: int, passes: int = 3) -> list[dict]:
    """``passes`` timings of every shape, taken in round-robin passes over all shapes of a kind: two timings of
    one shape are minutes apart, so their spread includes the machine's load drifting (back-to-back repeats,
    the protocol before, hid it: docs/benchmarks.md)."""
    import torch

    from controller.estimate import time_random_ops

    torch.set_num_threads(1)
    rows = []
    for kind in kinds:  # the same keyed shapes as fit_estimators(seed)
        t0 = time.perf_counter()
        rows += [{"kind": kind, "features": feats, **got}
                 for feats, got in time_random_ops(kind, shapes, seed, repeats, passes)]
        print(f"measured {shapes} {kind} shapes ({passes} passes) in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return rows


def fit(kind: str, phase: str, samples: list, method: str, simd: int, l2: int) -> E.OpModel:
    return E.fit(kind, phase, samples, holdout=0, method=method, simd=simd, l2=l2)


def cross_validated(kind: str, phase: str, rows: list[dict], fit_on, score_on, method: str, simd: int, l2: int,
                    folds: int = 10) -> np.ndarray:
    """Relative error of every shape, predicted by a fit on the other folds (a shape is never in both)."""
    order = np.random.default_rng(0).permutation(len(rows))
    errs = np.zeros(len(rows))
    for k in range(folds):
        test = order[k::folds]
        train = np.setdiff1d(order, test)
        m = fit(kind, phase, [(rows[i]["features"], fit_on(rows[i][phase])) for i in train], method, simd, l2)
        for i in test:
            t = score_on(rows[i][phase])
            errs[i] = abs(m.seconds(rows[i]["features"]) - t) / t
    return errs


def report(rows: list[dict], simd: int, l2: int) -> None:
    first, second = (lambda t: t[0]), (lambda t: t[1])
    med = lambda t: float(np.median(t))  # noqa: E731
    print("| kind/pass | shapes | time (µs) | repeat spread mean / median / max | noise floor | "
          + " | ".join(f"{m}: in-sample t1 → t2 | {m}: held-out t1 → t2 | {m}: held-out median 3" for m in METHODS)
          + " |")
    print("|---|---|---|---|---|" + "---|" * (3 * len(METHODS)))
    totals: dict[str, list[float]] = {}
    for kind in KINDS:
        rs = [r for r in rows if r["kind"] == kind]
        if not rs:
            continue
        for phase in PASSES:
            T = np.array([r[phase] for r in rs])
            spread = np.abs(T[:, 0] - T[:, 1]) / T[:, 1]
            errs = {"noise floor": spread / np.sqrt(2)}
            for method in METHODS:
                whole = fit(kind, phase, [(r["features"], r[phase][0]) for r in rs], method, simd, l2)
                errs[f"{method}: in-sample"] = np.array(
                    [abs(whole.seconds(r["features"]) - r[phase][1]) / r[phase][1] for r in rs])
                errs[f"{method}: held-out t1 → t2"] = cross_validated(kind, phase, rs, first, second, method, simd, l2)
                errs[f"{method}: held-out median 3"] = cross_validated(kind, phase, rs, med, med, method, simd, l2)
            for name, e in errs.items():
                totals.setdefault(name, []).append(float(e.mean()))
            print(f"| {kind}/{phase} | {len(rs)} | {1e6 * T.min():.1f}–{1e6 * T.max():.0f} | "
                  f"{100 * spread.mean():.1f} / {100 * np.median(spread):.1f} / {100 * spread.max():.0f} % | "
                  + " | ".join(f"{100 * e.mean():.1f} %" for e in errs.values()) + " |", flush=True)
    print("mean over kinds and passes (accuracy = 1 - error): " + ", ".join(
        f"{name} {100 * np.mean(v):.1f} % ({100 - 100 * np.mean(v):.1f} %)" for name, v in totals.items()))


def drift(a: list[dict], b: list[dict]) -> None:
    """The same shapes measured in two sessions: how far apart the two medians of three are, beyond a common
    speed ratio (the load of the whole machine): the noise floor of a measurement taken at another moment."""
    print("| kind/pass | session B / A (median) | between sessions, single timing | between sessions, median of 3 |")
    print("|---|---|---|---|")
    for kind in KINDS:
        ra, rb = [r for r in a if r["kind"] == kind], [r for r in b if r["kind"] == kind]
        if not ra or len(ra) != len(rb):
            continue
        for phase in PASSES:
            A, B = np.array([r[phase] for r in ra]), np.array([r[phase] for r in rb])
            ma, mb = np.median(A, axis=1), np.median(B, axis=1)
            ratio = float(np.median(mb / ma))
            single = np.abs(B[:, 0] / ratio - A[:, 0]) / A[:, 0] / np.sqrt(2)
            three = np.abs(mb / ratio - ma) / ma / np.sqrt(2)
            print(f"| {kind}/{phase} | {ratio:.3f} | {100 * single.mean():.1f} % | {100 * three.mean():.1f} % |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0, help="which keyed shapes (fit_estimators' seed)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--save", type=Path)
    ap.add_argument("--load", type=Path, nargs="+", help="timings of earlier --save runs: refit without measuring")
    ap.add_argument("--simd", type=int, default=0, help="channel block of the host that measured (0: this host)")
    ap.add_argument("--l2", type=int, default=0, help="its per-core L2 cache in bytes (0: this host)")
    ap.add_argument("--drift", type=Path, nargs=2, metavar=("A", "B"),
                    help="two --save files of the same shapes: the noise between the two sessions")
    a = ap.parse_args()
    if a.drift:
        drift(*(json.loads(f.read_text()) for f in a.drift))
        return
    kinds = tuple(k for k in a.kinds.split(",") if k)
    if a.load:
        rows = [r for f in a.load for r in json.loads(f.read_text()) if r["kind"] in kinds]
    else:
        rows = measure(kinds, a.shapes, a.repeats, a.seed)
    if a.save:
        a.save.write_text(json.dumps(rows))
    simd, l2 = a.simd, a.l2
    if not (simd and l2):
        from controller.estimate import host_blocks

        simd, l2 = simd or host_blocks()[0], l2 or host_blocks()[1]
    report(rows, simd, l2)


if __name__ == "__main__":
    main()

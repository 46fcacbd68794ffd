"""Tianshu's estimator (issue 14): is its held-out error the timing's noise or the model's form?

Times N random shapes per kind (the shapes ``lockstep profile --estimator N`` draws) three times each,
interleaved, forward and backward (thread CPU time, Tianshu's N/M differencing, fastest of ``--repeats``),
then reports per kind and pass:
- the repeat spread: |t1 - t2| / t2 between two measurements of the same shape — a perfect model,
  scored against one measurement, errs by about this much divided by sqrt(2);
  "noise floor" is that mean divided by sqrt(2);
- the in-sample error: the estimator fitted on every shape's first measurement, scored on the second —
  what its form cannot express, plus the noise floor;
- the held-out error, 1 - accuracy as Tianshu defines it (mean |predicted - measured| / measured), by
  10-fold cross-validation: every shape is predicted once by a fit that never saw it (150 shapes give
  150 held-out errors, not the 15 of one 90/10 split); fitted on the first measurement and scored on
  the second ("t1 → t2"), or fitted and scored on the median of the three ("median 3").
Run: .venv/bin/python benchmarks/bench_estimator.py [--shapes 150] [--repeats 5] [--save F | --load F]
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


def measure(shapes: int, repeats: int) -> list[dict]:
    import torch

    from agents.sim import keyed
    from agents.workloads.layers import time_nm
    from controller.estimate import _random_op

    torch.set_num_threads(1)
    rows = []
    for kind in KINDS:
        t0 = time.perf_counter()
        for i in range(shapes):  # the same keyed shapes as fit_estimators(seed=0)
            mod, x, feats = _random_op(kind, keyed.generator(0, "estimator", kind, i))
            xg = x.clone().requires_grad_(True)
            y = mod(xg)
            go, wrt = torch.ones_like(y), [*mod.parameters(), xg]

            def forward():
                with torch.no_grad():
                    return mod(x)

            row = {"kind": kind, "features": feats, "forward": [], "backward": []}
            for _ in range(3):
                row["forward"].append(time_nm(forward, repeats=repeats))
                row["backward"].append(time_nm(lambda: torch.autograd.grad(y, wrt, go, retain_graph=True),
                                               repeats=repeats))
            rows.append(row)
        print(f"measured {shapes} {kind} shapes in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return rows


def cross_validated(kind: str, phase: str, rows: list[dict], fit_on, score_on, folds: int = 10) -> np.ndarray:
    """Relative error of every shape, predicted by a fit on the other folds."""
    order = np.random.default_rng(0).permutation(len(rows))
    errs = np.zeros(len(rows))
    for k in range(folds):
        test = order[k::folds]
        train = np.setdiff1d(order, test)
        m = E.fit(kind, phase, [(rows[i]["features"], fit_on(rows[i][phase])) for i in train], holdout=0)
        for i in test:
            t = score_on(rows[i][phase])
            errs[i] = abs(m.seconds(rows[i]["features"]) - t) / t
    return errs


def report(rows: list[dict]) -> None:
    first, second = (lambda t: t[0]), (lambda t: t[1])
    med = lambda t: float(np.median(t))  # noqa: E731
    print("| kind/pass | shapes | time (µs) | repeat spread mean / median / max | noise floor | in-sample t1 → t2 "
          "| held-out t1 → t2 | held-out median 3 |")
    print("|---|---|---|---|---|---|---|---|")
    totals: dict[str, list[float]] = {}
    for kind in KINDS:
        rs = [r for r in rows if r["kind"] == kind]
        for phase in PASSES:
            T = np.array([r[phase] for r in rs])
            spread = np.abs(T[:, 0] - T[:, 1]) / T[:, 1]
            whole = E.fit(kind, phase, [(r["features"], r[phase][0]) for r in rs], holdout=0)
            inside = np.array([abs(whole.seconds(r["features"]) - r[phase][1]) / r[phase][1] for r in rs])
            errs = {"noise floor": spread / np.sqrt(2), "in-sample": inside,
                    "held-out t1 → t2": cross_validated(kind, phase, rs, first, second),
                    "held-out median 3": cross_validated(kind, phase, rs, med, med)}
            for name, e in errs.items():
                totals.setdefault(name, []).append(float(e.mean()))
            print(f"| {kind}/{phase} | {len(rs)} | {1e6 * T.min():.1f}–{1e6 * T.max():.0f} | "
                  f"{100 * spread.mean():.1f} / {100 * np.median(spread):.1f} / {100 * spread.max():.0f} % | "
                  + " | ".join(f"{100 * e.mean():.1f} %" for e in errs.values()) + " |")
    print("mean over kinds and passes (accuracy = 1 - error): " + ", ".join(
        f"{name} {100 * np.mean(v):.1f} % ({100 - 100 * np.mean(v):.1f} %)" for name, v in totals.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--save", type=Path)
    ap.add_argument("--load", type=Path, help="the timings of an earlier --save: refit without measuring")
    a = ap.parse_args()
    rows = json.loads(a.load.read_text()) if a.load else measure(a.shapes, a.repeats)
    if a.save:
        a.save.write_text(json.dumps(rows))
    report(rows)


if __name__ == "__main__":
    main()

"""Execution time of operations with shapes nobody profiled: Tianshu's estimator (§3.2), numpy only.

Tianshu observes that a parameter of an operation affects its time linearly (a tensor
dimension), inversely (a stride), not at all, or by selecting another implementation
(§3.2.1), and builds a *principal component* (PC) — the operation's theoretical time
complexity — by trying every product of the linear parameters divided by inverse ones
and keeping the one that predicts best (§3.2.2; e.g. ``n·h·w·c·k_x·k_y / (s_h·s_w)`` for a
convolution, Eq. 2). The PC then feeds a small regression per operation kind. Tianshu
uses a multilayer perceptron; lockstep fits, per kind and pass, a two-parameter model on
the PC — ``t = a + b·PC`` (a launch overhead plus work) or ``t = a·PC^b`` (for kernels
whose efficiency grows with size) — chosen with the PC by cross-validated relative error.
Two coefficients need far fewer profiled shapes than a perceptron, and the held-out
error (:func:`fit`, reported by ``lockstep profile --estimator``) says whether it is enough.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["OpKind", "OP_KINDS", "Estimator", "OpModel", "Fit", "fit", "features_of", "estimators_from",
           "relative_errors", "FORMS"]


@dataclass(frozen=True)
class OpKind:
    """An operation kind: its numeric parameters, which may act linearly, inversely, or select a mode (§3.2.1)."""

    name: str
    params: tuple[str, ...]
    linear: tuple[str, ...]  # tensor dimensions: linear or null
    inverse: tuple[str, ...]  # strides: inversely proportional or null
    modes: tuple[str, ...] = ()  # at most a handful of values (kernel sizes, strides): one model per value


OP_KINDS = {
    "Linear": OpKind("Linear", ("n", "in", "out"), ("n", "in", "out"), ()),
    # kernel sizes and strides take few values: Tianshu's pruning rule makes them mode selectors
    "Conv2d": OpKind("Conv2d", ("n", "c_in", "h", "w", "c_out", "k_h", "k_w", "s_h", "s_w"),
                     ("n", "c_in", "h", "w", "c_out", "k_h", "k_w"), ("s_h", "s_w"), ("k_h", "k_w", "s_h", "s_w")),
}


def features_of(kind: str, config: dict[str, Any], input_shape: tuple[int, ...]) -> dict[str, float] | None:
    """The numeric parameters of a layer (module config and input shape), or None for a kind not modelled."""
    if kind == "Linear":
        n = math.prod(input_shape[:-1]) if len(input_shape) > 1 else 1
        return {"n": n, "in": config["in_features"], "out": config["out_features"]}
    if kind == "Conv2d" and config.get("groups", 1) == 1 and len(input_shape) == 4:
        (k_h, k_w), (s_h, s_w), (p_h, p_w) = config["kernel_size"], config["stride"], config.get("padding", (0, 0))
        if isinstance(p_h, str):  # padding="same"
            return None
        n, c, h, w = input_shape
        return {"n": n, "c_in": c, "h": h + 2 * p_h, "w": w + 2 * p_w, "c_out": config["out_channels"],
                "k_h": k_h, "k_w": k_w, "s_h": s_h, "s_w": s_w}
    return None


FORMS = ("linear", "power", "loglinear", "roofline")
"""``linear``: a + b·PC; ``power``: a·PC^b; ``loglinear``: log t = c0 + c1·log PC + Σ c_i·log p_i (the PC
plus every parameter: what Tianshu's perceptron adds to the PC, in its simplest form); ``roofline``:
a + b·PC + c·(elements read and written) — a small operation is bound by memory, not arithmetic."""


def _elements(kind: str, f: dict[str, float]) -> float:
    """Elements an operation reads and writes: its input, weights and output."""
    if kind == "Linear":
        return f["n"] * f["in"] + f["in"] * f["out"] + f["n"] * f["out"]
    h_out = (f["h"] - f["k_h"]) // f["s_h"] + 1
    w_out = (f["w"] - f["k_w"]) // f["s_w"] + 1
    return (f["n"] * f["c_in"] * f["h"] * f["w"] + f["c_out"] * f["c_in"] * f["k_h"] * f["k_w"]
            + f["n"] * f["c_out"] * h_out * w_out)


def _pc(kind: OpKind, exps: tuple[int, ...], f: dict[str, float]) -> float:
    return math.prod(f[p] ** e for p, e in zip(kind.params, exps) if e)


def _design(kind: OpKind, exps: tuple[int, ...], feats: list[dict[str, float]], form: str) -> np.ndarray:
    x = np.array([_pc(kind, exps, f) for f in feats], dtype=float)
    if form == "roofline":
        return np.stack([np.ones_like(x), x, np.array([_elements(kind.name, f) for f in feats])], axis=1)
    if form == "loglinear":
        cols = [np.ones_like(x), np.log(x)] + [np.log([f[p] for f in feats]) for p in kind.linear
                                               if p not in kind.modes]
        return np.stack(cols, axis=1)
    return x


def _fit_form(X: np.ndarray, t: np.ndarray, form: str) -> tuple[float, ...] | None:
    """Least squares of one form, or None where it cannot be fitted (a constant PC, non-positive values)."""
    try:
        coef = _fit_raw(X, t, form)
    except np.linalg.LinAlgError:
        return None
    return coef if coef is not None and all(math.isfinite(c) for c in coef) else None


def _fit_raw(X: np.ndarray, t: np.ndarray, form: str) -> tuple[float, ...] | None:
    if X.ndim == 1 and np.ptp(X) == 0:
        return None
    if form == "roofline":  # least squares of the relative error, as for linear
        coef, *_ = np.linalg.lstsq(X / t[:, None], np.ones_like(t), rcond=None)
        return tuple(float(c) for c in coef)
    if form == "linear":  # least squares of the relative error: rows weighted by 1/t
        A = np.stack([np.ones_like(X), X], axis=1) / t[:, None]
        coef, *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
        return tuple(float(c) for c in coef)
    if np.any(t <= 0):
        return None
    if form == "power":
        if np.any(X <= 0):
            return None
        b, log_a = np.polyfit(np.log(X), np.log(t), 1)
        return float(math.exp(log_a)), float(b)
    coef, *_ = np.linalg.lstsq(X, np.log(t), rcond=None)
    return tuple(float(c) for c in coef)


def _predict(X: np.ndarray, form: str, coef: tuple[float, ...]) -> np.ndarray:
    if form == "roofline":
        return np.maximum(0.0, X @ np.array(coef))
    if form == "linear":
        return np.maximum(0.0, coef[0] + coef[1] * X)
    if form == "power":
        return coef[0] * X ** coef[1]
    return np.exp(X @ np.array(coef))


def relative_errors(pred: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.abs(pred - t) / t


@dataclass(frozen=True)
class Fit:
    exponents: tuple[int, ...]  # per OpKind.params: 1 linear, -1 inverse, 0 null
    form: str
    coef: tuple[float, ...]


@dataclass(frozen=True)
class OpModel:
    """A fitted estimator of one (kind, pass): one fit per mode value seen (``"*"``: all modes pooled)."""

    kind: str
    phase: str
    fits: dict[str, Fit]
    heldout_error: float | None = None  # mean relative error on shapes kept out of the fit
    samples: int = 0

    @property
    def exponents(self) -> tuple[int, ...]:
        return self.fits["*"].exponents

    @property
    def form(self) -> str:
        return self.fits["*"].form

    def seconds(self, feats: dict[str, float]) -> float:
        op = OP_KINDS[self.kind]
        f = self.fits.get(_mode(op, feats), self.fits["*"])
        return float(_predict(_design(op, f.exponents, [feats], f.form), f.form, f.coef)[0])

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "phase": self.phase, "heldout_error": self.heldout_error, "samples": self.samples,
                "fits": {k: {"exponents": list(f.exponents), "form": f.form, "coef": list(f.coef)}
                         for k, f in self.fits.items()}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OpModel":
        fits = {k: Fit(tuple(int(e) for e in f["exponents"]), f["form"], tuple(float(c) for c in f["coef"]))
                for k, f in d["fits"].items()}
        return cls(d["kind"], d["phase"], fits, d.get("heldout_error"), int(d.get("samples", 0)))


def _mode(op: OpKind, f: dict[str, float]) -> str:
    return ",".join(f"{p}={int(f[p])}" for p in op.modes) if op.modes else "*"


def _candidates(kind: OpKind) -> list[tuple[int, ...]]:
    """Every PC of the pruned space: each linear parameter in or out, each inverse one in (as 1/p) or out."""
    out = []
    for lin in itertools.product((0, 1), repeat=len(kind.linear)):
        if not any(lin):
            continue
        for inv in itertools.product((0, -1), repeat=len(kind.inverse)):
            e = dict(zip(kind.linear, lin)) | dict(zip(kind.inverse, inv))
            out.append(tuple(e.get(p, 0) for p in kind.params))
    return out


def _select(op: OpKind, feats: list[dict[str, float]], t: np.ndarray, folds: int,
            pcs: list[tuple[int, ...]] | None = None) -> Fit | None:
    """The PC (among ``pcs``, default all) and form with the least cross-validated relative error (Tianshu
    §3.2.2, step 2), fitted on all of ``feats``."""
    best: tuple[float, tuple[int, ...], str] | None = None
    fold_of = np.arange(len(t)) % folds
    for exps in pcs or _candidates(op):
        for form in FORMS:
            X = _design(op, exps, feats, form)
            errs = []
            for k in range(folds):
                tr, va = fold_of != k, fold_of == k
                if not va.any() or tr.sum() < (X.shape[1] + 1 if X.ndim == 2 else 3):
                    continue
                coef = _fit_form(X[tr], t[tr], form)
                if coef is None:
                    break
                errs.append(relative_errors(_predict(X[va], form, coef), t[va]).mean())
            else:
                if errs and (best is None or float(np.mean(errs)) < best[0]):
                    best = (float(np.mean(errs)), exps, form)
    if best is None:
        return None
    _, exps, form = best
    coef = _fit_form(_design(op, exps, feats, form), t, form)
    return Fit(exps, form, coef)


def fit(kind: str, phase: str, samples: list[tuple[dict[str, float], float]], holdout: float = 0.1,
        folds: int = 5, seed: int = 0, min_per_mode: int = 12) -> OpModel:
    """Fit the estimator of (``kind``, ``phase``) on ``samples`` (features, seconds); hold ``holdout`` out.

    A pooled fit (``"*"``) covers every mode; a mode value with at least ``min_per_mode`` training shapes
    gets its own (Tianshu: an independent model per value of a mode-selection parameter). The held-out
    part, never seen by any fit, measures the error reported.
    """
    op = OP_KINDS[kind]
    order = np.random.default_rng(seed).permutation(len(samples))
    n_test = max(1, int(round(holdout * len(samples)))) if holdout > 0 else 0
    test, train = [samples[i] for i in order[:n_test]], [samples[i] for i in order[n_test:]]
    fits: dict[str, Fit] = {}
    pooled = _select(op, [s[0] for s in train], np.array([s[1] for s in train]), folds)
    if pooled is None:
        raise ValueError(f"estimator {kind}/{phase}: not enough samples to fit ({len(samples)})")
    fits["*"] = pooled
    by_mode: dict[str, list] = {}
    for s in train:
        by_mode.setdefault(_mode(op, s[0]), []).append(s)
    if op.modes:
        for mode, pts in by_mode.items():
            if len(pts) >= min_per_mode:
                # Tianshu: the models of one operation's modes share its principal component
                got = _select(op, [p[0] for p in pts], np.array([p[1] for p in pts]), min(folds, len(pts) // 3),
                              pcs=[pooled.exponents])
                if got is not None:
                    fits[mode] = got
    model = OpModel(kind, phase, fits, None, len(samples))
    heldout = None
    if test:
        pred = np.array([model.seconds(f) for f, _ in test])
        heldout = float(relative_errors(pred, np.array([t for _, t in test])).mean())
    return OpModel(kind, phase, fits, heldout, len(samples))


class Estimator:
    """The fitted models of a device profile, by (kind, pass)."""

    def __init__(self, models: list[OpModel]):
        self.models = {(m.kind, m.phase): m for m in models}

    def layer_seconds(self, layer: Any, phase: str) -> float | None:
        """Estimated seconds of a layer (agents.workloads.layers.Layer) in ``phase``, or None if not modelled."""
        m = self.models.get((layer.kind, phase))
        feats = features_of(layer.kind, dict(layer.config), layer.input_shape)
        if m is None or feats is None:
            return None
        return m.seconds(feats)


def estimators_from(plain: dict[str, Any] | None) -> Estimator:
    """An Estimator from a device profile's ``estimators`` section (``{"Conv2d/forward": {...}}``)."""
    return Estimator([OpModel.from_dict(d) for d in (plain or {}).values()])

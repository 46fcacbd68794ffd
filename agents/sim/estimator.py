"""Execution time of operations with shapes nobody profiled: Tianshu's estimator (§3.2) and a cost model, numpy only.

Two estimators, fitted per operation kind and pass on profiled shapes:

``pc`` (Tianshu, the baseline). Tianshu observes that a parameter of an operation affects its
time linearly (a tensor dimension), inversely (a stride), not at all, or by selecting another
implementation (§3.2.1), and builds a *principal component* (PC) — the operation's theoretical
time complexity — by trying every product of the linear parameters divided by inverse ones and
keeping the one that predicts best (§3.2.2; ``n·h·w·c·k_x·k_y / (s_h·s_w)`` for a convolution,
Eq. 2). The PC feeds a small regression per kind: Tianshu uses a perceptron; here a two- or
few-parameter form (``a + b·PC``, ``a·PC^b``, log-linear, roofline), chosen with the PC by
cross-validated relative error, one fit per value of the mode-selection parameters.

``terms`` (the default). What Tianshu's §3.2.1 calls *mode selection* happens on a CPU even where
no parameter is a mode: PyTorch picks its convolution backend from the shape (``use_mkldnn`` in
ATen's Convolution.cpp: a 1×1 unstrided convolution of fewer than 16 images, or one image under
a 3×3 kernel, runs ATen's own im2col+GEMM), and oneDNN picks a kernel and a memory layout from
the channel counts (AVX-512 blocks of 16 channels, an AVX2 kernel with blocks of 8 for the
weight gradient of 4–15 input channels, a strided kernel with channels-last copies for the data
gradient of a strided convolution, the 1×1 kernel when the input divides by the stride), and
MKL's GEMM behind ``Linear`` slows down when a leading dimension is not a multiple of 4 floats.
These rules (read with ``ONEDNN_VERBOSE=1`` on torch 2.13 / oneDNN 3.12) are written down in
:func:`regime_of` and :func:`quantities`, and the time is a sum of physical costs::

    t = Σ_j a_j · q_j(shape),   a_j ≥ 0

where each ``q_j`` is a count with a meaning — 1 (the call's overhead), multiply-adds (on the
channel counts the chosen kernel pads to), elements read and written, weight elements, im2col
elements, images — possibly restricted to the shapes one implementation serves (``q@gate``).
It is fitted per (kind, pass, backend) by least squares of the *relative* error (rows weighted
by 1/t, as Tianshu's accuracy is relative); a term whose coefficient comes out negative is
dropped and the rest refitted (a cost cannot be negative). Tianshu's PC is one such term (the
multiply-adds); the others are what a CPU adds to it. docs/predict.md gives the held-out
accuracy of both on the same shapes.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["OpKind", "OP_KINDS", "Estimator", "OpModel", "Fit", "fit", "features_of", "estimators_from",
           "relative_errors", "FORMS", "METHODS", "TERMS", "quantities", "regime_of"]


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
        if tuple(config.get("dilation", (1, 1))) != (1, 1):
            return None
        n, c, h, w = input_shape
        return {"n": n, "c_in": c, "h": h + 2 * p_h, "w": w + 2 * p_w, "c_out": config["out_channels"],
                "k_h": k_h, "k_w": k_w, "s_h": s_h, "s_w": s_w, "p_h": p_h, "p_w": p_w}
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


# --- the cost model ("terms") ---------------------------------------------------------------------------------

METHODS = ("terms", "pc")
"""``terms``: the cost model (default); ``pc``: Tianshu's principal component and a small regression."""

SIMD = 16  # channels per oneDNN block on AVX-512 (8 on AVX2): recorded with each fitted model
L2_BYTES = 1 << 20  # per-core L2 cache of the profiling host: recorded with each fitted model


def regime_of(kind: str, f: dict[str, float]) -> str:
    """The implementation PyTorch runs for this shape on one CPU thread: ``native`` or ``mkldnn`` (Conv2d),
    ``*`` (Linear: MKL's GEMM always).

    ATen's ``ConvParams::use_mkldnn`` (torch 2.x, one thread, float32, no groups or dilation): oneDNN
    unless the convolution is 1×1 and unstrided with fewer than 16 images, or has one image, a kernel of at
    most 3×3 and at most 20 480 input elements — then ATen's own im2col + GEMM (``slow_conv2d``).
    """
    if kind != "Conv2d":
        return "*"
    n, k_h, k_w, s_h, s_w = f["n"], f["k_h"], f["k_w"], f["s_h"], f["s_w"]
    p_h, p_w = f.get("p_h", (k_h - 1) // 2), f.get("p_w", (k_w - 1) // 2)
    numel = n * f["c_in"] * (f["h"] - 2 * p_h) * (f["w"] - 2 * p_w)
    first = s_h > 1 or s_w > 1 or n >= 16 or k_h != 1 or k_w != 1
    second = (k_h > 3 and k_w > 3) or n > 1 or numel > 20480
    return "mkldnn" if first and second else "native"


def _up(x: float, block: int) -> float:
    return block * math.ceil(x / block)


def quantities(kind: str, f: dict[str, float], simd: int = SIMD, l2: int = L2_BYTES) -> dict[str, float]:
    """Every count a term of ``kind`` may use, ``name`` or ``name@gate`` (the count where the gate holds, else 0)."""
    if kind == "Linear":
        n, i, o = f["n"], f["in"], f["out"]
        flops = n * i * o
        gates = {"o%4": o % 4 != 0, "i%4": i % 4 != 0, "n%4": n % 4 != 0, "n<16": n < 16,
                 "w>2L2": 4 * i * o > 2 * l2}
        q = {"one": 1.0, "flops": flops, "in": n * i, "out": n * o, "weights": i * o}
        q.update({f"flops@{g}": flops * v for g, v in gates.items()})
        return q
    n, c, co, k_h, k_w, s_h, s_w = (f[p] for p in ("n", "c_in", "c_out", "k_h", "k_w", "s_h", "s_w"))
    p_h, p_w = f.get("p_h", (k_h - 1) // 2), f.get("p_w", (k_w - 1) // 2)
    h_out, w_out = (f["h"] - k_h) // s_h + 1, (f["w"] - k_w) // s_w + 1
    taps = n * h_out * w_out * k_h * k_w  # multiply-adds per (input channel, output channel)
    half = max(1, simd // 2)
    q = {"one": 1.0, "images": n, "flops": taps * c * co, "in": n * c * (f["h"] - 2 * p_h) * (f["w"] - 2 * p_w),
         "out": n * co * h_out * w_out, "weights": co * c * k_h * k_w, "im2col": n * c * k_h * k_w * h_out * w_out,
         # multiply-adds on the channels each oneDNN kernel pads to a block: out / in+out / in / both by half blocks
         "flops_co": taps * c * _up(co, simd), "flops_blocked": taps * _up(c, simd) * _up(co, simd),
         "flops_ci": taps * _up(c, simd) * co, "flops_half": taps * _up(c, half) * _up(co, half),
         # the direct kernel's loop over kernel taps and output-channel blocks: its cost per tap when c is tiny
         "taps_co": taps * _up(co, simd)}
    one_by_one = k_h == 1 and k_w == 1 and f["h"] % s_h == 0 and f["w"] % s_w == 0  # oneDNN's 1x1 kernel applies
    gates = {"fwd1x1": one_by_one, "fwd_direct": not one_by_one,  # forward: 1x1 kernel (blocked input) or direct
             "strided": s_h > 1 or s_w > 1,  # data gradient: strided kernel with channels-last copies, or
             "unstrided": s_h == 1 and s_w == 1,  # a kernel on channel blocks (direct, or 1x1)
             "wgt_half": not one_by_one and 4 <= c and c % simd != 0,  # weight gradient: AVX2 kernel, half blocks
             "wgt_flat": not one_by_one and c < 4,  # AVX-512 kernel reading the plain input
             "wgt_blocked": one_by_one or c % simd == 0,  # AVX-512 kernel on blocked input
             "in_blocked": c % simd == 0}  # the direct kernels reorder the input into blocks
    for g, v in gates.items():
        for name in ("one", "in", "out", "flops_co", "flops_blocked", "flops_ci", "flops_half", "taps_co"):
            q[f"{name}@{g}"] = q[name] * v
    return q


TERMS: dict[tuple[str, str, str], tuple[str, ...]] = {
    # Linear (MKL's sgemm; backward: two GEMMs and a sum): work, its slower variants, the three tensors
    ("Linear", "*", "forward"): ("one", "flops", "in", "out", "weights", "flops@o%4", "flops@i%4", "flops@n%4",
                                 "flops@n<16", "flops@w>2L2"),
    ("Linear", "*", "backward"): ("one", "flops", "in", "out", "weights", "flops@o%4", "flops@i%4", "flops@n%4",
                                  "flops@n<16", "flops@w>2L2"),
    # ATen's im2col + one GEMM per image
    ("Conv2d", "native", "forward"): ("one", "images", "flops", "im2col", "in", "out", "weights"),
    ("Conv2d", "native", "backward"): ("one", "images", "flops", "im2col", "in", "out", "weights"),
    # oneDNN: the kernel's padded multiply-adds, reorders of input (more for the 1x1 kernel), output and weights
    ("Conv2d", "mkldnn", "forward"): ("one", "flops_co@fwd_direct", "taps_co@fwd_direct", "flops_blocked@fwd1x1",
                                      "in", "out", "weights", "one@fwd1x1", "in@fwd1x1", "in@in_blocked"),
    # data gradient (strided kernel + channels-last copies, or direct) plus weight gradient (three kernels)
    ("Conv2d", "mkldnn", "backward"): ("one", "flops_ci@strided", "flops_blocked@unstrided", "flops_half@wgt_half",
                                       "flops_co@wgt_flat", "flops_blocked@wgt_blocked", "in", "out", "weights",
                                       "one@strided", "in@strided", "out@strided", "in@wgt_half", "out@wgt_half"),
}
"""The candidate terms of each (kind, backend, pass); a fit keeps those with a non-negative cost."""


def _terms_of(kind: str, regime: str, phase: str) -> tuple[str, ...]:
    if (kind, regime, phase) in TERMS:
        return TERMS[(kind, regime, phase)]
    # the pooled fallback of a kind: every term of its backends
    names = [t for (k, _, ph), ts in TERMS.items() if k == kind and ph == phase for t in ts]
    return tuple(dict.fromkeys(names))


def _nonneg_relative_fit(X: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Least squares of the relative error ``(X·a − t)/t`` with ``a ≥ 0``: the most negative coefficient's term
    is dropped and the rest refitted until none is negative (columns that are zero on every row get 0)."""
    keep = [j for j in range(X.shape[1]) if np.any(X[:, j])]
    coef = np.zeros(X.shape[1])
    while keep:
        a, *_ = np.linalg.lstsq(X[:, keep] / t[:, None], np.ones_like(t), rcond=None)
        if np.all(a >= 0):
            coef[keep] = a
            return coef
        keep.pop(int(np.argmin(a)))
    return coef


def _fit_terms(kind: str, regime: str, phase: str, feats: list[dict[str, float]], t: np.ndarray,
               simd: int, l2: int) -> "Fit":
    names = _terms_of(kind, regime, phase)
    rows = [quantities(kind, f, simd, l2) for f in feats]
    X = np.array([[q[name] for name in names] for q in rows], dtype=float)
    return Fit((), "terms", tuple(float(c) for c in _nonneg_relative_fit(X, t)), names)


@dataclass(frozen=True)
class Fit:
    exponents: tuple[int, ...]  # pc: per OpKind.params, 1 linear, -1 inverse, 0 null (terms: empty)
    form: str  # one of FORMS, or "terms"
    coef: tuple[float, ...]
    terms: tuple[str, ...] = ()  # terms: the quantities the coefficients multiply (seconds per unit)


@dataclass(frozen=True)
class OpModel:
    """A fitted estimator of one (kind, pass).

    ``pc``: one fit per mode value seen, ``"*"`` pooling all modes; ``terms``: one fit per backend
    (:func:`regime_of`), ``"*"`` pooling all backends for one a profile never saw.
    """

    kind: str
    phase: str
    fits: dict[str, Fit]
    heldout_error: float | None = None  # mean relative error on shapes kept out of the fit
    samples: int = 0
    simd: int = SIMD  # the profiling host's, which the terms' channel blocks and cache gates use
    l2: int = L2_BYTES

    @property
    def method(self) -> str:
        return "terms" if self.fits["*"].form == "terms" else "pc"

    @property
    def exponents(self) -> tuple[int, ...]:
        return self.fits["*"].exponents

    @property
    def form(self) -> str:
        return self.fits["*"].form

    def seconds(self, feats: dict[str, float]) -> float:
        if self.method == "terms":
            f = self.fits.get(regime_of(self.kind, feats), self.fits["*"])
            q = quantities(self.kind, feats, self.simd, self.l2)
            return max(0.0, float(sum(c * q[name] for c, name in zip(f.coef, f.terms))))
        op = OP_KINDS[self.kind]
        f = self.fits.get(_mode(op, feats), self.fits["*"])
        return float(_predict(_design(op, f.exponents, [feats], f.form), f.form, f.coef)[0])

    def to_dict(self) -> dict[str, Any]:
        fits = {}
        for k, f in self.fits.items():
            d: dict[str, Any] = {"exponents": list(f.exponents), "form": f.form, "coef": list(f.coef)}
            if f.terms:
                d["terms"] = list(f.terms)
            fits[k] = d
        return {"kind": self.kind, "phase": self.phase, "heldout_error": self.heldout_error, "samples": self.samples,
                "simd": self.simd, "l2": self.l2, "fits": fits}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OpModel":
        fits = {k: Fit(tuple(int(e) for e in f["exponents"]), f["form"], tuple(float(c) for c in f["coef"]),
                       tuple(str(t) for t in f.get("terms", ())))
                for k, f in d["fits"].items()}
        return cls(d["kind"], d["phase"], fits, d.get("heldout_error"), int(d.get("samples", 0)),
                   int(d.get("simd", SIMD)), int(d.get("l2", L2_BYTES)))


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
        folds: int = 5, seed: int = 0, min_per_mode: int = 12, method: str = "terms", simd: int = SIMD,
        l2: int = L2_BYTES) -> OpModel:
    """Fit the estimator of (``kind``, ``phase``) on ``samples`` (features, seconds); hold ``holdout`` out.

    ``terms`` (default): the cost model, one fit per backend with at least one sample more than it has
    terms, and a pooled one (``"*"``) over all samples. ``pc``: Tianshu's search; a pooled fit (``"*"``)
    covers every mode and a mode value with at least ``min_per_mode`` training shapes gets its own
    (Tianshu: an independent model per value of a mode-selection parameter). The held-out part, never
    seen by any fit, measures the error reported.
    """
    if method not in METHODS:
        raise ValueError(f"estimator method {method!r}: accepted: {', '.join(METHODS)}")
    op = OP_KINDS[kind]
    order = np.random.default_rng(seed).permutation(len(samples))
    n_test = max(1, int(round(holdout * len(samples)))) if holdout > 0 else 0
    test, train = [samples[i] for i in order[:n_test]], [samples[i] for i in order[n_test:]]
    fits: dict[str, Fit] = {}
    if method == "terms":
        fits = _fit_all_terms(kind, phase, train, simd, l2)
    else:
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
                    got = _select(op, [p[0] for p in pts], np.array([p[1] for p in pts]),
                                  min(folds, len(pts) // 3), pcs=[pooled.exponents])
                    if got is not None:
                        fits[mode] = got
    model = OpModel(kind, phase, fits, None, len(samples), simd, l2)
    heldout = None
    if test:
        pred = np.array([model.seconds(f) for f, _ in test])
        heldout = float(relative_errors(pred, np.array([t for _, t in test])).mean())
    return OpModel(kind, phase, fits, heldout, len(samples), simd, l2)


def _fit_all_terms(kind: str, phase: str, train: list[tuple[dict[str, float], float]], simd: int,
                   l2: int) -> dict[str, Fit]:
    if len(train) < 3 or any(t <= 0 for _, t in train):
        raise ValueError(f"estimator {kind}/{phase}: not enough positive samples to fit ({len(train)})")
    feats, t = [s[0] for s in train], np.array([s[1] for s in train], dtype=float)
    fits = {"*": _fit_terms(kind, "*", phase, feats, t, simd, l2)}
    regimes = np.array([regime_of(kind, f) for f in feats])
    for r in sorted(set(regimes) - {"*"}):
        m = regimes == r
        if m.sum() > len(_terms_of(kind, r, phase)):
            fits[r] = _fit_terms(kind, r, phase, [f for f, keep in zip(feats, m) if keep], t[m], simd, l2)
    return fits


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

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

__all__ = ["OpKind", "OP_KINDS", "Estimator", "OpModel", "fit", "features_of", "estimators_from",
           "relative_errors"]


@dataclass(frozen=True)
class OpKind:
    """An operation kind: its numeric parameters, which may act linearly and which inversely (§3.2.1 pruning)."""

    name: str
    params: tuple[str, ...]
    linear: tuple[str, ...]  # tensor dimensions: linear or null
    inverse: tuple[str, ...]  # strides: inversely proportional or null


OP_KINDS = {
    "Linear": OpKind("Linear", ("n", "in", "out"), ("n", "in", "out"), ()),
    "Conv2d": OpKind("Conv2d", ("n", "c_in", "h", "w", "c_out", "k_h", "k_w", "s_h", "s_w"),
                     ("n", "c_in", "h", "w", "c_out", "k_h", "k_w"), ("s_h", "s_w")),
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


@dataclass(frozen=True)
class OpModel:
    """A fitted estimator of one (kind, pass): PC exponents per parameter, the regression form and coefficients."""

    kind: str
    phase: str
    exponents: tuple[int, ...]  # per OpKind.params: 1 linear, -1 inverse, 0 null
    form: str  # "linear": a + b·PC | "power": a·PC^b
    coef: tuple[float, float]
    heldout_error: float | None = None  # mean relative error on shapes kept out of the fit
    samples: int = 0

    def pc(self, feats: dict[str, float]) -> float:
        ps = OP_KINDS[self.kind].params
        return math.prod(feats[p] ** e for p, e in zip(ps, self.exponents) if e)

    def seconds(self, feats: dict[str, float]) -> float:
        x = self.pc(feats)
        a, b = self.coef
        return max(0.0, a + b * x) if self.form == "linear" else a * x ** b

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "phase": self.phase, "exponents": list(self.exponents), "form": self.form,
                "coef": list(self.coef), "heldout_error": self.heldout_error, "samples": self.samples}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OpModel":
        return cls(d["kind"], d["phase"], tuple(int(e) for e in d["exponents"]), d["form"],
                   (float(d["coef"][0]), float(d["coef"][1])), d.get("heldout_error"), int(d.get("samples", 0)))


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


def _fit_form(x: np.ndarray, t: np.ndarray, form: str) -> tuple[float, float] | None:
    if form == "linear":  # least squares of the relative error: rows weighted by 1/t
        A = np.stack([np.ones_like(x), x], axis=1) / t[:, None]
        coef, *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
        return float(coef[0]), float(coef[1])
    if np.any(x <= 0) or np.any(t <= 0):
        return None
    b, log_a = np.polyfit(np.log(x), np.log(t), 1)
    return float(math.exp(log_a)), float(b)


def _predict(x: np.ndarray, form: str, coef: tuple[float, float]) -> np.ndarray:
    a, b = coef
    return np.maximum(0.0, a + b * x) if form == "linear" else a * x ** b


def relative_errors(pred: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.abs(pred - t) / t


def fit(kind: str, phase: str, samples: list[tuple[dict[str, float], float]], holdout: float = 0.1,
        folds: int = 5, seed: int = 0) -> OpModel:
    """Fit the estimator of (``kind``, ``phase``) on ``samples`` (features, seconds); hold ``holdout`` out.

    The PC and the form are chosen by ``folds``-fold cross-validation on the training part
    (Tianshu §3.2.2, step 2); the held-out part, never seen, measures the error reported.
    """
    op = OP_KINDS[kind]
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(samples))
    n_test = max(1, int(round(holdout * len(samples)))) if holdout > 0 else 0
    test, train = order[:n_test], order[n_test:]
    feats = [s[0] for s in samples]
    t = np.array([s[1] for s in samples], dtype=float)
    best: tuple[float, tuple[int, ...], str] | None = None
    fold_of = np.arange(len(train)) % folds
    for exps in _candidates(op):
        x = np.array([math.prod(f[p] ** e for p, e in zip(op.params, exps) if e) for f in feats], dtype=float)
        for form in ("linear", "power"):
            errs = []
            for k in range(folds):
                tr, va = train[fold_of != k], train[fold_of == k]
                if len(va) == 0 or len(tr) < 2:
                    continue
                coef = _fit_form(x[tr], t[tr], form)
                if coef is None:
                    break
                errs.append(relative_errors(_predict(x[va], form, coef), t[va]).mean())
            else:
                if errs and (best is None or float(np.mean(errs)) < best[0]):
                    best = (float(np.mean(errs)), exps, form)
    if best is None:
        raise ValueError(f"estimator {kind}/{phase}: not enough samples to fit ({len(samples)})")
    _, exps, form = best
    x = np.array([math.prod(f[p] ** e for p, e in zip(op.params, exps) if e) for f in feats], dtype=float)
    coef = _fit_form(x[train], t[train], form)
    heldout = float(relative_errors(_predict(x[test], form, coef), t[test]).mean()) if n_test else None
    return OpModel(kind, phase, exps, form, coef, heldout, len(samples))


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

"""The compute side of a prediction: how long a gradient, an update and an aggregation take, and per layer.

The durations are the ones the emulation would give the same calls (DESIGN §4.2): the
constants of ``compute=constant``, the mean of ``compute=distribution``, FLOPs over peak
for ``analytic``, and for ``profiled`` the entry of the device profile or of this host's
profile database under the call's own signature (timed now, and stored, when missing —
as an agent would before its run). Heterogeneity enters as the mean factor of each worker:
speed × straggler × E[straggle] × E[jitter].

Per-layer shares (:func:`layer_costs`) come from, in order: per-layer entries of the
device profile (``lockstep profile --layers``), its estimator for shapes it has not
seen (Tianshu's principal component, :mod:`agents.sim.estimator`), or each layer's
forward FLOPs with ``compute.forward_fraction`` of the time in the forward pass.
"""
from __future__ import annotations

import math
import types
from dataclasses import dataclass
from typing import Any

from controller.predict import LayerCost, PredictInputError

__all__ = ["Times", "compute_times", "layer_costs", "IMAGE_SHAPE", "model_and_sample"]

IMAGE_SHAPE = (1, 28, 28)
"""One sample of the data sets lockstep reads (Fashion-MNIST, MNIST)."""


@dataclass(frozen=True)
class Times:
    gradient: tuple[float, ...]  # per worker
    update: float
    aggregate: float
    source: str


class _Holder:
    """Stands for ``Training`` in a call's signature (its ``profile_name``), without loading the data set."""

    def __init__(self, name: str):
        self.profile_name = name


def model_and_sample(rc: Any, batch: int) -> tuple[Any, Any]:
    import torch

    from agents.workloads.models import build_model

    model = build_model(rc.model, rc.seed)
    return model, torch.zeros((batch, *IMAGE_SHAPE))


def _mean_factor(spec: Any, vid: int) -> float:
    f = spec.speed[vid] if spec.speed else 1.0
    f *= spec.stragglers.get(vid, 1.0)
    f *= 1.0 + spec.straggle_p * (spec.straggle_factor - 1.0)
    if spec.jitter > 0:
        f *= math.exp(spec.jitter ** 2 / 2)  # E[lognormal(0, σ)]
    return f


def _dist_mean(dist: str, p: tuple[float, ...]) -> float:
    if dist == "lognormal":
        return math.exp(p[0] + p[1] ** 2 / 2)
    if dist == "normal":
        return p[0]
    if dist == "weibull":
        return (p[2] if len(p) > 2 else 0.0) + p[0] * math.gamma(1 + 1 / p[1])
    return p[0]  # exponential: the scale


def compute_times(rc: Any, plan: Any) -> Times:
    spec = plan.compute
    workers = [i for i, v in enumerate(plan.vworkers) if v.holds_data]
    ps = next((i for i, v in enumerate(plan.vworkers) if not v.holds_data), workers[0])
    m = spec.model
    if m in ("constant", "distribution"):
        def base(kind: str) -> float:
            if m == "distribution" and kind in spec.dist_kinds:
                return _dist_mean(spec.dist, spec.dist_params)
            return spec.constant_s.get(kind, 0.0)
        grads = [base("gradient")] * len(workers)
        upd, agg, source = base("update"), base("aggregate"), f"compute={m}"
    else:
        grads, upd, agg, source = _measured(rc, plan)
    return Times(tuple(g * _mean_factor(spec, vid) for g, vid in zip(grads, workers)),
                 upd * _mean_factor(spec, ps), agg * _mean_factor(spec, ps), source)


def _measured(rc: Any, plan: Any) -> tuple[list[float], float, float, str]:
    """profiled / measured / analytic: the durations the agents' compute model gives these calls."""
    import torch

    from agents.sim.compute import ComputeModel
    from agents.workloads.models import flat_params, optimizer, param_bytes
    from agents.workloads.training import Training

    spec = plan.compute
    wl = plan.workload
    torch.set_num_threads(wl.threads)
    model, _ = model_and_sample(rc, 1)
    holder = _Holder(f"{type(model).__name__}/{param_bytes(model)}B/{torch.device(wl.device).type}")
    grad_fn = types.MethodType(Training.gradient_at, holder)
    params = flat_params(model)
    compute = ComputeModel(spec)

    def scratch_gradient(p: Any, x: Any, y: Any) -> Any:
        from agents.workloads.models import gradient, set_flat_params

        set_flat_params(model, p)
        return gradient(model, x, y)

    def args_for(b: int) -> tuple:
        return (params, torch.zeros((b, *IMAGE_SHAPE)), torch.zeros(b, dtype=torch.long))

    opt = optimizer(wl.optimizer, model.parameters(), wl.lr, wl.momentum)
    g = torch.zeros_like(params)
    k = max(1, len(wl.data_holders))
    calls = {"update": (Training.apply, (model, opt, g), 2.0 * g.numel()),
             "aggregate": (Training.aggregate, ([g] * k, None), float(k * g.numel()))}
    if spec.model == "analytic":
        from torch.utils.flop_counter import FlopCounterMode

        flops = {}
        for b in sorted(set(wl.batch_size)):
            with FlopCounterMode(display=False) as c:
                scratch_gradient(*args_for(b))
            flops[b] = c.get_total_flops()
        grads = [flops[b] / spec.peak_flops for b in wl.batch_size]
        return grads, calls["update"][2] / spec.peak_flops, calls["aggregate"][2] / spec.peak_flops, \
            "compute=analytic (FLOPs / peak)"
    # profiled (and measured, which has no better guess than a profile): the database or the device profile
    from agents.sim.compute import signature

    fallbacks: list[str] = []

    def seconds(kind: str, fn: Any, args: tuple, run: Any) -> float:
        sig = signature(kind, fn, args)
        if spec.profile_name and sig in spec.profile:
            return spec.profile[sig]
        if spec.profile_name:  # as the emulation does: the host's database, else timed now (a profile fallback)
            fallbacks.append(kind)
        got = compute.db.get(compute.device, sig)
        if got is not None:
            return got
        return compute.profile(kind, run, args)  # timed now and stored, as an agent does ahead of a run

    grads = {}
    for b in sorted(set(wl.batch_size)):
        a = args_for(b)
        sig_fn = grad_fn
        grads[b] = seconds("gradient", sig_fn, a, _Timed(sig_fn, scratch_gradient))
    upd = seconds("update", *calls["update"][:2], Training.apply)
    agg = seconds("aggregate", *calls["aggregate"][:2], Training.aggregate)
    src = f"device profile {spec.profile_name}" if spec.profile_name else "this host's profile database"
    if fallbacks:
        src += f" ({', '.join(fallbacks)} not in it: this host's profile database, as the emulation falls back)"
    return [grads[b] for b in wl.batch_size], upd, agg, src


class _Timed:
    """A callable timed in place of a signature's function (same signature, runs the scratch model)."""

    def __init__(self, sig_fn: Any, run: Any):
        self.__self__ = sig_fn.__self__
        self.__module__ = sig_fn.__module__
        self.__qualname__ = sig_fn.__qualname__
        self._run = run

    def __call__(self, *args: Any) -> Any:
        return self._run(*args)


def _layer_shares(rc: Any, spec: Any, batch: int) -> tuple[list[Any], list[tuple[float, float]], str]:
    """The model's layers, each one's (forward, backward) share of a gradient call, and the source of the shares."""
    from agents.sim.estimator import estimators_from
    from agents.workloads.layers import layer_signature, layer_table

    model, sample = model_and_sample(rc, batch)
    table = layer_table(model, sample)
    if spec.profile_name:
        fwd = [spec.profile.get(layer_signature(l, "forward")) for l in table]
        bwd = [spec.profile.get(layer_signature(l, "backward")) for l in table]
        timings, source = None, ""
        if all(x is not None for x in fwd + bwd):
            timings, source = list(zip(fwd, bwd)), "profile"
        else:
            est = estimators_from(spec.estimators)
            guessed = [(est.layer_seconds(l, "forward"), est.layer_seconds(l, "backward")) for l in table]
            if all(f is not None and b is not None for f, b in guessed):
                timings = [(f if f0 is None else f0, b if b0 is None else b0)
                           for (f, b), f0, b0 in zip(guessed, fwd, bwd)]
                source = "estimator"
        total = sum(f + b for f, b in timings) if timings else 0.0
        if total > 0:
            return table, [(f / total, b / total) for f, b in timings], source
    ff = rc.compute.forward_fraction
    weights, source = [l.forward_flops for l in table], "flops"
    if sum(weights) <= 0:
        weights, source = [l.param_bytes for l in table], "params"
    total = sum(weights)
    return table, [(ff * w / total, (1 - ff) * w / total) for w in weights], source


def layer_costs(rc: Any, plan: Any) -> tuple[list[LayerCost], str]:
    """Per-layer bytes and shares of a gradient call, and where the shares came from."""
    table, shares, source = _layer_shares(rc, plan.compute, plan.workload.batch_size[0])
    return [LayerCost(l.name, l.param_bytes, f, b) for l, (f, b) in zip(table, shares)], source


def layer_table_of(rc: Any, spec: Any, batch: int) -> tuple[dict[str, Any], ...]:
    """``ComputeSpec.layers`` for a layer-wise run: what each layer's message holds and its shares."""
    table, shares, _ = _layer_shares(rc, spec, batch)
    return tuple({"name": l.name, "params": list(l.params), "nbytes": l.param_bytes, "forward": f, "backward": b}
                 for l, (f, b) in zip(table, shares))

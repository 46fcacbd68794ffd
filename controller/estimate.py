"""``lockstep profile --layers`` and ``--estimator N``: per-layer entries and Tianshu's estimator for a device profile.

``--layers`` times the forward and backward pass of every layer of the configured model at
each configured batch size (Tianshu's N/M differencing, :func:`agents.workloads.layers.time_nm`)
and stores them under their layer signatures, with which ``compute.layerwise`` splits a
gradient over layers. ``--estimator N`` times ``N`` operations of random shapes per kind
(``Linear``, ``Conv2d``; Tianshu §4.3 draws its shapes at random too; the median of three
passes), fits :func:`agents.sim.estimator.fit` on 90 % of them and reports the error on the
other 10 %, never seen by the fit, beside Tianshu's principal component on the same split; the
fitted cost models go into the profile and stand in for layers it lacks.
"""
from __future__ import annotations

import sys
import time
from typing import Any

__all__ = ["layer_signatures", "random_samples", "fit_estimators", "host_blocks"]


def layer_signatures(rc: Any, repeats: int, listing: dict[str, list] | None = None) -> dict[str, float]:
    """``{layer signature: seconds}`` for every layer of the configured model, at every configured batch size.

    ``listing`` (when given) receives, per model and batch, the layers in forward order with their parameter
    bytes and times: the per-layer trace Algorithm 2.1 runs on.
    """
    import torch

    from agents.workloads.layers import layer_signature, profile_layers
    from agents.workloads.models import build_model
    from controller.predict.costs import IMAGE_SHAPE

    torch.set_num_threads(rc.threads)
    out: dict[str, float] = {}
    for b in sorted(set(rc.batch_size)):
        model = build_model(rc.model, rc.seed)
        rows = []
        for lt in profile_layers(model, torch.zeros((b, *IMAGE_SHAPE)), repeats=repeats):
            out[layer_signature(lt.layer, "forward")] = lt.forward_s
            out[layer_signature(lt.layer, "backward")] = lt.backward_s
            rows.append({"name": lt.layer.name, "kind": lt.layer.kind, "param_bytes": lt.layer.param_bytes,
                         "forward_s": lt.forward_s, "backward_s": lt.backward_s})
        if listing is not None:
            listing[f"{type(model).__name__}/batch{b}"] = rows
    return out


def _random_op(kind: str, g: Any) -> tuple[Any, Any, dict[str, float]]:
    import torch
    from torch import nn

    if kind == "Linear":
        n, i, o = int(g.integers(1, 129)), int(g.integers(8, 1025)), int(g.integers(8, 1025))
        return nn.Linear(i, o), torch.randn(n, i), {"n": n, "in": i, "out": o}
    n, c, hw, co = int(g.integers(1, 17)), int(g.integers(1, 17)), int(g.integers(8, 29)), int(g.integers(4, 33))
    k, s = int(g.choice([1, 3, 5])), int(g.choice([1, 2]))
    p = k // 2
    feats = {"n": n, "c_in": c, "h": hw + 2 * p, "w": hw + 2 * p, "c_out": co, "k_h": k, "k_w": k, "s_h": s, "s_w": s,
             "p_h": p, "p_w": p}
    return nn.Conv2d(c, co, k, s, p), torch.randn(n, c, hw, hw), feats


def random_samples(kind: str, count: int, seed: int, repeats: int,
                   passes: int = 3) -> dict[str, list[tuple[dict[str, float], float]]]:
    """``count`` operations of ``kind`` with random shapes (keyed by ``seed``), forward and backward seconds each.

    Each shape is timed once per pass, in ``passes`` round-robin passes over all shapes, and keeps the median:
    two timings of a shape are then minutes apart, so the median also evens out the machine's load drifting,
    which repeats taken back to back cannot (docs/benchmarks.md: on the shared VM the median of three passes
    lowers the held-out error from 6.6 % to 5.2 %).
    """
    import statistics

    timed = time_random_ops(kind, count, seed, repeats, passes)
    return {phase: [(feats, statistics.median(got[phase])) for feats, got in timed]
            for phase in ("forward", "backward")}


def time_random_ops(kind: str, count: int, seed: int, repeats: int,
                    passes: int) -> list[tuple[dict[str, float], dict[str, list[float]]]]:
    """The features of ``count`` keyed random operations of ``kind`` and every pass's forward and backward
    seconds of each, the passes round-robin over all shapes (:func:`random_samples` keeps their medians)."""
    import torch

    from agents.sim import keyed
    from agents.workloads.layers import time_nm

    ops = []
    for i in range(count):
        mod, x, feats = _random_op(kind, keyed.generator(seed, "estimator", kind, i))
        xg = x.clone().requires_grad_(True)
        y = mod(xg)
        ops.append((feats, mod, x, y, torch.ones_like(y), [*mod.parameters(), xg]))
    times: list[dict[str, list[float]]] = [{"forward": [], "backward": []} for _ in ops]
    for _ in range(passes):
        for got, (_, mod, x, y, go, wrt) in zip(times, ops):
            def forward(mod=mod, x=x):
                with torch.no_grad():
                    return mod(x)

            def backward(y=y, wrt=wrt, go=go):
                return torch.autograd.grad(y, wrt, go, retain_graph=True)

            got["forward"].append(time_nm(forward, repeats=repeats))
            got["backward"].append(time_nm(backward, repeats=repeats))
    return [(op[0], got) for op, got in zip(ops, times)]


def host_blocks() -> tuple[int, int]:
    """This host's oneDNN channel block (16 floats on AVX-512, else 8) and per-core L2 cache in bytes."""
    import os

    import torch

    simd = 16 if torch.backends.cpu.get_cpu_capability().startswith("AVX512") else 8
    try:
        l2 = int(os.sysconf("SC_LEVEL2_CACHE_SIZE"))
    except (ValueError, OSError):
        l2 = 0
    return simd, l2 if l2 > 0 else 1 << 20


def fit_estimators(count: int, seed: int, repeats: int, log: Any = sys.stderr) -> dict[str, dict[str, Any]]:
    """Measure, fit and report every op kind's estimators; ``{"<kind>/<pass>": OpModel.to_dict()}``."""
    import torch

    from agents.sim.estimator import OP_KINDS, fit

    torch.set_num_threads(1)
    simd, l2 = host_blocks()
    models: dict[str, dict[str, Any]] = {}
    for kind in OP_KINDS:
        t0 = time.perf_counter()
        samples = random_samples(kind, count, seed, repeats)
        for phase, pts in samples.items():
            m = fit(kind, phase, pts, seed=seed, simd=simd, l2=l2)
            pc = fit(kind, phase, pts, seed=seed, method="pc")  # Tianshu's, on the same held-out shapes
            models[f"{kind}/{phase}"] = m.to_dict()
            print(f"estimator {kind}/{phase}: held-out error {100 * m.heldout_error:.1f} % (Tianshu's principal "
                  f"component: {100 * pc.heldout_error:.1f} %; {len(pts)} shapes, {time.perf_counter() - t0:.0f} s)",
                  file=log)
    errs = [m["heldout_error"] for m in models.values()]
    print(f"estimator: mean held-out error {100 * sum(errs) / len(errs):.1f} % (accuracy "
          f"{100 - 100 * sum(errs) / len(errs):.1f} %; Tianshu reports 91.9 % on MatMul and its three convolution "
          f"operations, Table 3)", file=log)
    return models

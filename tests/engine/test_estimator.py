"""Tianshu's estimator: the principal component found by search, the fit, the held-out error; N/M differencing."""
from __future__ import annotations

import numpy as np
import pytest

from agents.sim.estimator import OP_KINDS, Estimator, OpModel, features_of, fit
from agents.workloads.layers import layer_table, time_nm


def _samples(kind, truth, n=200, noise=0.02, seed=1):
    g = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        f = {p: float(g.integers(1, 64)) for p in OP_KINDS[kind].params}
        if kind == "Conv2d":  # square kernels and strides, as networks use them
            k, st = float(g.choice([1, 3, 5])), float(g.choice([1, 2]))
            f.update(k_h=k, k_w=k, s_h=st, s_w=st)
        out.append((f, truth(f) * (1 + noise * g.standard_normal())))
    return out


def test_the_search_finds_the_matmul_complexity_and_predicts_held_out_shapes():
    m = fit("Linear", "forward", _samples("Linear", lambda f: 3e-6 + 2e-9 * f["n"] * f["in"] * f["out"]))
    assert m.exponents == (1, 1, 1) and m.form in ("linear", "roofline")  # (roofline: linear plus ~0 memory)
    assert m.heldout_error < 0.04
    assert m.fits["*"].coef[:2] == (pytest.approx(3e-6, rel=0.3), pytest.approx(2e-9, rel=0.05))


def test_a_small_operation_bound_by_its_memory_takes_the_roofline_form():
    # t = 1 us + 1e-11 s per multiply-add + 2e-9 s per element touched: n = 1 is all weights
    truth = lambda f: 1e-6 + 1e-11 * f["n"] * f["in"] * f["out"] + 2e-9 * (f["n"] * f["in"] + f["in"] * f["out"]
                                                                           + f["n"] * f["out"])
    m = fit("Linear", "backward", _samples("Linear", truth, noise=0.01))
    assert m.form == "roofline" and m.exponents == (1, 1, 1)
    assert m.heldout_error < 0.02


def test_the_search_finds_tianshus_eq2_for_a_convolution_strides_inverse():
    truth = lambda f: 1e-9 * f["n"] * f["c_in"] * f["h"] * f["w"] * f["c_out"] * f["k_h"] * f["k_w"] / (f["s_h"] * f["s_w"])
    m = fit("Conv2d", "backward", _samples("Conv2d", truth, noise=0.01))
    assert m.exponents == (1, 1, 1, 1, 1, 1, 1, -1, -1)  # the pooled fit: all modes
    assert m.heldout_error < 0.03
    # kernel sizes and strides select modes: each frequent one has its own fit of the same complexity
    modes = [k for k in m.fits if k != "*"]
    assert modes and all(m.fits[k].exponents[:5] == (1, 1, 1, 1, 1) for k in modes)


def test_a_fitted_model_round_trips_and_estimates_a_real_layer():
    import torch

    m = fit("Linear", "forward", _samples("Linear", lambda f: 1e-9 * f["n"] * f["in"] * f["out"]))
    again = OpModel.from_dict(m.to_dict())
    layer = layer_table(torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 200)), torch.zeros(16, 1, 28, 28))[0]
    assert features_of(layer.kind, dict(layer.config), layer.input_shape) == {"n": 16, "in": 784, "out": 200}
    est = Estimator([again]).layer_seconds(layer, "forward")
    assert est == pytest.approx(1e-9 * 16 * 784 * 200, rel=0.05)
    assert Estimator([again]).layer_seconds(layer, "backward") is None  # not fitted: no guess


def test_nm_differencing_cancels_a_constant_overhead():
    # a fake clock: each call costs 3 units and every timed loop pays 100 units of overhead once
    state = {"t": 0.0}

    def clock():
        state["t"] += 50.0  # half of the overhead at each read
        return state["t"]

    def op():
        state["t"] += 3.0

    assert time_nm(op, n=2, m=10, repeats=3, clock=clock) == pytest.approx(3.0)

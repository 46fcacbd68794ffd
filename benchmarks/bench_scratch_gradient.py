"""One scratch gradient (``Training.gradient_at``): the parameters copied in, loss and gradient, flattened.

Baseline, in the same run: the call sequence before 2026-11-30, which walked the model's modules on every
call (``model.parameters()`` in ``set_flat_params``, ``gradient`` and its device lookup, and ``zero_grad``)
and copied the flat vector in by slices. Both give the same loss and the same gradient to the bit (checked
here); the script prints µs per call of each, and their ratio, for the MLP and the thesis CNN.

usage: python benchmarks/bench_scratch_gradient.py [calls] [batch]   (one torch thread)
"""
from __future__ import annotations

import sys
import time

from _common import load_average  # also puts the repository on sys.path

import torch
import torch.nn.functional as F

from agents.workloads.models import build_model, flat_params, gradient, set_flat_params


def _before(model, flat, x, y):
    """The call sequence before: the modules walked on every call, the vector copied in by slices."""
    params = list(model.parameters())
    offset = 0
    with torch.no_grad():
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
    params = list(model.parameters())
    model.zero_grad(set_to_none=True)
    device = next(model.parameters()).device
    loss = F.cross_entropy(model(x.to(device)), y.to(device))
    grads = torch.autograd.grad(loss, [p for p in params if p.requires_grad], allow_unused=True)
    return loss.item(), torch.cat([g.detach().reshape(-1) for g in grads])


def _now(model, params, flat, x, y):
    """``Training.gradient_at``'s sequence: the parameter list kept by the caller."""
    set_flat_params(model, flat, params)
    loss, grads = gradient(model, x, y, params)
    return loss, torch.cat([g.reshape(-1) for g in grads])


def _us(fn, calls: int) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best / calls * 1e6


def main(argv: list[str]) -> None:
    calls = int(argv[0]) if argv else 400
    batch = int(argv[1]) if len(argv) > 1 else 32
    torch.set_num_threads(1)
    print(f"bench_scratch_gradient: {calls} calls, best of 3, batch {batch}, load average {load_average()}")
    for name in ("mlp", "cnn"):
        model = build_model(name, 0)
        params = list(model.parameters())
        flat = flat_params(model) * 0.5
        x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
        a, b = _before(model, flat, x, y), _now(model, params, flat, x, y)
        assert a[0] == b[0] and torch.equal(a[1], b[1]), "the two sequences must agree to the bit"
        for _ in range(20):  # warm both
            _before(model, flat, x, y)
            _now(model, params, flat, x, y)
        old = _us(lambda: _before(model, flat, x, y), calls)
        new = _us(lambda: _now(model, params, flat, x, y), calls)
        print(f"  {name}: before {old:8.1f} us, now {new:8.1f} us: ratio {old / new:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])

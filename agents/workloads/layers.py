"""A model as a sequence of layers: parameter bytes, forward FLOPs and per-layer timings.

A *layer* is a module that owns parameters directly (a ``Linear``, a ``Conv2d``, a
``GroupNorm``), in the order the forward pass first calls it. Its parameters are the
tensors it owns; a layer-wise strategy sends them as one message each (the
throughput-prediction paper's fine-grained model, §2.2: one communication operation per
DNN layer). Parameter-free work (activations, pooling, functional calls) belongs to no
layer: its time is spread over the layers in proportion to theirs.

:func:`profile_layers` times each layer's forward and backward pass in isolation with
Tianshu's N/M-copies differencing (§3.1, Eq. 1): running an operation N and M times
and taking ``(T_M − T_N) / (M − N)`` cancels every constant overhead (the loop, the
clock read, the Python call), which dominates an operation of a few microseconds.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["Layer", "layer_table", "profile_layers", "time_nm", "LayerTiming", "layer_signature"]


@dataclass(frozen=True)
class Layer:
    """One parameterised layer: its module path, kind, parameter indices and sizes."""

    name: str  # module path in the model ("conv1", "net.1")
    kind: str  # module class name ("Conv2d", "Linear")
    params: tuple[int, ...]  # indices into model.parameters() (flat-vector order)
    param_bytes: int
    forward_flops: float
    input_shape: tuple[int, ...]  # of the first call (batch included)
    config: tuple[tuple[str, Any], ...]  # what sets its cost besides the input: channels, kernel, stride, ...


@dataclass(frozen=True)
class LayerTiming:
    """Seconds of one layer's forward and backward pass on this host."""

    layer: Layer
    forward_s: float
    backward_s: float


_CONFIG_ATTRS = ("in_features", "out_features", "in_channels", "out_channels", "kernel_size", "stride",
                 "padding", "dilation", "groups", "num_groups", "num_channels", "normalized_shape")


def _config(m: nn.Module) -> tuple[tuple[str, Any], ...]:
    out = []
    for a in _CONFIG_ATTRS:
        v = getattr(m, a, None)
        if v is not None:
            out.append((a, tuple(v) if isinstance(v, (list, tuple)) else v))
    return tuple(out)


def layer_signature(layer: Layer, phase: str) -> str:
    """The profile-database key of a layer's ``forward`` or ``backward`` pass (device kind excluded)."""
    cfg = ",".join(f"{k}={v}" for k, v in layer.config)
    shape = "x".join(map(str, layer.input_shape))
    return f"layer_{phase}|{layer.kind}({cfg})|float32({shape})"


_NO_FLOPS = (nn.GroupNorm, nn.LayerNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.Embedding)
"""Layers torch's FlopCounterMode counts no FLOPs for (it counts matrix products and convolutions only)."""


def _own_flops(m: nn.Module, x_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> float | None:
    """What FlopCounterMode counts for one call of ``m``, by formula (None: a kind without one).

    A linear layer is one matrix product, ``2·rows·in·out``; a convolution ``2·n·c_out·(c_in/groups)·k…·out…``
    (torch.utils.flop_counter's ``conv_flop_count``); biases are not counted, as there.
    """
    if isinstance(m, nn.Linear):
        return 2.0 * math.prod(x_shape[:-1]) * m.in_features * m.out_features
    if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)) and len(out_shape) >= 3:
        return 2.0 * x_shape[0] * math.prod(m.weight.shape) * math.prod(out_shape[2:])
    if isinstance(m, _NO_FLOPS):
        return 0.0
    return None


def _forward_hooked(model: nn.Module, sample: torch.Tensor, hooks: list) -> None:
    """One forward pass of ``sample`` without gradients, for its ``hooks``; they are removed however it ends."""
    try:
        with torch.no_grad():
            model(sample)
    finally:
        for h in hooks:
            h.remove()


def layer_table(model: nn.Module, sample: torch.Tensor) -> list[Layer]:
    """The layers of ``model`` in forward order, found by running it once on ``sample`` (a batch).

    Forward FLOPs per layer come from :func:`_own_flops` where every layer has a formula (no need to import
    torch's compiler stack, seconds of `lockstep predict`'s start), else from FlopCounterMode.
    """
    index = {id(p): i for i, p in enumerate(model.parameters())}
    owners = {name: m for name, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))}
    order: list[str] = []
    shapes: dict[str, tuple[int, ...]] = {}
    own: dict[str, float | None] = {}
    hooks = []
    for name, m in owners.items():
        def pre(mod: nn.Module, args: tuple, name: str = name) -> None:
            if name not in shapes:
                order.append(name)
                shapes[name] = tuple(args[0].shape) if args and hasattr(args[0], "shape") else ()

        def post(mod: nn.Module, args: tuple, out: Any, name: str = name) -> None:
            if name in own and own[name] is None:
                return
            x = tuple(args[0].shape) if args and hasattr(args[0], "shape") else ()
            y = tuple(out.shape) if hasattr(out, "shape") else ()
            f = _own_flops(mod, x, y) if x else None
            own[name] = None if f is None else own.get(name, 0.0) + f

        hooks.append(m.register_forward_pre_hook(pre))
        hooks.append(m.register_forward_hook(post))
    _forward_hooked(model, sample, hooks)
    if all(own.get(name) is not None for name in order):
        flops = {name: {"formula": own[name]} for name in order}
    else:
        flops = _counted_flops(model, sample)
    seen: set[int] = set()
    out = []
    for name in order:
        m = owners[name]
        ids = tuple(index[id(p)] for p in m.parameters(recurse=False) if id(p) not in seen)
        seen.update(id(p) for p in m.parameters(recurse=False))
        nbytes = sum(p.numel() * p.element_size() for p in m.parameters(recurse=False))
        counts = flops.get(f"{type(model).__name__}.{name}", flops.get(name, {}))
        out.append(Layer(name, type(m).__name__, ids, nbytes, float(sum(counts.values())), shapes[name],
                         _config(m)))
    unused = [i for i, p in enumerate(model.parameters()) if id(p) not in seen]
    if unused and out:  # parameters no forward call touched still travel: with the last layer
        last = out[-1]
        params = list(model.parameters())
        extra = sum(params[i].numel() * params[i].element_size() for i in unused)
        out[-1] = Layer(last.name, last.kind, last.params + tuple(unused), last.param_bytes + extra,
                        last.forward_flops, last.input_shape, last.config)
    return out


def _counted_flops(model: nn.Module, sample: torch.Tensor) -> dict[str, dict[Any, int]]:
    """Forward FLOPs per module path, as torch's FlopCounterMode counts them (any layer kind)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(sample)
    return counter.get_flop_counts()


def time_nm(fn: Callable[[], Any], n: int = 1, m: int = 4, repeats: int = 5,
            clock: Callable[[], float] = time.thread_time) -> float:
    """Seconds of one ``fn()`` by Tianshu's differencing (Eq. 1): ``(T_M − T_N)/(M − N)``.

    ``M`` grows (doubling) until ``T_M`` is at least 5 ms, so the clock's resolution does not matter.
    ``T_N`` and ``T_M`` are each the fastest of ``repeats`` loops: on a shared machine other processes only
    ever add time (cache and memory contention inflate even this thread's CPU time), so the minimum is the
    estimate least disturbed by them.
    """
    fn()  # warm-up
    while True:
        t0 = clock()
        for _ in range(m):
            fn()
        if clock() - t0 >= 0.005 or m >= 4096:
            break
        m *= 2
    t_n, t_m = float("inf"), float("inf")
    for _ in range(repeats):
        t0 = clock()
        for _ in range(n):
            fn()
        t_n = min(t_n, clock() - t0)
        t0 = clock()
        for _ in range(m):
            fn()
        t_m = min(t_m, clock() - t0)
    return max(0.0, (t_m - t_n) / (m - n))


def profile_layers(model: nn.Module, sample: torch.Tensor, repeats: int = 5,
                   clock: Callable[[], float] = time.thread_time) -> list[LayerTiming]:
    """Forward and backward seconds of every layer of ``model`` at the batch ``sample``, each timed alone."""
    table = layer_table(model, sample)
    owners = dict(model.named_modules())
    inputs: dict[str, torch.Tensor] = {}
    hooks = [owners[l.name].register_forward_pre_hook(
        lambda mod, args, name=l.name: inputs.setdefault(name, args[0].detach().clone()))
        for l in table]
    _forward_hooked(model, sample, hooks)
    out = []
    for i, layer in enumerate(table):
        mod, x = owners[layer.name], inputs[layer.name]
        with torch.no_grad():
            fwd = time_nm(lambda: mod(x), repeats=repeats, clock=clock)
        # the first layer's input is the data: a real backward pass computes no gradient for it
        xg = x.clone().requires_grad_(i > 0 and x.is_floating_point())
        y = mod(xg)
        grad_out = torch.ones_like(y)
        wrt = [p for p in mod.parameters(recurse=False) if p.requires_grad] + ([xg] if xg.requires_grad else [])
        bwd = time_nm(lambda: torch.autograd.grad(y, wrt, grad_out, retain_graph=True), repeats=repeats, clock=clock)
        out.append(LayerTiming(layer, fwd, bwd))
    return out

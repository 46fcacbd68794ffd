"""Layer-wise overlap of computation and communication (``compute.layerwise=true``), wait-free backprop.

The throughput-prediction paper's fine-grained model (§2.2, Fig. 4a) and DDP's buckets:
the parameters travel as one message per layer (forward order), a layer's forward pass
waits only for its own parameters and the previous layer's forward pass, and each layer's
gradient leaves as soon as its backward pass ends (backward order), one message after the
other on the worker's link. The gradient itself is computed for real, once, when all
parameters are in; its modelled duration ``d`` (DESIGN §4.2) is split over the layers by
the plan's per-layer shares (``ComputeSpec.layers``: a device profile's per-layer entries,
its estimator, or FLOPs), and the passes are laid out in virtual time from the arrival of
each layer. A ring all-reduces each layer's gradient as it becomes ready; while one runs,
the backward pass runs at ``1 − compute.allreduce_share`` of its speed (Tianshu §3.3).

Under constant per-layer compute this is Algorithm 2.1's step graph, so the emulation and
:mod:`controller.predict.finegrained` can be compared step for step (docs/predict.md says
where they coincide exactly).
"""
from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["LayerPlan", "layer_plan", "gradient_timeline", "worker_step", "ring_step", "ps_send_params"]


class LayerPlan:
    """The model's layers: the flat-vector indices of each, its shares of a gradient call."""

    def __init__(self, index: list[torch.Tensor], forward: list[float], backward: list[float]):
        self.index, self.forward, self.backward = index, forward, backward

    def __len__(self) -> int:
        return len(self.index)

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [flat[i] for i in self.index]

    def join(self, parts: list[torch.Tensor]) -> torch.Tensor:
        n = sum(int(i.numel()) for i in self.index)
        out = torch.empty(n, dtype=parts[0].dtype)
        for i, p in zip(self.index, parts):
            out[i] = p
        return out


def layer_plan(w: Any) -> LayerPlan:
    """This agent's LayerPlan (built once from the plan's ``ComputeSpec.layers`` and the scratch model)."""
    tr = w.training
    plan = getattr(tr, "_layer_plan", None)
    if plan is None:
        sizes = [p.numel() for p in tr.scratch.parameters()]
        offsets = [0]
        for n in sizes:
            offsets.append(offsets[-1] + n)
        layers = w.env.compute.spec.layers
        index = [torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in l["params"]]) for l in layers]
        plan = tr._layer_plan = LayerPlan(index, [l["forward"] for l in layers], [l["backward"] for l in layers])
    return plan


async def _real_gradient(w: Any, params: torch.Tensor) -> tuple[float, torch.Tensor, int, int, float]:
    """The real gradient on the next batch, and its modelled duration (ns) — no virtual time passes here."""
    x, y = await w.fetch_batch()
    fn = w.training.gradient_at
    t0 = time.perf_counter()
    loss, grad = fn(params, x, y)
    wall = time.perf_counter() - t0
    d = w.env.compute.duration(w, "gradient", fn, (params, x, y), wall, None)
    w.compute_seq += 1
    return loss, grad, len(y), d, wall


def gradient_timeline(arrivals: list[int], plan: LayerPlan, d: int, start: int) -> tuple[list[int], list[int]]:
    """Forward ends and backward ends (per layer, forward order) of a gradient of duration ``d`` ns.

    Forward ``i`` starts at ``max(arrival_i, end of forward i−1)`` (and not before ``start``);
    backward runs from the last layer to the first right after the last forward.
    """
    f_end, t = [], start
    for i, a in enumerate(arrivals):
        t = max(t, a) + round(plan.forward[i] * d)
        f_end.append(t)
    b_end = [0] * len(plan)
    for i in range(len(plan) - 1, -1, -1):
        t += round(plan.backward[i] * d)
        b_end[i] = t
    return f_end, b_end


def _trace_passes(w: Any, arrivals: list[int], plan: LayerPlan, d: int, start: int, wall: float) -> None:
    t = start
    for i, a in enumerate(arrivals):
        t0 = max(t, a)
        t = t0 + round(plan.forward[i] * d)
        w.env.on_compute(w, "gradient", t0, t, wall if i == 0 else 0.0)
    for i in range(len(plan) - 1, -1, -1):
        t0, t = t, t + round(plan.backward[i] * d)
        w.env.on_compute(w, "gradient", t0, t, 0.0)


async def worker_step(w: Any, recv_layer: Any, send_layer: Any) -> tuple[float, torch.Tensor, int, Any]:
    """One PS worker step: receive the layers (``recv_layer(i)`` -> (tensor, meta)), compute, push each gradient.

    ``send_layer(i, grad_slice)`` returns the send handle; the next layer's gradient leaves only when the
    previous one has left the worker's NIC (one connection to the PS, as a real worker has).
    """
    plan = layer_plan(w)
    start = w.now
    parts, arrivals, meta = [], [], None
    for i in range(len(plan)):
        part, meta = await recv_layer(i)
        parts.append(part)
        arrivals.append(w.now)
    params = plan.join(parts)
    loss, grad, samples, d, wall = await _real_gradient(w, params)
    _, b_end = gradient_timeline(arrivals, plan, d, start)
    _trace_passes(w, arrivals, plan, d, start, wall)
    grads = plan.split(grad)
    prev = None
    for i in range(len(plan) - 1, -1, -1):
        if b_end[i] > w.now:
            await w.sleep(b_end[i] - w.now)
        if prev is not None:
            await prev
        prev = send_layer(i, grads[i], loss, samples, meta)
    return loss, grad, samples, meta


async def ring_step(w: Any, allreduce_layer: Any) -> tuple[Any, torch.Tensor, int]:
    """One ring step: compute, all-reduce each layer's gradient as soon as its backward pass ends.

    ``allreduce_layer(i, grad_slice, loss, samples)`` runs the collective (advancing virtual time) and
    returns the summed slice and the summed extras. While it runs, the backward passes still to come
    progress at ``1 − allreduce_share`` of the device's speed; otherwise at full speed.
    """
    plan = layer_plan(w)
    start = w.now
    loss, grad, samples, d, wall = await _real_gradient(w, w.flat())
    share = w.env.compute.spec.allreduce_share
    f_end, _ = gradient_timeline([start] * len(plan), plan, d, start)
    order = list(range(len(plan) - 1, -1, -1))  # backward: last layer first
    left = {i: float(round(plan.backward[i] * d)) for i in order}  # ns of work at full speed
    ends: dict[int, int] = {}
    state = {"clock": f_end[-1], "k": 0}  # backward progress is known up to clock; order[k] is running

    def progress(rate: float, limit: int | None = None, until_layer: int | None = None) -> None:
        while state["k"] < len(order) and (until_layer is None or until_layer not in ends):
            i = order[state["k"]]
            finish = state["clock"] + left[i] / rate
            if limit is not None and finish > limit:
                left[i] -= (limit - state["clock"]) * rate
                state["clock"] = limit
                return
            state["clock"] = round(finish)
            left[i] = 0.0
            ends[i] = state["clock"]
            state["k"] += 1
        if limit is not None and state["clock"] < limit:
            state["clock"] = limit

    t = start
    for i in range(len(plan)):
        w.env.on_compute(w, "gradient", t, f_end[i], wall if i == 0 else 0.0)
        t = f_end[i]
    grads = plan.split(grad)
    summed: list[Any] = [None] * len(plan)
    extras: Any = None
    for i in order:
        progress(1.0, until_layer=i)  # no all-reduce runs between two of them: full speed
        if ends[i] > w.now:
            await w.sleep(ends[i] - w.now)
        progress(1.0, limit=w.now)
        summed[i], extras = await allreduce_layer(i, grads[i], loss, samples)
        progress(1.0 - share, limit=w.now)  # what the backward pass did while the all-reduce ran
    t = f_end[-1]
    for i in order:  # the trace: each backward pass where it ended
        w.env.on_compute(w, "gradient", t, ends[i], 0.0)
        t = ends[i]
    return extras, plan.join(summed), samples


async def ps_send_params(ps: Any, workers: list[str], params: torch.Tensor, meta: tuple) -> None:
    """Send the parameters layer by layer (forward order): under ``fair`` egress every worker's layer ``i``
    together, the next layer once they have left (each worker's connection carries one layer at a time);
    otherwise all at once (a ``fifo`` NIC serialises them worker after worker, in this order)."""
    plan = layer_plan(ps)
    parts = plan.split(params)
    fair = ps.env.network.spec.egress == "fair"
    if fair:
        for i, part in enumerate(parts):
            handles = [ps.send(w, (part, *meta), tag=("p", i)) for w in workers]
            for h in handles:
                await h
        return
    for w in workers:
        for i, part in enumerate(parts):
            ps.send(w, (part, *meta), tag=("p", i))


async def ps_recv_gradient(ps: Any) -> Any:
    """The next complete gradient at a PS: layer messages gathered per worker until one has all of them.

    Returns a Message-like record (``src``, ``payload`` = (grad, version, loss, samples), ``nbytes``) as the
    whole-gradient message would have been.
    """
    from agents.sim.worker import Message

    plan = layer_plan(ps)
    pending = ps.__dict__.setdefault("_layers_in", {})
    while True:
        m = await ps.recv()
        parts = pending.setdefault(m.src, {})
        parts[m.tag[1]] = m
        if len(parts) == len(plan):
            del pending[m.src]
            first = min(parts.values(), key=lambda x: x.sent_at)
            _, version, loss, samples = first.payload
            grad = plan.join([parts[i].payload[0] for i in range(len(plan))])
            out = Message(m.src, ps.name, "grad", (grad, version, loss, samples),
                          sum(x.nbytes for x in parts.values()), first.sent_at, first.seq)
            out.delivered_at = ps.now
            return out

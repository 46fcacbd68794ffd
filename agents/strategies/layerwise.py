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

from agents.checkpoint import continues, finishes

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
    return _gradient_on(w, params, *await w.fetch_batch())


def _gradient_on(w: Any, params: torch.Tensor, x: torch.Tensor, y: torch.Tensor
                 ) -> tuple[float, torch.Tensor, int, int, float]:
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
    return await _WorkerStep(w, recv_layer, send_layer).run()


class _WorkerStep:
    """:func:`worker_step`'s state: the layers received, then the gradient's layers still to send."""

    def __init__(self, w: Any, recv_layer: Any, send_layer: Any):
        self.w, self.recv_layer, self.send_layer = w, recv_layer, send_layer
        self.plan = layer_plan(w)
        self.start = w.now
        self.parts: list[torch.Tensor] = []
        self.arrivals: list[int] = []
        self.meta: Any = None

    async def run(self) -> tuple[float, torch.Tensor, int, Any]:
        while len(self.parts) < len(self.plan):
            self.received(*await self.recv_layer(len(self.parts)))
        return await self.compute()

    def received(self, part: torch.Tensor, meta: Any) -> None:
        self.parts.append(part)
        self.meta = meta
        self.arrivals.append(self.w.now)

    async def compute(self) -> tuple[float, torch.Tensor, int, Any]:
        self.computed(*await _real_gradient(self.w, self.plan.join(self.parts)))
        return await self.push()

    def computed(self, loss: float, grad: torch.Tensor, samples: int, d: int, wall: float) -> None:
        plan = self.plan
        self.result = (loss, grad, samples, self.meta)
        _, self.b_end = gradient_timeline(self.arrivals, plan, d, self.start)
        _trace_passes(self.w, self.arrivals, plan, d, self.start, wall)
        self.grads = plan.split(grad)
        self.prev = None
        self.order = list(range(len(plan) - 1, -1, -1))  # layers still to send, backward order

    async def push(self) -> tuple[float, torch.Tensor, int, Any]:
        while self.order:
            await self.push_next()
        return self.result

    async def push_next(self) -> None:
        """The next layer's gradient leaves once its backward pass ended and the previous one has left."""
        w, i = self.w, self.order[0]
        if self.b_end[i] > w.now:
            await w.sleep(self.b_end[i] - w.now)
        return await self.push_after_previous()

    async def push_after_previous(self) -> None:
        if self.prev is not None:
            await self.prev
        self.pushed()

    def pushed(self) -> None:
        i = self.order.pop(0)
        loss, _, samples, meta = self.result
        self.prev = self.send_layer(i, self.grads[i], loss, samples, meta)


async def ring_step(w: Any, allreduce_layer: Any) -> tuple[Any, torch.Tensor, int]:
    """One ring step: compute, all-reduce each layer's gradient as soon as its backward pass ends.

    ``allreduce_layer(i, grad_slice, loss, samples)`` runs the collective (advancing virtual time) and
    returns the summed slice and the summed extras. While it runs, the backward passes still to come
    progress at ``1 − allreduce_share`` of the device's speed; otherwise at full speed.
    """
    return await _RingStep(w, allreduce_layer).run()


class _RingStep:
    """:func:`ring_step`'s state: the backward passes' progress and the layers all-reduced so far."""

    def __init__(self, w: Any, allreduce_layer: Any):
        self.w, self.allreduce_layer = w, allreduce_layer
        self.plan = layer_plan(w)
        self.start = w.now

    async def run(self) -> tuple[Any, torch.Tensor, int]:
        self.computed(*await _real_gradient(self.w, self.w.flat()))
        return await self.reduce()

    def computed(self, loss: float, grad: torch.Tensor, samples: int, d: int, wall: float) -> None:
        w, plan, start = self.w, self.plan, self.start
        self.loss, self.samples = loss, samples
        self.share = w.env.compute.spec.allreduce_share
        self.f_end, _ = gradient_timeline([start] * len(plan), plan, d, start)
        self.order = list(range(len(plan) - 1, -1, -1))  # backward: last layer first
        self.left = {i: float(round(plan.backward[i] * d)) for i in self.order}  # ns of work at full speed
        self.ends: dict[int, int] = {}
        self.clock, self.k = self.f_end[-1], 0  # backward progress is known up to clock; order[k] is running
        t = start
        for i in range(len(plan)):
            w.env.on_compute(w, "gradient", t, self.f_end[i], wall if i == 0 else 0.0)
            t = self.f_end[i]
        self.grads = plan.split(grad)
        self.summed: list[Any] = [None] * len(plan)
        self.extras: Any = None
        self.j = 0  # order[j]: the next layer to all-reduce

    def progress(self, rate: float, limit: int | None = None, until_layer: int | None = None) -> None:
        order, left, ends = self.order, self.left, self.ends
        while self.k < len(order) and (until_layer is None or until_layer not in ends):
            i = order[self.k]
            finish = self.clock + left[i] / rate
            if limit is not None and finish > limit:
                left[i] -= (limit - self.clock) * rate
                self.clock = limit
                return
            self.clock = round(finish)
            left[i] = 0.0
            ends[i] = self.clock
            self.k += 1
        if limit is not None and self.clock < limit:
            self.clock = limit

    async def reduce(self) -> tuple[Any, torch.Tensor, int]:
        while self.j < len(self.order):
            await self.layer()
            self.j += 1
        return self.finish()

    async def layer(self) -> None:
        """All-reduce layer ``order[j]`` once its backward pass ended."""
        i = self.order[self.j]
        self.progress(1.0, until_layer=i)  # no all-reduce runs between two of them: full speed
        if self.ends[i] > self.w.now:
            await self.w.sleep(self.ends[i] - self.w.now)
        return await self.allreduce(i)

    async def allreduce(self, i: int) -> None:
        self.progress(1.0, limit=self.w.now)
        self.reduced(i, *await self.allreduce_layer(i, self.grads[i], self.loss, self.samples))

    def reduced(self, i: int, total: torch.Tensor, extras: Any) -> None:
        self.summed[i], self.extras = total, extras
        self.progress(1.0 - self.share, limit=self.w.now)  # what the backward pass did while the all-reduce ran

    def finish(self) -> tuple[Any, torch.Tensor, int]:
        t = self.f_end[-1]
        for i in self.order:  # the trace: each backward pass where it ended
            self.w.env.on_compute(self.w, "gradient", t, self.ends[i], 0.0)
            t = self.ends[i]
        return self.extras, self.plan.join(self.summed), self.samples


async def ps_send_params(ps: Any, workers: list[str], params: torch.Tensor, meta: tuple) -> None:
    """Send the parameters layer by layer (forward order): under ``fair`` egress every worker's layer ``i``
    together, the next layer once they have left (each worker's connection carries one layer at a time);
    otherwise all at once (a ``fifo`` NIC serialises them worker after worker, in this order)."""
    plan = layer_plan(ps)
    parts = plan.split(params)
    fair = ps.env.network.spec.egress == "fair"
    if fair:
        await _send_fair(ps, workers, parts, meta)
        return
    for w in workers:
        for i, part in enumerate(parts):
            ps.send(w, (part, *meta), tag=("p", i))


async def _send_fair(ps: Any, workers: list[str], parts: list[torch.Tensor], meta: tuple, i: int = 0,
                     handles: list | None = None) -> None:
    """Layers ``parts[i:]`` to every worker, each once the previous one has left (``handles``: its sends not
    yet awaited)."""
    while handles or i < len(parts):
        if handles:
            await handles.pop(0)
            continue
        handles = [ps.send(w, (parts[i], *meta), tag=("p", i)) for w in workers]
        i += 1


async def ps_recv_gradient(ps: Any) -> Any:
    """The next complete gradient at a PS: layer messages gathered per worker until one has all of them.

    Returns a Message-like record (``src``, ``payload`` = (grad, version, loss, samples), ``nbytes``) as the
    whole-gradient message would have been.
    """
    while True:
        out = _layer_in(ps, await ps.recv())
        if out is not None:
            return out


def _layer_in(ps: Any, m: Any) -> Any:
    """Keep the layer message ``m``; the whole gradient once its sender's layers are all in, else None."""
    from agents.sim.worker import Message

    plan = layer_plan(ps)
    pending = ps.__dict__.setdefault("_layers_in", {})
    parts = pending.setdefault(m.src, {})
    parts[m.tag[1]] = m
    if len(parts) < len(plan):
        return None
    del pending[m.src]
    first = min(parts.values(), key=lambda x: x.sent_at)
    _, version, loss, samples = first.payload
    grad = plan.join([parts[i].payload[0] for i in range(len(plan))])
    out = Message(m.src, ps.name, "grad", (grad, version, loss, samples),
                  sum(x.nbytes for x in parts.values()), first.sent_at, first.seq)
    out.delivered_at = ps.now
    return out


# ------------------------------------------------------------------ checkpoints (agents.checkpoint)
# The rest of each frame above after the await it is suspended in (``below``), in tail-call form: a loop's
# frame goes on from its state object, a step's with what it awaited.
@continues(_real_gradient)
async def _(f: dict[str, Any], batch: Any, below: str) -> tuple[float, torch.Tensor, int, int, float]:
    return _gradient_on(f["w"], f["params"], *batch)


finishes(worker_step)


@continues(_WorkerStep.run)
async def _(f: dict[str, Any], value: Any, below: str) -> tuple[float, torch.Tensor, int, Any]:
    if below == "compute":
        return value
    f["self"].received(*value)
    return await f["self"].run()


@continues(_WorkerStep.compute)
async def _(f: dict[str, Any], value: Any, below: str) -> tuple[float, torch.Tensor, int, Any]:
    if below == "_real_gradient":
        f["self"].computed(*value)
        return await f["self"].push()
    return value


@continues(_WorkerStep.push)
async def _(f: dict[str, Any], value: Any, below: str) -> tuple[float, torch.Tensor, int, Any]:
    return await f["self"].push()


@continues(_WorkerStep.push_next)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    if below == "sleep":
        return await f["self"].push_after_previous()
    return value


@continues(_WorkerStep.push_after_previous)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    f["self"].pushed()


finishes(ring_step)


@continues(_RingStep.run)
async def _(f: dict[str, Any], value: Any, below: str) -> tuple[Any, torch.Tensor, int]:
    if below == "_real_gradient":
        f["self"].computed(*value)
        return await f["self"].reduce()
    return value


@continues(_RingStep.reduce)
async def _(f: dict[str, Any], value: Any, below: str) -> tuple[Any, torch.Tensor, int]:
    f["self"].j += 1
    return await f["self"].reduce()


@continues(_RingStep.layer)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    if below == "sleep":
        return await f["self"].allreduce(f["i"])
    return value


@continues(_RingStep.allreduce)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    f["self"].reduced(f["i"], *value)


finishes(ps_send_params, None)


@continues(_send_fair)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    return await _send_fair(f["ps"], f["workers"], f["parts"], f["meta"], f["i"], f["handles"])


@continues(ps_recv_gradient)
async def _(f: dict[str, Any], m: Any, below: str) -> Any:
    out = _layer_in(f["ps"], m)
    return out if out is not None else await ps_recv_gradient(f["ps"])

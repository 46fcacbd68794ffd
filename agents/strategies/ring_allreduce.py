"""Synchronous data-parallel SGD with a ring all-reduce of the gradients (no parameter server).

Every worker keeps a model replica, computes a gradient, sums the gradients
with a real reduce-scatter + all-gather of ``M/K``-byte chunks
(:func:`~agents.strategies.collective.ring_allreduce`), divides by K and takes
an optimizer step. All replicas stay bit-identical; the result is ``w0``'s,
which also records each global update. With ``compute=constant`` and an
uncontended network a step takes ``T_F+T_B + 2(K−1)·M/(K·B) + 2(K−1)·L + T_S``
(Eq. 11 of the throughput-prediction paper plus one latency per ring step).
``collective: gloo`` runs gloo's own ring instead (segments of at most 1 MiB, two in
flight, each behind its receiver's ready notification: what torch.distributed's gloo
backend does; :func:`~agents.strategies.collective.gloo_ring_allreduce`); ``ideal``
(the default) keeps whole chunks, so Eq. 11 holds exactly. ``segment`` (bytes) cuts
the ideal ring's chunks into segments behind receiver-ready messages.
"""
from __future__ import annotations

from typing import Any

from agents.checkpoint import continues, finishes
from agents.strategies import layerwise
from agents.strategies.base import Strategy, TrainingWorker, VWorkerSpec
from agents.strategies.collective import gloo_barrier, gloo_ring_allreduce, ring_allreduce

__all__ = ["RingAllReduce", "RingWorker"]


class RingWorker(TrainingWorker):
    def __init__(self, name: str, vid: int, env: Any, ring: list[str]):
        super().__init__(name, vid, env)
        self.members = list(ring)

    async def allreduce(self, vec, tag: str, extras: list[float]):
        """The ring's sum of ``vec`` (and ``extras``) with the configured collective: ideal or gloo."""
        if self.setting("collective", "ideal") == "gloo":
            return await gloo_ring_allreduce(self, vec, self.members, tag, extras)
        return await ring_allreduce(self, vec, self.members, tag, extras, self.setting("segment"))

    async def run(self) -> None:
        self.make_model()
        self.version = 0
        if self.setting("collective", "ideal") == "gloo" and not self.restarted:
            gloo_barrier(self, self.members)  # the program's dist.barrier() before its first all-reduce
        await self.start_late(self.members[0])
        return await self._train()

    async def _train(self) -> None:
        if self.env.compute.spec.layerwise:  # an all-reduce per layer as its gradient is ready (DDP's buckets)
            return await self.repeat(self._step_layerwise)
        return await self.repeat(self._step)

    async def _step(self) -> bool:
        """One step: a gradient, summed over the ring, and an update with the mean; True when the run stops."""
        return await self._reduce(*await self.gradient(self.flat()))

    async def _reduce(self, loss: float, grad, samples: int) -> bool:
        total, extras, sent = await self.allreduce(grad, f"r{self.version}", [loss, samples])
        return await self._descend(total, extras, sent)

    async def _descend(self, total, extras: list[float], sent: int) -> bool:
        await self.apply(total / len(self.members))
        return self._stepped(extras, sent)

    def _stepped(self, extras: list[float], sent: int) -> bool:
        """A global update: the ring's first member records it (``extras``: the ring's loss and sample sums)."""
        self.version += 1
        loss_sum, n = extras
        return self.name == self.members[0] and self.updated(self.version, loss_sum / len(self.members), 0, int(n),
                                                             sent)

    async def _step_layerwise(self) -> bool:
        """One step with an all-reduce per layer (:func:`layerwise.ring_step`); True when the run stops."""
        self._sent = 0
        extras, total, _ = await layerwise.ring_step(self, self._allreduce_layer)
        return await self._descend(total, extras, self._sent)

    async def _allreduce_layer(self, i: int, g, loss: float, samples: int):
        return self._layer_reduced(*await self.allreduce(g, f"r{self.version}.{i}", [loss, samples]))

    def _layer_reduced(self, total, extras: list[float], sent: int):
        self._sent += sent
        return total, extras


class RingAllReduce(Strategy):
    name = "ring_allreduce"
    result = "w0"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        ring = [f"w{i}" for i in range(workers)]
        return [VWorkerSpec(w, f"{__name__}.RingWorker", {"ring": ring}, holds_data=True) for w in ring]


# ------------------------------------------------------------------ checkpoints (agents.checkpoint)
# The rest of each frame above after the await it is suspended in (``below``), in tail-call form.
finishes(RingWorker.allreduce)


@continues(RingWorker.run)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    if below == "start_late":
        return await f["self"]._train()


finishes(RingWorker._train)


@continues(RingWorker._step)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "gradient":
        return await f["self"]._reduce(*value)
    return value


@continues(RingWorker._reduce)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "allreduce":
        return await f["self"]._descend(*value)
    return value


@continues(RingWorker._descend)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    return f["self"]._stepped(f["extras"], f["sent"])


@continues(RingWorker._step_layerwise)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "ring_step":
        extras, total, _ = value
        return await f["self"]._descend(total, extras, f["self"]._sent)
    return value


@continues(RingWorker._allreduce_layer)
async def _(f: dict[str, Any], value: Any, below: str) -> Any:
    return f["self"]._layer_reduced(*value)

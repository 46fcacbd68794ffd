"""Synchronous data-parallel SGD with a ring all-reduce of the gradients (no parameter server).

Every worker keeps a model replica, computes a gradient, sums the gradients
with a real reduce-scatter + all-gather of ``M/K``-byte chunks
(:func:`~agents.strategies.collective.ring_allreduce`), divides by K and takes
an optimizer step. All replicas stay bit-identical; the result is ``w0``'s,
which also records each global update. With ``compute=constant`` and an
uncontended network a step takes ``T_F+T_B + 2(K−1)·M/(K·B) + 2(K−1)·L + T_S``
(Eq. 11 of the throughput-prediction paper plus one latency per ring step).
Setting ``segment`` (bytes) sends each chunk in segments behind receiver-ready
messages, like gloo.
"""
from __future__ import annotations

from typing import Any

from agents.strategies import layerwise
from agents.strategies.base import Strategy, TrainingWorker, VWorkerSpec
from agents.strategies.collective import ring_allreduce

__all__ = ["RingAllReduce", "RingWorker"]


class RingWorker(TrainingWorker):
    def __init__(self, name: str, vid: int, env: Any, ring: list[str]):
        super().__init__(name, vid, env)
        self.ring = list(ring)

    async def run(self) -> None:
        self.make_model()
        k, version = len(self.ring), 0
        segment = self.setting("segment")
        if self.env.compute.spec.layerwise:  # an all-reduce per layer as its gradient is ready (DDP's buckets)
            while True:
                sent = 0

                async def allreduce_layer(i, g, loss, samples):
                    nonlocal sent
                    total, extras, n = await ring_allreduce(self, g, self.ring, f"r{version}.{i}", [loss, samples],
                                                            segment)
                    sent += n
                    return total, extras

                (loss_sum, n), total, _ = await layerwise.ring_step(self, allreduce_layer)
                await self.apply(total / k)
                version += 1
                if self.name == self.ring[0] and self.updated(version, loss_sum / k, 0, int(n), sent):
                    return
        while True:
            loss, grad, samples = await self.gradient(self.flat())
            total, (loss_sum, n), sent = await ring_allreduce(self, grad, self.ring, f"r{version}",
                                                            [loss, samples], segment)
            await self.apply(total / k)
            version += 1
            if self.name == self.ring[0] and self.updated(version, loss_sum / k, 0, int(n), sent):
                return


class RingAllReduce(Strategy):
    name = "ring_allreduce"
    result = "w0"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        ring = [f"w{i}" for i in range(workers)]
        return [VWorkerSpec(w, f"{__name__}.RingWorker", {"ring": ring}, holds_data=True) for w in ring]

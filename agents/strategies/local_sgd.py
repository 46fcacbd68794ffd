"""Local SGD (periodic model averaging): H local steps per worker, then a ring all-reduce of the models.

Each worker trains its own replica for ``local_steps`` (H) steps, then the
replicas are averaged with a real ring all-reduce of the parameters. A global
update is one averaging round; ``w0`` records it (mean loss over all workers'
local steps, samples of all workers) and holds the result model. H = 1 with
plain SGD is a synchronous all-reduce of models instead of gradients.
"""
from __future__ import annotations

from typing import Any

from agents.strategies.base import Strategy, VWorkerSpec
from agents.strategies.ring_allreduce import RingWorker

__all__ = ["LocalSGD", "LocalWorker"]


class LocalWorker(RingWorker):
    """A ring member that takes ``local_steps`` steps alone between all-reduces of the models."""

    async def run(self) -> None:
        self.make_model()
        k, version = len(self.members), 0
        await self.start_late(self.members[0])
        steps = int(self.setting("local_steps", 4))
        while True:
            loss_sum, n = 0.0, 0
            for _ in range(steps):
                loss, grad, samples = await self.gradient(self.flat())
                await self.apply(grad)
                loss_sum, n = loss_sum + loss, n + samples
            total, (loss_all, n_all), sent = await self.allreduce(self.flat(), f"l{version}", [loss_sum / steps, n])
            self.load(total / k)
            version += 1
            if self.name == self.members[0] and self.updated(version, loss_all / k, 0, int(n_all), sent):
                return


class LocalSGD(Strategy):
    name = "local_sgd"
    result = "w0"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        steps = settings.get("local_steps", 4)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"strategy.local_steps={steps!r} is not valid; accepted: an integer >= 1")
        ring = [f"w{i}" for i in range(workers)]
        return [VWorkerSpec(w, f"{__name__}.LocalWorker", {"ring": ring}, holds_data=True) for w in ring]

"""Local SGD (periodic model averaging): H local steps per worker, then a ring all-reduce of the models.

Each worker trains its own replica for ``local_steps`` (H) steps, then the
replicas are averaged with a real ring all-reduce of the parameters. A global
update is one averaging round; ``w0`` records it (mean loss over all workers'
local steps, samples of all workers) and holds the result model. H = 1 with
plain SGD is a synchronous all-reduce of models instead of gradients.
"""
from __future__ import annotations

from typing import Any

from agents.checkpoint import continues, finishes
from agents.strategies.base import Strategy, VWorkerSpec
from agents.strategies.ring_allreduce import RingWorker

__all__ = ["LocalSGD", "LocalWorker"]


class LocalWorker(RingWorker):
    """A ring member that takes ``local_steps`` steps alone between all-reduces of the models."""

    async def _train(self) -> None:
        return await self.repeat(self._step)

    async def _step(self) -> bool:
        """One round: ``local_steps`` local steps, then the ring's mean of the models; True when the run stops."""
        steps = int(self.setting("local_steps", 4))
        return await self._average(steps, await self.train_local(steps))

    async def _average(self, steps: int, acc: tuple[int, float, int]) -> bool:
        _, loss_sum, n = acc
        return self._averaged(*await self.allreduce(self.flat(), f"l{self.version}", [loss_sum / steps, n]))

    def _averaged(self, total, extras: list[float], sent: int) -> bool:
        self.load(total / len(self.members))
        return self._stepped(extras, sent)


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


# ------------------------------------------------------------------ checkpoints (agents.checkpoint)
# The rest of each frame above after the await it is suspended in (``below``), in tail-call form; the
# frames LocalWorker shares with RingWorker (run, _descend, ...) continue as RingWorker's.
finishes(LocalWorker._train)


@continues(LocalWorker._step)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "train_local":
        return await f["self"]._average(f["steps"], value)
    return value


@continues(LocalWorker._average)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    return f["self"]._averaged(*value)

"""Plain single-worker SGD: the baseline every strategy reduces to with one worker."""
from __future__ import annotations

from typing import Any

from agents.checkpoint import continues, finishes
from agents.strategies.base import Strategy, TrainingWorker, VWorkerSpec

__all__ = ["SGD", "Learner"]


class Learner(TrainingWorker):
    async def run(self) -> None:
        self.make_model()
        self.version = 0
        await self.repeat(self._step)

    async def _step(self) -> bool:
        """One gradient and one update; True when the run stops."""
        return self._applied(*await self.local_step())

    def _applied(self, loss: float, samples: int) -> bool:
        self.version += 1
        return self.updated(self.version, loss, 0, samples, 0)


class SGD(Strategy):
    name = "sgd"
    result = "w0"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        return [VWorkerSpec("w0", f"{__name__}.Learner", {}, holds_data=True)]


# ------------------------------------------------------------------ checkpoints (agents.checkpoint)
# The rest of each frame above after the await it is suspended in (``below``), in tail-call form.
finishes(Learner.run, None)


@continues(Learner._step)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    return f["self"]._applied(*value)

"""Plain single-worker SGD: the baseline every strategy reduces to with one worker."""
from __future__ import annotations

from typing import Any

from agents.strategies.base import Strategy, TrainingWorker, VWorkerSpec

__all__ = ["SGD", "Learner"]


class Learner(TrainingWorker):
    async def run(self) -> None:
        self.make_model()
        version = 0
        while True:
            loss, grad, samples = await self.gradient(self.training.flat(self.model))
            await self.apply(grad)
            version += 1
            if self.updated(version, loss, 0, samples, 0):
                return


class SGD(Strategy):
    name = "sgd"
    result = "w0"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        return [VWorkerSpec("w0", f"{__name__}.Learner", {}, holds_data=True)]

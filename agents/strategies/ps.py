"""Parameter-server SGD, synchronous and asynchronous, with one PS vworker (``ps0``).

The PS sends the parameters down, workers send gradients up, the PS applies
them with a torch optimizer. Synchronous: the PS waits for all K gradients,
averages them (in worker order) and broadcasts; with K workers of batch b this
equals plain SGD with batch K·b (DESIGN §5, golden equivalences). Asynchronous:
every gradient is applied when it arrives and only its sender gets the new
parameters; staleness = updates applied since the parameters it used.
"""
from __future__ import annotations

from typing import Any

from agents.statelog import log_model, log_result, log_version
from agents.strategies.base import Strategy, TrainingWorker, VWorkerSpec

__all__ = ["PSSync", "PSAsync", "ParameterServer", "PSWorker"]


class ParameterServer(TrainingWorker):
    def __init__(self, name: str, vid: int, env: Any, workers: list[str], sync: bool):
        super().__init__(name, vid, env)
        self.workers, self.sync = list(workers), sync
        self.version = 0

    async def run(self) -> None:
        self.make_model()
        params = self.training.flat(self.model)
        log_version(self, 0, params)
        for w in self.workers:
            self.send(w, (params, 0), tag="params")
        if self.sync:
            await self._run_sync()
        else:
            await self._run_async()

    async def _run_async(self) -> None:
        while True:
            m = await self.recv(tag="grad")
            grad, version, loss, samples = m.payload
            staleness = self.version - version
            await self.apply(grad)
            self.version += 1
            log_version(self, self.version, lambda: self.training.flat(self.model))
            log_result(self, m, version, loss, staleness, self.version)
            if self.updated(self.version, loss, staleness, samples, m.nbytes):
                return
            self.send(m.src, (self.training.flat(self.model), self.version), tag="params")

    async def _run_sync(self) -> None:
        order = {w: i for i, w in enumerate(self.workers)}
        while True:
            msgs = [await self.recv(tag="grad") for _ in self.workers]
            msgs.sort(key=lambda m: order[m.src])  # summation order fixed by worker, not arrival
            grad = await self.aggregate([m.payload[0] for m in msgs])
            await self.apply(grad)
            self.version += 1
            loss = sum(m.payload[2] for m in msgs) / len(msgs)
            samples = sum(m.payload[3] for m in msgs)
            log_version(self, self.version, lambda: self.training.flat(self.model))
            for m in msgs:
                log_result(self, m, m.payload[1], m.payload[2], self.version - 1 - m.payload[1], self.version)
            if self.updated(self.version, loss, 0, samples, sum(m.nbytes for m in msgs)):
                return
            params = self.training.flat(self.model)
            for w in self.workers:
                self.send(w, (params, self.version), tag="params")


class PSWorker(TrainingWorker):
    def __init__(self, name: str, vid: int, env: Any, ps: str):
        super().__init__(name, vid, env)
        self.ps = ps

    async def run(self) -> None:
        while True:
            m = await self.recv(src=self.ps, tag="params")
            params, version = m.payload
            log_model(self, m, version)
            loss, grad, samples = await self.gradient(params)
            self.send(self.ps, (grad, version, loss, samples), tag="grad")


class _PS(Strategy):
    sync = False
    result = "ps0"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        names = [f"w{i}" for i in range(workers)]
        specs = [VWorkerSpec(n, f"{__name__}.PSWorker", {"ps": "ps0"}, holds_data=True) for n in names]
        specs.append(VWorkerSpec("ps0", f"{__name__}.ParameterServer", {"workers": names, "sync": cls.sync}))
        return specs


class PSSync(_PS):
    name = "ps_sync"
    sync = True


class PSAsync(_PS):
    name = "ps_async"
    sync = False

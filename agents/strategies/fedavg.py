"""Federated averaging (McMahan et al., AISTATS 2017) with client sampling per round.

Round r: the server draws ``max(1, round(fraction·K))`` clients with the keyed
draw ``(seed, "fedavg", r)``, sends them the global model, each trains locally
(``local_steps`` steps, or else ``local_epochs`` epochs over its shard) with a
fresh optimizer, and returns its model; the server sets the global model to
``Σ n_k/n · w_k`` in client order, with n_k the client's shard size
(``weighting: data``), the samples it trained on this round (``samples``) or 1
(``uniform``). With one local step, all clients and equal shards this is
synchronous PS SGD (a test pins it).
"""
from __future__ import annotations

from typing import Any

import torch

from agents.sim import keyed
from agents.strategies.base import Strategy, TrainingWorker, VWorkerSpec

__all__ = ["FedAvg", "FedServer", "FedClient", "sample_clients"]

WEIGHTINGS = ("data", "samples", "uniform")


def sample_clients(seed: int, rnd: int, clients: int, fraction: float) -> list[int]:
    """The sorted client indices of round ``rnd`` (keyed: the same on every agent and rerun)."""
    m = max(1, min(clients, int(round(fraction * clients))))
    if m == clients:
        return list(range(clients))
    return sorted(int(i) for i in keyed.generator(seed, "fedavg", rnd).choice(clients, m, replace=False))


class FedClient(TrainingWorker):
    """Receives a model, trains it locally, sends it back with (version, mean loss, samples, weight)."""

    def __init__(self, name: str, vid: int, env: Any, server: str):
        super().__init__(name, vid, env)
        self.server = server

    def local_steps(self) -> int:
        steps = self.setting("local_steps")
        if steps is not None:
            return int(steps)
        return int(self.setting("local_epochs", 1)) * max(1, self.training.shard_size(self.name)
                                                          // self.training.batch_size(self.name))

    async def run(self) -> None:
        spec = self.training.spec
        steps = self.local_steps()
        shard = self.training.shard_size(self.name)
        while True:
            m = await self.recv(src=self.server, tag="model")
            params, version = m.payload
            self.load(params)
            self.opt = torch.optim.SGD(self.model.parameters(), lr=spec.lr, momentum=spec.momentum)
            loss_sum, n = 0.0, 0
            for _ in range(steps):
                loss, grad, samples = await self.gradient(self.flat())
                await self.apply(grad)
                loss_sum, n = loss_sum + loss, n + samples
            self.send(self.server, (self.flat(), version, loss_sum / steps, n, shard), tag="update")
            if not any(True for _ in self.model.buffers()):
                # compact between rounds: a client holds no model while it waits (100 000 clients, 100 a
                # round, keep 100 models, not one per client ever sampled); the next round loads a fresh one
                self.model = self.opt = None


class FedServer(TrainingWorker):
    def __init__(self, name: str, vid: int, env: Any, clients: list[str]):
        super().__init__(name, vid, env)
        self.clients = list(clients)
        self.history: list[list[int]] = []  # the clients of each round

    async def run(self) -> None:
        self.make_model()
        fraction = float(self.setting("fraction", 1.0))
        weighting = self.setting("weighting", "data")
        if weighting not in WEIGHTINGS:
            raise ValueError(f"strategy.weighting={weighting!r}; accepted: {' | '.join(WEIGHTINGS)}")
        order = {c: i for i, c in enumerate(self.clients)}
        rnd = 0
        while True:
            chosen = [self.clients[i] for i in sample_clients(self.env.seed, rnd, len(self.clients), fraction)]
            self.history.append([order[c] for c in chosen])
            params = self.flat()
            for c in chosen:
                self.send(c, (params, rnd), tag="model")
            msgs = [await self.recv(tag="update") for _ in chosen]
            msgs.sort(key=lambda m: order[m.src])
            weights = [1.0 if weighting == "uniform" else float(m.payload[3] if weighting == "samples" else m.payload[4])
                       for m in msgs]
            self.load(await self.aggregate([m.payload[0] for m in msgs], weights))
            rnd += 1
            total = sum(weights)
            loss = sum(w * m.payload[2] for w, m in zip(weights, msgs)) / total
            if self.updated(rnd, loss, 0, sum(m.payload[3] for m in msgs), sum(m.nbytes for m in msgs)):
                return


class FedAvg(Strategy):
    name = "fedavg"
    result = "server"
    server_cls = "FedServer"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        clients = [f"c{i}" for i in range(workers)]
        specs = [VWorkerSpec(c, f"{__name__}.FedClient", {"server": "server"}, holds_data=True) for c in clients]
        specs.append(VWorkerSpec("server", f"{cls.__module__}.{cls.server_cls}", {"clients": clients}))
        return specs

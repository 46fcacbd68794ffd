"""Gossip SGD / D-PSGD (Lian et al., NIPS 2017): no server, each worker averages with its graph neighbours.

Step of worker i: compute the gradient g_i at its parameters x_i, send x_i to
every neighbour, and set ``x_i ← mean(x_i, x_j for neighbours j) − lr·g_i``
(uniform weights 1/(deg+1), a doubly stochastic matrix on a regular graph).
``topology: ring`` links i to i±1; ``topology: random`` is a random
``degree``-regular graph drawn with the keyed draw ``(seed, "gossip")``: a
circulant graph (offsets ±1…±degree/2, plus the antipode for odd degrees) over a
keyed permutation of the workers, so it is the same on every agent and rerun.
``w0`` records its own steps and holds the result model.
"""
from __future__ import annotations

from typing import Any

from agents.sim import keyed
from agents.strategies.base import Strategy, TrainingWorker, VWorkerSpec

__all__ = ["Gossip", "GossipWorker", "neighbours"]


def neighbours(workers: int, topology: str, degree: int, seed: int) -> list[list[int]]:
    """Sorted neighbour lists of a ``ring`` or keyed ``random`` ``degree``-regular graph."""
    k = workers
    if topology == "ring":
        return [sorted({(i - 1) % k, (i + 1) % k} - {i}) for i in range(k)]
    if topology != "random":
        raise ValueError(f"strategy.topology={topology!r} is not valid; accepted: ring | random")
    if not 1 <= degree < k or (degree % 2 == 1 and k % 2 == 1):
        raise ValueError(f"strategy.degree={degree} is not valid for {k} workers; accepted: 1 <= degree < "
                         f"workers, and an even degree when the number of workers is odd")
    perm = [int(x) for x in keyed.generator(seed, "gossip").permutation(k)]
    pos = {v: p for p, v in enumerate(perm)}
    offsets = list(range(1, degree // 2 + 1))
    out = []
    for i in range(k):
        p = pos[i]
        nb = {perm[(p + o) % k] for o in offsets} | {perm[(p - o) % k] for o in offsets}
        if degree % 2:
            nb.add(perm[(p + k // 2) % k])
        out.append(sorted(nb - {i}))
    return out


class GossipWorker(TrainingWorker):
    def __init__(self, name: str, vid: int, env: Any, peers: list[str]):
        super().__init__(name, vid, env)
        self.peers = list(peers)

    async def run(self) -> None:
        self.make_model()
        version = 0
        while True:
            x = self.flat()
            loss, grad, samples = await self.gradient(x)
            tag = f"g{version}"
            for p in self.peers:
                self.send(p, x, tag=tag)
            got = [(await self.recv(src=p, tag=tag)).payload for p in self.peers]
            self.load(await self.aggregate([x, *got]))
            await self.apply(grad)
            version += 1
            if self.name == "w0" and self.updated(version, loss, 0, samples, len(self.peers) * x.numel() * 4):
                return


class Gossip(Strategy):
    name = "gossip"
    result = "w0"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        topo = settings.get("topology") or "ring"
        degree = settings.get("degree") or 2
        nb = neighbours(workers, topo, int(degree), int(settings.get("graph_seed") or 0))
        return [VWorkerSpec(f"w{i}", f"{__name__}.GossipWorker", {"peers": [f"w{j}" for j in nb[i]]},
                            holds_data=True) for i in range(workers)]

"""Gossip SGD / D-PSGD (Lian et al., NIPS 2017): no server, each worker averages with its graph neighbours.

Step of worker i: compute the gradient g_i at its parameters x_i, send x_i to
every neighbour, and set ``x_i ← mean(x_i, x_j for neighbours j) − lr·g_i``
(uniform weights 1/(deg+1), a doubly stochastic matrix on a regular graph).
``topology: ring`` links i to i±1; ``topology: random`` is a random
``degree``-regular graph drawn with the keyed draw ``(seed, "gossip")``: a
circulant graph (offsets ±1…±degree/2, plus the antipode for odd degrees) over a
keyed permutation of the workers, so it is the same on every agent and rerun.
``w0`` records its steps, each for the step of that number of all K workers (their samples; the
bytes it sent, as ``ring_allreduce`` counts them), and holds the result model.
"""
from __future__ import annotations

from typing import Any

from agents.checkpoint import continues, finishes
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
        self.version = 0
        await self.repeat(self._step)

    async def _step(self) -> bool:
        """One step: a gradient at x_i, x_i to the neighbours, the mean with theirs, the update; True when the run
        stops."""
        x = self.flat()
        return await self._gossip(x, *await self.gradient(x))

    async def _gossip(self, x, loss: float, grad, samples: int) -> bool:
        tag = f"g{self.version}"
        for p in self.peers:
            self.send(p, x, tag=tag)
        return await self._average(x, await self._neighbours(tag), loss, grad, samples)

    async def _neighbours(self, tag: str, got: list | None = None) -> list:
        """The neighbours' parameters of this step, in neighbour order (``got``: those already received)."""
        got = [] if got is None else got
        while len(got) < len(self.peers):
            got.append((await self.recv(src=self.peers[len(got)], tag=tag)).payload)
        return got

    async def _average(self, x, got: list, loss: float, grad, samples: int) -> bool:
        return await self._descend(await self.aggregate([x, *got]), grad, loss, samples)

    async def _descend(self, mean, grad, loss: float, samples: int) -> bool:
        self.load(mean)
        await self.apply(grad)
        return self._stepped(loss, mean)

    def _stepped(self, loss: float, mean) -> bool:
        """A step; ``w0``'s is a row: the samples of every worker's step of that number, the bytes ``w0`` sent.

        Each worker's step v takes one full batch (a BatchStream drops the ragged tail) and needs its
        neighbours' parameters of step v, so w0's step v stands for step v of all K workers, as a ring's round
        does: the row counts their batches from the plan (no peer's values are read) and, as the ring, the
        bytes this worker sent."""
        self.version += 1
        if self.name != "w0":
            return False
        round_samples = sum(self.training.spec.batch_size)  # one batch per data holder: every worker
        return self.updated(self.version, loss, 0, round_samples,
                            len(self.peers) * mean.numel() * mean.element_size())


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


# ------------------------------------------------------------------ checkpoints (agents.checkpoint)
# The rest of each frame above after the await it is suspended in (``below``), in tail-call form.
finishes(GossipWorker.run, None)


@continues(GossipWorker._step)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "gradient":
        return await f["self"]._gossip(f["x"], *value)
    return value


@continues(GossipWorker._gossip)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "_neighbours":
        return await f["self"]._average(f["x"], value, f["loss"], f["grad"], f["samples"])
    return value


@continues(GossipWorker._neighbours)
async def _(f: dict[str, Any], m: Any, below: str) -> list:
    f["got"].append(m.payload)
    return await f["self"]._neighbours(f["tag"], f["got"])


@continues(GossipWorker._average)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "aggregate":
        return await f["self"]._descend(value, f["grad"], f["loss"], f["samples"])
    return value


@continues(GossipWorker._descend)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    return f["self"]._stepped(f["loss"], f["mean"])

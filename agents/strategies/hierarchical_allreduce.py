"""Hierarchical all-reduce: reduce inside groups, ring all-reduce between group leaders, broadcast back.

Groups are ``group_size`` consecutive workers (``w0…`` in order); the first of
each group is its leader. Members send their gradient to the leader, which sums
its group (in member order), joins a ring all-reduce with the other leaders,
and sends the global mean back; every worker then steps its own replica.
This is the two-level scheme of e.g. Horovod's hierarchical all-reduce (NCCL
inside a node, a ring between nodes).
"""
from __future__ import annotations

from typing import Any

from agents.strategies.base import Strategy, TrainingWorker, VWorkerSpec
from agents.strategies.collective import gloo_ring_allreduce, ring_allreduce

__all__ = ["HierarchicalAllReduce", "HierarchicalWorker"]


def _add(a, b):
    return a + b


class HierarchicalWorker(TrainingWorker):
    def __init__(self, name: str, vid: int, env: Any, group: list[str], leaders: list[str], workers: int):
        super().__init__(name, vid, env)
        self.group, self.leaders, self.k = list(group), list(leaders), workers

    async def run(self) -> None:
        self.make_model()
        leader, version = self.group[0], 0
        await self.start_late(self.leaders[0])
        segment = self.setting("segment")
        gloo = self.setting("collective", "ideal") == "gloo"
        while True:
            loss, grad, samples = await self.gradient(self.flat())
            tag = f"h{version}"
            if self.name != leader:
                self.send(leader, (grad, loss, samples), tag=tag + ".up")
                m = await self.recv(src=leader, tag=tag + ".down")
                mean = m.payload
                await self.apply(mean)
                version += 1
                continue
            total, loss_sum, n, sent = grad, loss, samples, 0
            for member in self.group[1:]:  # summation in member order, whatever the arrival order
                m = await self.recv(src=member, tag=tag + ".up")
                total = await self.compute(_add, total, m.payload[0], kind="aggregate", cost=float(grad.numel()))
                loss_sum, n = loss_sum + m.payload[1], n + m.payload[2]
            if gloo:
                total, (loss_sum, n), sent = await gloo_ring_allreduce(self, total, self.leaders, tag, [loss_sum, n])
            else:
                total, (loss_sum, n), sent = await ring_allreduce(self, total, self.leaders, tag, [loss_sum, n],
                                                                segment)
            mean = total / self.k
            for member in self.group[1:]:
                self.send(member, mean, tag=tag + ".down")
                sent += mean.numel() * mean.element_size()
            await self.apply(mean)
            version += 1
            if self.name == self.leaders[0] and self.updated(version, loss_sum / self.k, 0, int(n), sent):
                return


class HierarchicalAllReduce(Strategy):
    name = "hierarchical_allreduce"
    result = "w0"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        size = settings.get("group_size") or 4
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"strategy.group_size={size!r} is not valid; accepted: an integer >= 1")
        names = [f"w{i}" for i in range(workers)]
        groups = [names[i:i + size] for i in range(0, workers, size)]
        leaders = [g[0] for g in groups]
        return [VWorkerSpec(w, f"{__name__}.HierarchicalWorker",
                            {"group": g, "leaders": leaders, "workers": workers}, holds_data=True)
                for g in groups for w in g]



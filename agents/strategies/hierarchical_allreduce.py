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

from agents.checkpoint import continues, finishes
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
        self.version = 0
        await self.start_late(self.leaders[0])
        return await self.repeat(self._step)

    async def _step(self) -> bool:
        """One step: a gradient, the global mean of the gradients, an update; True when the run stops."""
        return await self._reduce(*await self.gradient(self.flat()))

    async def _reduce(self, loss: float, grad, samples: int) -> bool:
        tag, mine = f"h{self.version}", (grad, loss, samples)
        if self.name != self.group[0]:  # a member: the leader sums, all-reduces and sends the mean back
            self.send(self.group[0], mine, tag=tag + ".up")
            m = await self.recv(src=self.group[0], tag=tag + ".down")
            return await self._descend(m.payload, None, 0)
        return await self._lead(tag, await self._sum_group(tag, mine))

    async def _sum_group(self, tag: str, acc: tuple, i: int = 1) -> tuple:
        """The leader's sum of ``acc`` (gradient, loss, samples) and its members' from ``group[i]`` on, in member
        order whatever the arrival order."""
        while i < len(self.group):
            acc = await self._add_member(tag, acc, self.group[i])
            i += 1
        return acc

    async def _add_member(self, tag: str, acc: tuple, member: str) -> tuple:
        m = await self.recv(src=member, tag=tag + ".up")
        return await self._add_sum(acc, m.payload)

    async def _add_sum(self, acc: tuple, theirs: tuple) -> tuple:
        return _summed(acc, theirs, await self.compute(_add, acc[0], theirs[0], kind="aggregate",
                                                       cost=float(acc[0].numel())))

    async def _lead(self, tag: str, acc: tuple) -> bool:
        """The leaders' ring all-reduce of their groups' sums, then the mean to the group."""
        total, loss_sum, n = acc
        if self.setting("collective", "ideal") == "gloo":
            reduced = await gloo_ring_allreduce(self, total, self.leaders, tag, [loss_sum, n])
        else:
            reduced = await ring_allreduce(self, total, self.leaders, tag, [loss_sum, n], self.setting("segment"))
        return await self._broadcast(tag, *reduced)

    async def _broadcast(self, tag: str, total, extras: list[float], sent: int) -> bool:
        mean = total / self.k
        for member in self.group[1:]:
            self.send(member, mean, tag=tag + ".down")
            sent += mean.numel() * mean.element_size()
        return await self._descend(mean, extras, sent)

    async def _descend(self, mean, extras: list[float] | None, sent: int) -> bool:
        await self.apply(mean)
        return self._stepped(extras, sent)

    def _stepped(self, extras: list[float] | None, sent: int) -> bool:
        """A global update: the first leader records it (``extras``: the loss and sample sums of all workers)."""
        self.version += 1
        if self.name != self.leaders[0]:
            return False
        loss_sum, n = extras
        return self.updated(self.version, loss_sum / self.k, 0, int(n), sent)


def _summed(acc: tuple, theirs: tuple, total) -> tuple:
    return total, acc[1] + theirs[1], acc[2] + theirs[2]


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


# ------------------------------------------------------------------ checkpoints (agents.checkpoint)
# The rest of each frame above after the await it is suspended in (``below``), in tail-call form.
@continues(HierarchicalWorker.run)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    if below == "start_late":
        return await f["self"].repeat(f["self"]._step)


@continues(HierarchicalWorker._step)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "gradient":
        return await f["self"]._reduce(*value)
    return value


@continues(HierarchicalWorker._reduce)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "recv":
        return await f["self"]._descend(value.payload, None, 0)
    if below == "_sum_group":
        return await f["self"]._lead(f["tag"], value)
    return value


@continues(HierarchicalWorker._sum_group)
async def _(f: dict[str, Any], acc: tuple, below: str) -> tuple:
    return await f["self"]._sum_group(f["tag"], acc, f["i"] + 1)


@continues(HierarchicalWorker._add_member)
async def _(f: dict[str, Any], value: Any, below: str) -> tuple:
    if below == "recv":
        return await f["self"]._add_sum(f["acc"], value.payload)
    return value


@continues(HierarchicalWorker._add_sum)
async def _(f: dict[str, Any], total: Any, below: str) -> tuple:
    return _summed(f["acc"], f["theirs"], total)


@continues(HierarchicalWorker._lead)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below in ("gloo_ring_allreduce", "ring_allreduce"):
        return await f["self"]._broadcast(f["tag"], *value)
    return value


finishes(HierarchicalWorker._broadcast)


@continues(HierarchicalWorker._descend)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    return f["self"]._stepped(f["extras"], f["sent"])

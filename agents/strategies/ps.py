"""Parameter-server SGD: synchronous, asynchronous and stale-synchronous, over one or several PS shards.

The PS sends the parameters down, workers send gradients up, the PS applies
them with a torch optimizer. Synchronous: the PS waits for all K gradients,
averages them (in worker order) and broadcasts; with K workers of batch b this
equals plain SGD with batch K·b (DESIGN §5, golden equivalences). Asynchronous:
every gradient is applied when it arrives and only its sender gets the new
parameters; staleness = updates applied since the parameters it used.
Stale-synchronous (``staleness_bound`` s, Ho et al. 2013): asynchronous, but a
worker that has pushed c gradients may start its next step only while
``c − min(clocks) ≤ s``; s = 0 is bulk-synchronous.

With ``shards: S > 1`` the parameters are split *by tensor* over ``ps0 … ps{S-1}``
(largest tensor first onto the least-loaded shard); each worker sends each
shard its slice of the gradient and assembles the parameters from all shards.
Every shard holds only its own tensors, so the result model is the one ``w0``
assembled: synchronous, ``w0`` records update v when it holds all of version v
(one downlink after the shards applied it); asynchronous, ``ps0`` counts the
updates and the result is the model ``w0`` assembled last.
"""
from __future__ import annotations

from typing import Any

import torch

from agents.observe.statelog import log_model, log_result, log_version
from agents.strategies import layerwise
from agents.strategies.base import Strategy, TrainingWorker, VWorkerSpec
from agents.strategies.collective import GlooP2P

__all__ = ["PSSync", "PSAsync", "ParameterServer", "PSWorker", "TensorShards"]


class TensorShards:
    """Which parameter tensors each of S shards owns, and how flat vectors split into and join from slices."""

    def __init__(self, sizes: list[int], shards: int):
        self.sizes, self.n = list(sizes), int(shards)
        load = [0] * self.n
        self.owned: list[list[int]] = [[] for _ in range(self.n)]
        for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
            s = min(range(self.n), key=lambda s: (load[s], s))
            self.owned[s].append(i)
            load[s] += sizes[i]
        offsets = [0]
        for n in sizes:
            offsets.append(offsets[-1] + n)
        self.index = [torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in sorted(own)])
                      if own else torch.zeros(0, dtype=torch.long) for own in self.owned]
        self.total = offsets[-1]

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        if self.n == 1:
            return [flat]
        return [flat[idx] for idx in self.index]

    def join(self, parts: list[torch.Tensor]) -> torch.Tensor:
        if self.n == 1:
            return parts[0]
        out = torch.empty(self.total, dtype=parts[0].dtype)
        for idx, p in zip(self.index, parts):
            out[idx] = p
        return out


def shards_of(training: Any, n: int) -> TensorShards:
    return TensorShards([p.numel() for p in training.scratch.parameters()], n)


def _apply_owned(model: torch.nn.Module, opt: torch.optim.Optimizer, owned: list[int], grad: torch.Tensor) -> None:
    """One optimizer step on the tensors ``owned`` (in index order), whose gradients are concatenated in ``grad``."""
    params = list(model.parameters())
    mine = set(owned)
    offset = 0
    for i, p in enumerate(params):
        if i in mine:
            p.grad = grad[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        else:
            p.grad = None  # torch.optim skips parameters without a gradient
    opt.step()


class ParameterServer(TrainingWorker):
    """One PS shard. ``shard``/``shards`` select its tensors; ``bound`` (SSP) limits clock gaps."""

    def __init__(self, name: str, vid: int, env: Any, workers: list[str], sync: bool,
                 shard: int = 0, shards: int = 1, bound: int | None = None):
        super().__init__(name, vid, env)
        self.workers, self.sync = list(workers), sync
        self.shard, self.n_shards, self.bound = shard, shards, bound
        self.version = 0
        self.clocks = {w: 0 for w in self.workers}
        self.max_gap = 0  # SSP: the largest clock gap at which a worker was let start a step
        self.held: list[str] = []

    @property
    def counts(self) -> bool:
        """Whether this shard records the global updates (a sharded sync PS leaves that to w0)."""
        return self.shard == 0 and not (self.sync and self.n_shards > 1)

    def params(self) -> torch.Tensor:
        if self.n_shards == 1:
            return self.training.flat(self.model)
        return torch.cat([p.detach().reshape(-1) for i, p in enumerate(self.model.parameters())
                          if i in self._owned_set])

    async def apply(self, grad) -> None:
        if self.n_shards == 1:
            await super().apply(grad)
        else:
            await self.compute(_apply_owned, self.model, self.opt, self._owned, grad, kind="update",
                               cost=2.0 * grad.numel())

    def record(self, loss: float, staleness: int, samples: int, nbytes: int) -> bool:
        if not self.counts:
            return False
        return self.updated(self.version, loss, staleness, samples, nbytes)

    def evaluate(self, version: int) -> None:
        if self.n_shards == 1:  # a shard holds only its tensors: w0 evaluates the assembled model instead
            super().evaluate(version)

    async def run(self) -> None:
        self.make_model()
        if self.n_shards > 1:
            self._owned = sorted(shards_of(self.training, self.n_shards).owned[self.shard])
            self._owned_set = set(self._owned)
        params = self.params()
        log_version(self, 0, params)
        self.layerwise = self.env.compute.spec.layerwise  # one message per layer (agents.strategies.layerwise)
        self.p2p = _gloo(self) if not self.layerwise else None
        await self.start_late(self.name)  # a PS that starts late (realrun's asynchronous PS reads its counters first)
        await self._send_params(self.workers, params, (0,))
        if self.sync:
            await self._run_sync()
        else:
            await self._run_async()

    async def _recv_grad(self):
        if self.layerwise:
            return await layerwise.ps_recv_gradient(self)
        if not self.env.faults.crashes:
            return await self.recv(tag="grad")
        while True:  # a restarted worker's pull is answered on the way (faults)
            m = await self.recv()
            if not self._pulled(m):
                return m

    def _pulled(self, m) -> bool:
        """A worker restarted after a crash asks for the parameters (faults): send them; True if ``m`` was that."""
        if m.tag != "pull":
            return False
        if self.bound is not None and m.src in self.held:
            self.held.remove(m.src)
        self.send(m.src, (self.params(), self.version), tag="params")
        return True

    async def _send_params(self, workers: list[str], params, meta: tuple) -> None:
        if self.layerwise:
            await layerwise.ps_send_params(self, workers, params, meta)
            return
        if self.p2p is not None:  # like realrun's PS: isend the parameters, then post the gradients' irecv
            for w in workers:
                self.p2p.send(w, (params, *meta), tag="params")
            for w in workers:
                self.p2p.post_recv(w, "grad")
            return
        for w in workers:
            self.send(w, (params, *meta), tag="params")

    async def _run_async(self) -> None:
        while True:
            m = await self._recv_grad()
            grad, version, loss, samples = m.payload
            staleness = self.version - version
            await self.apply(grad)
            self.version += 1
            self.clocks[m.src] += 1
            # one copy for the state log's checksum and the message (a new tensor); SSP sends from _release
            params = self.params() if self.bound is None else self.params
            log_version(self, self.version, params)
            log_result(self, m, version, loss, staleness, self.version)
            if self.record(loss, staleness, samples, m.nbytes):
                return
            if self.bound is None:
                await self._send_params([m.src], params, (self.version,))
                continue
            self.held.append(m.src)
            await self._release()

    async def _release(self) -> None:
        """SSP: start every held worker whose clock is within ``bound`` of the slowest one."""
        slowest = min(self.clocks.values())
        order = {w: i for i, w in enumerate(self.workers)}
        ready = sorted((w for w in self.held if self.clocks[w] - slowest <= self.bound), key=order.get)
        if not ready:
            return
        params = self.params()
        for w in ready:
            self.held.remove(w)
            self.max_gap = max(self.max_gap, self.clocks[w] - slowest)
            await self._send_params([w], params, (self.version,))

    async def _run_sync(self) -> None:
        order = {w: i for i, w in enumerate(self.workers)}
        while True:
            msgs = await self._gather()
            msgs.sort(key=lambda m: order[m.src])  # summation order fixed by worker, not arrival
            grad = await self.aggregate([m.payload[0] for m in msgs])
            await self.apply(grad)
            self.version += 1
            loss = sum(m.payload[2] for m in msgs) / len(msgs)
            samples = sum(m.payload[3] for m in msgs)
            params = self.params()
            log_version(self, self.version, params)
            for m in msgs:
                log_result(self, m, m.payload[1], m.payload[2], self.version - 1 - m.payload[1], self.version)
            nbytes = sum(m.nbytes for m in msgs)
            if self.record(loss, 0, samples, nbytes):
                return
            await self._send_params(self.workers, params, (self.version, loss, samples, nbytes))

    async def _gather(self) -> list:
        """One gradient of the current version from every worker. A gradient of another version or a second
        one from a worker (faults: a restarted worker, a duplicated message) is dropped; a restarted worker's
        pull is answered unless its gradient is in already (it gets the next version with the others)."""
        if self.layerwise or not self.env.faults:  # (crashes are not supported with compute.layerwise)
            return [await self._recv_grad() for _ in self.workers]
        got: dict[str, Any] = {}
        while len(got) < len(self.workers):
            m = await self.recv()
            if m.tag == "pull":
                if m.src not in got:
                    self.send(m.src, (self.params(), self.version, 0.0, 0, 0), tag="params")
                continue
            if m.payload[1] == self.version and m.src not in got:
                got[m.src] = m
        return list(got.values())


class PSWorker(TrainingWorker):
    """Pulls the parameters from every shard, computes a gradient, pushes each shard its slice.

    After a crash (faults) it restarts as a new process and pulls the current parameters from every shard."""

    on_crash = "restart"

    def __init__(self, name: str, vid: int, env: Any, ps: str | list[str], counts: bool = False):
        super().__init__(name, vid, env)
        self.shards = [ps] if isinstance(ps, str) else list(ps)
        self.counts = counts  # a sharded sync PS: this worker records version v once it holds all of it

    async def run(self) -> None:
        if self.env.compute.spec.layerwise:
            await self._run_layerwise()
            return
        split = shards_of(self.training, len(self.shards)) if len(self.shards) > 1 else None
        keeps_model = split is not None and self.name == "w0"  # the result vworker of a sharded PS
        every = self.setting("eval_every", 0)
        p2p = _gloo(self)
        if self.restarted:
            for s in self.shards:
                self.send(s, None, tag="pull")
        while True:
            if p2p is not None:  # dist.recv: the receive is announced first
                for s in self.shards:
                    p2p.post_recv(s, "params")
            msgs = [await self.recv(src=s, tag="params") for s in self.shards]
            versions = [m.payload[1] for m in msgs]
            for m in msgs:
                log_model(self, m, m.payload[1])
            params = msgs[0].payload[0] if split is None else split.join([m.payload[0] for m in msgs])
            if keeps_model:
                self.load(params)
                v = versions[0]
                if self.counts and v:
                    loss, samples = msgs[0].payload[2], msgs[0].payload[3]
                    if self.updated(v, loss, 0, samples, sum(m.payload[4] for m in msgs)):
                        return
                elif every and v and v % every == 0:
                    self.evaluate(v)
            loss, grad, samples = await self.gradient(params)
            parts = [grad] if split is None else split.split(grad)
            for s, part, v in zip(self.shards, parts, versions):
                if p2p is not None:
                    p2p.send(s, (part, v, loss, samples), tag="grad")
                else:
                    self.send(s, (part, v, loss, samples), tag="grad")
            # drop what was received and sent while waiting for the next parameters: a gradient the PS has
            # applied stays alive as long as anyone holds it (10 000 workers: +1.7 GiB at the peak otherwise)
            del params, msgs, m, grad, parts, part


    async def _run_layerwise(self) -> None:
        """One PS shard, the parameters and the gradient one message per layer (compute.layerwise)."""
        ps = self.shards[0]

        async def recv_layer(i: int):
            m = await self.recv(src=ps, tag=("p", i))
            return m.payload[0], m.payload[1]

        def send_layer(i: int, g, loss: float, samples: int, version: int):
            return self.send(ps, (g, version, loss, samples), tag=("g", i))

        while True:
            await layerwise.worker_step(self, recv_layer, send_layer)


def _gloo(w: TrainingWorker) -> GlooP2P | None:
    """torch.distributed/gloo's send/recv protocol for this vworker's messages (``collective: gloo``), or None."""
    return GlooP2P(w) if w.setting("collective", "ideal") == "gloo" else None


class _PS(Strategy):
    sync = False
    bound_key: str | None = None
    result = "ps0"

    @classmethod
    def _shards(cls, settings: dict[str, Any]) -> int:
        n = settings.get("shards") or 1
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"strategy.shards={n!r} is not valid; accepted: an integer >= 1")
        return n

    @classmethod
    def result_for(cls, workers: int, settings: dict[str, Any]) -> str:
        return "ps0" if cls._shards(settings) == 1 else "w0"

    @classmethod
    def _bound(cls, settings: dict[str, Any]) -> int | None:
        return None

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        n = cls._shards(settings)
        names = [f"w{i}" for i in range(workers)]
        ps = [f"ps{s}" for s in range(n)]
        specs = [VWorkerSpec(w, f"{__name__}.PSWorker", {"ps": ps[0] if n == 1 else ps}, holds_data=True)
                 for w in names]
        if n > 1 and cls.sync:
            specs[0] = VWorkerSpec("w0", f"{__name__}.PSWorker", {"ps": ps, "counts": True}, holds_data=True)
        for s, p in enumerate(ps):
            kw: dict[str, Any] = {"workers": names, "sync": cls.sync}
            if n > 1:
                kw.update(shard=s, shards=n)
            bound = cls._bound(settings)
            if bound is not None:
                kw["bound"] = bound
            specs.append(VWorkerSpec(p, f"{__name__}.ParameterServer", kw))
        return specs


class PSSync(_PS):
    name = "ps_sync"
    sync = True


class PSAsync(_PS):
    name = "ps_async"
    sync = False

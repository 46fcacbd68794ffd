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

Evaluations (``eval.every``) with shards: no shard holds a whole model, so a worker evaluates the one it
assembled. Synchronous, ``w0`` evaluates version v when it records it. Asynchronous, ``ps0`` sends its
version v only to the worker whose gradient made it, which assembles ps0's slice of exactly version v with
the other shards' answers to the same gradient: that worker evaluates it when v is a multiple of
``eval.every`` (one row per multiple, named by that worker; not the first parameters a restarted worker
pulls, whose version went to another worker too). SSP may send a version to several workers or to none, so
there ``w0`` evaluates the first version it holds at or after each multiple (a row of that version, one for
several multiples when w0 passes them at once).
"""
from __future__ import annotations

from typing import Any

import torch

from agents.checkpoint import continues, finishes
from agents.observe.statelog import log_model, log_result, log_version
from agents.strategies import layerwise
from agents.strategies.base import Strategy, TrainingWorker, VWorkerSpec
from agents.strategies.collective import GlooP2P, gloo_barrier
from agents.workloads.models import step

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
    step(opt)


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
        if self.n_shards == 1:  # a shard holds only its tensors: the workers evaluate what they assemble
            super().evaluate(version)

    async def run(self) -> None:
        self.make_model()
        if self.n_shards > 1:
            self._owned = sorted(shards_of(self.training, self.n_shards).owned[self.shard])
            self._owned_set = set(self._owned)
        params = self.params()
        log_version(self, 0, params)
        self.layerwise = self.env.compute.spec.layerwise  # one message per layer (agents.strategies.layerwise)
        self.p2p = _gloo(self, [f"ps{i}" for i in range(self.n_shards)]) if not self.layerwise else None
        await self.start_late(self.name)  # a PS that starts late (realrun's asynchronous PS reads its counters first)
        await self._serve(params)

    async def _serve(self, params) -> None:
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
            if await self._async_step():
                return

    async def _async_step(self) -> bool:
        m = await self._recv_grad()
        return await self._on_grad(m)

    async def _on_grad(self, m) -> bool:
        """Apply one worker's gradient and answer it; True when the run stops."""
        grad, version, loss, samples = m.payload
        staleness = self.version - version
        await self.apply(grad)
        return await self._applied(m, version, loss, samples, staleness)

    async def _applied(self, m, version: int, loss: float, samples: int, staleness: int) -> bool:
        self.version += 1
        self.clocks[m.src] += 1
        # one copy for the state log's checksum and the message (a new tensor); SSP sends from _release
        params = self.params() if self.bound is None else self.params
        log_version(self, self.version, params)
        log_result(self, m, version, loss, staleness, self.version)
        if self.record(loss, staleness, samples, m.nbytes):
            return True
        if self.bound is None:
            await self._send_params([m.src], params, (self.version,))
            return False
        self.held.append(m.src)
        await self._release()
        return False

    async def _release(self) -> None:
        """SSP: start every held worker whose clock is within ``bound`` of the slowest one."""
        slowest = min(self.clocks.values())
        order = {w: i for i, w in enumerate(self.workers)}
        ready = sorted((w for w in self.held if self.clocks[w] - slowest <= self.bound), key=order.get)
        if ready:
            await self._release_each(ready, self.params(), slowest)

    async def _release_each(self, ready: list[str], params, slowest: int) -> None:
        """Send ``params`` to each worker of ``ready`` in turn (a layer-wise send may wait for the NIC)."""
        while ready:
            w = ready.pop(0)
            self.held.remove(w)
            self.max_gap = max(self.max_gap, self.clocks[w] - slowest)
            await self._send_params([w], params, (self.version,))

    async def _run_sync(self) -> None:
        while True:
            if await self._sync_round():
                return

    async def _sync_round(self) -> bool:
        msgs = await self._gather()
        return await self._sync_step(msgs)

    async def _sync_step(self, msgs: list) -> bool:
        """Apply the mean of one gradient from every worker and broadcast; True when the run stops."""
        order = {w: i for i, w in enumerate(self.workers)}
        msgs.sort(key=lambda m: order[m.src])  # summation order fixed by worker, not arrival
        grad = await self.aggregate([m.payload[0] for m in msgs])
        return await self._apply_and_sync(grad, msgs)

    async def _apply_and_sync(self, grad, msgs: list) -> bool:
        await self.apply(grad)
        return await self._synced(msgs)

    async def _synced(self, msgs: list) -> bool:
        self.version += 1
        loss = sum(m.payload[2] for m in msgs) / len(msgs)
        samples = sum(m.payload[3] for m in msgs)
        params = self.params()
        log_version(self, self.version, params)
        for m in msgs:
            log_result(self, m, m.payload[1], m.payload[2], self.version - 1 - m.payload[1], self.version)
        nbytes = sum(m.nbytes for m in msgs)
        if self.record(loss, 0, samples, nbytes):
            return True
        await self._send_params(self.workers, params, (self.version, loss, samples, nbytes))
        return False

    async def _gather(self) -> list:
        """One gradient of the current version from every worker. A gradient of another version or a second
        one from a worker (faults: a restarted worker, a duplicated message) is dropped; a restarted worker's
        pull is answered unless its gradient is in already (it gets the next version with the others)."""
        if self.layerwise or not self.env.faults:  # (crashes are not supported with compute.layerwise)
            return await self._gather_all()
        return await self._gather_faults()

    async def _gather_all(self, msgs: list | None = None) -> list:
        msgs = [] if msgs is None else msgs
        while len(msgs) < len(self.workers):
            msgs.append(await self._recv_grad())
        return msgs

    async def _gather_faults(self, got: dict[str, Any] | None = None) -> list:
        got = {} if got is None else got
        while len(got) < len(self.workers):
            self._gathered(got, await self.recv())
        return list(got.values())

    def _gathered(self, got: dict[str, Any], m) -> None:
        if m.tag == "pull":
            if m.src not in got:
                self.send(m.src, (self.params(), self.version, 0.0, 0, 0), tag="params")
            return
        if m.payload[1] == self.version and m.src not in got:
            got[m.src] = m


class PSWorker(TrainingWorker):
    """Pulls the parameters from every shard, computes a gradient, pushes each shard its slice.

    After a crash (faults) it restarts as a new process and pulls the current parameters from every shard."""

    on_crash = "restart"

    def __init__(self, name: str, vid: int, env: Any, ps: str | list[str], counts: bool = False,
                 evals: str | None = None):
        super().__init__(name, vid, env)
        self.shards = [ps] if isinstance(ps, str) else list(ps)
        self.counts = counts  # a sharded sync PS: this worker records version v once it holds all of it
        # a sharded asynchronous PS: who evaluates (_observe): "version", the worker that is sent a multiple;
        # "w0" (SSP), w0 at the first version it holds at or after one
        self.evals = evals

    async def run(self) -> None:
        if self.env.compute.spec.layerwise:
            await self._run_layerwise()
            return
        self._split = shards_of(self.training, len(self.shards)) if len(self.shards) > 1 else None
        self._keeps_model = self._split is not None and self.name == "w0"  # the result vworker of a sharded PS
        self._p2p = _gloo(self, self.shards)
        self._had: dict[str, int] = {}  # a sharded PS: the latest version of each shard's parameters taken
        self._rejoined = self.restarted  # its first parameters answer its pull: that version went to another too
        if self.restarted:
            for s in self.shards:
                self.send(s, None, tag="pull")
        await self._loop()

    async def _loop(self) -> None:
        while True:
            if await self._iteration():
                return

    async def _iteration(self) -> bool:
        msgs = await self._pull()
        return await self._step(msgs)

    async def _pull(self, msgs: list | None = None) -> list:
        """The parameters from every shard (``msgs``: those already received)."""
        if msgs is None:
            msgs = []
            if self._p2p is not None:  # dist.recv: the receive is announced first
                for s in self.shards:
                    self._p2p.post_recv(s, "params")
        while len(msgs) < len(self.shards):
            self._took(msgs, await self.recv(src=self.shards[len(msgs)], tag="params"))
        return msgs

    def _took(self, msgs: list, m: Any) -> None:
        """Keep ``m``, the next shard's parameters, unless a sharded PS's are a copy of a version already
        taken (a ``duplicate`` fault): joined with the other shards' newer slices it would make a model of
        mixed versions, whose gradient a synchronous PS drops, and the round would never end."""
        s = self.shards[len(msgs)]
        if len(self.shards) > 1:
            if m.payload[1] <= self._had.get(s, -1):
                return
            self._had[s] = m.payload[1]
        msgs.append(m)

    async def _step(self, msgs: list) -> bool:
        """One step on the parameters in ``msgs``: a gradient pushed to every shard; True when the run stops.

        What was received and sent dies with this frame: a gradient the PS has applied stays alive as long as
        anyone holds it (10 000 workers: +1.7 GiB at the peak otherwise)."""
        split = self._split
        versions = [m.payload[1] for m in msgs]
        for m in msgs:
            log_model(self, m, m.payload[1])
        params = msgs[0].payload[0] if split is None else split.join([m.payload[0] for m in msgs])
        if self._keeps_model:
            self.load(params)
            if self.counts and versions[0]:
                loss, samples = msgs[0].payload[2], msgs[0].payload[3]
                if self.updated(versions[0], loss, 0, samples, sum(m.payload[4] for m in msgs)):
                    return True
        # (a worker checkpointed before `evals`: w0 evaluated the multiples it was sent)
        evals = getattr(self, "evals", "version" if self._keeps_model and not self.counts else None)
        if evals:
            self._observe(evals, versions[0], params)
        self._push(versions, *await self.gradient(params))
        return False

    def _observe(self, evals: str, v: int, params) -> None:
        """A sharded asynchronous PS: evaluate ``params``, assembled of ps0's version ``v``, if this worker
        is the one to (``evals``; the module's docstring). An observer: no virtual time."""
        every = self.setting("eval_every", 0)
        rejoined, self._rejoined = getattr(self, "_rejoined", False), False
        if not every or not v:
            return
        if evals == "w0":  # SSP: w0, the first version it holds at or after each multiple
            if self._keeps_model and v // every > getattr(self, "_evaluated", 0) // every:
                self._evaluated = v
                self.evaluate(v)
        elif v % every == 0 and not rejoined:  # only the worker whose gradient made v is sent v
            if self._keeps_model:  # w0: the result model, which it holds
                self.evaluate(v)
            else:  # an observer on the agent's scratch model, as a worker's gradients are
                loss, acc = self.training.evaluate(params)
                self.env.recorder.evaluation(self, v, loss, acc)

    def _push(self, versions: list[int], loss: float, grad, samples: int) -> None:
        parts = [grad] if self._split is None else self._split.split(grad)
        for s, part, v in zip(self.shards, parts, versions):
            if self._p2p is not None:
                self._p2p.send(s, (part, v, loss, samples), tag="grad")
            else:
                self.send(s, (part, v, loss, samples), tag="grad")

    async def _run_layerwise(self) -> None:
        """One PS shard, the parameters and the gradient one message per layer (compute.layerwise)."""
        while True:
            await layerwise.worker_step(self, self._recv_layer, self._send_layer)

    async def _recv_layer(self, i: int):
        m = await self.recv(src=self.shards[0], tag=("p", i))
        return m.payload[0], m.payload[1]

    def _send_layer(self, i: int, g, loss: float, samples: int, version: int):
        return self.send(self.shards[0], (g, version, loss, samples), tag=("g", i))


def _gloo(w: TrainingWorker, servers: list[str]) -> GlooP2P | None:
    """torch.distributed/gloo's send/recv protocol for this vworker's messages (``collective: gloo``), or None.

    The program is realrun's: ranks are the servers, then the workers in order, and it passes
    ``dist.barrier()`` before its first tensor (:func:`~agents.strategies.collective.gloo_barrier`)."""
    if w.setting("collective", "ideal") != "gloo":
        return None
    p2p = GlooP2P(w)
    if not w.restarted:
        gloo_barrier(w, servers + [n for n in w.env.names if n not in servers])
    return p2p


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
        elif n > 1:  # the workers evaluate what they assemble (PSWorker._observe)
            evals = "version" if cls._bound(settings) is None else "w0"
            specs = [VWorkerSpec(w, f"{__name__}.PSWorker", {"ps": ps, "evals": evals}, holds_data=True)
                     for w in names]
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


# ------------------------------------------------------------------ checkpoints (agents.checkpoint)
# The rest of each frame of a PS and its workers after the await it is suspended in (``below`` names the
# awaited function), for a coroutine rebuilt from a checkpoint. Keep each in step with its method, and in
# tail-call form (agents.checkpoint).
@continues(ParameterServer.run)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    if below == "start_late":
        return await f["self"]._serve(f["params"])


@continues(ParameterServer._serve)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    self = f["self"]
    if below == "_send_params":
        return await (self._run_sync() if self.sync else self._run_async())


@continues(ParameterServer._gather_faults)
async def _(f: dict[str, Any], m: Any, below: str) -> list:
    f["self"]._gathered(f["got"], m)
    return await f["self"]._gather_faults(f["got"])


finishes(ParameterServer._release)


@continues(ParameterServer._release_each)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    return await f["self"]._release_each(f["ready"], f["params"], f["slowest"])


@continues(ParameterServer._recv_grad)
async def _(f: dict[str, Any], m: Any, below: str) -> Any:
    self = f["self"]
    if not self.env.faults.crashes or not self._pulled(m):
        return m
    return await self._recv_grad()


@continues(ParameterServer._run_async)
async def _(f: dict[str, Any], stop: bool, below: str) -> None:
    if not stop:
        return await f["self"]._run_async()


@continues(ParameterServer._async_step)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "_recv_grad":
        return await f["self"]._on_grad(value)
    return value


@continues(ParameterServer._on_grad)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "_applied":
        return value
    return await f["self"]._applied(f["m"], f["version"], f["loss"], f["samples"], f["staleness"])


finishes(ParameterServer.apply, None)


@continues(ParameterServer._run_sync)
async def _(f: dict[str, Any], stop: bool, below: str) -> None:
    if not stop:
        return await f["self"]._run_sync()


@continues(ParameterServer._sync_round)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "_gather":
        return await f["self"]._sync_step(value)
    return value


finishes(ParameterServer._gather)


@continues(ParameterServer._gather_all)
async def _(f: dict[str, Any], m: Any, below: str) -> list:
    f["msgs"].append(m)
    return await f["self"]._gather_all(f["msgs"])


@continues(ParameterServer._sync_step)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "aggregate":
        return await f["self"]._apply_and_sync(value, f["msgs"])
    return value


@continues(ParameterServer._apply_and_sync)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "apply":
        return await f["self"]._synced(f["msgs"])
    return value


finishes(PSWorker.run, None)


@continues(PSWorker._loop)
async def _(f: dict[str, Any], stop: bool, below: str) -> None:
    if not stop:
        return await f["self"]._loop()


@continues(PSWorker._iteration)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "_pull":
        return await f["self"]._step(value)
    return value


@continues(PSWorker._pull)
async def _(f: dict[str, Any], m: Any, below: str) -> list:
    f["self"]._took(f["msgs"], m)
    return await f["self"]._pull(f["msgs"])


@continues(PSWorker._step)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    f["self"]._push(f["versions"], *value)
    return False


# compute.layerwise: the PS's sends that wait (fair egress) and the workers' layer loop
finishes(ParameterServer._send_params, None)
finishes(ParameterServer._applied, False)
finishes(ParameterServer._synced, False)


@continues(PSWorker._run_layerwise)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    return await f["self"]._run_layerwise()


@continues(PSWorker._recv_layer)
async def _(f: dict[str, Any], m: Any, below: str) -> Any:
    return m.payload[0], m.payload[1]

"""Federated averaging (McMahan et al., AISTATS 2017) with client sampling per round.

Round r: the server draws ``max(1, round(fraction·K))`` clients with the keyed
draw ``(seed, "fedavg", r)``, sends them the global model, each trains locally
(``local_steps`` steps, or else ``local_epochs`` epochs over its shard) with a
fresh optimizer, and returns its model; the server sets the global model to
``Σ n_k/n · w_k`` in client order, with n_k the client's shard size
(``weighting: data``), the samples it trained on this round (``samples``) or 1
(``uniform``). With one local step, all clients and equal shards this is
synchronous PS SGD (a test pins it).

The global model's *version* counts aggregations, not rounds: a round that ends without an update
(``round_timeout`` and faults) leaves the model, and its version, as they were. So a run makes exactly
``stop.updates`` updates, numbered 1, 2, … without gaps; the round keeps its own counter, which keys the
client sampling and tags the models and updates of the round.
"""
from __future__ import annotations

from typing import Any


from agents.checkpoint import continues, finishes
from agents.sim import keyed
from agents.sim.types import seconds_to_ns
from agents.strategies.base import Strategy, TrainingWorker, VWorkerSpec
from agents.workloads.models import optimizer

__all__ = ["FedAvg", "FedServer", "FedClient", "sample_clients"]

WEIGHTINGS = ("data", "samples", "uniform")
# rounds without an update, from the start of a run, after which the server gives up: its round_timeout is too
# short for any client (faults that silence every client for this long are not an experiment either)
EMPTY_ROUNDS = 1000


def sample_clients(seed: int, rnd: int, clients: int, fraction: float) -> list[int]:
    """The sorted client indices of round ``rnd`` (keyed: the same on every agent and rerun)."""
    m = max(1, min(clients, int(round(fraction * clients))))
    if m == clients:
        return list(range(clients))
    return sorted(int(i) for i in keyed.generator(seed, "fedavg", rnd).choice(clients, m, replace=False))


class FedClient(TrainingWorker):
    """Receives a model, trains it locally, sends it back with (version, mean loss, samples, weight).

    After a crash (faults) it restarts as a new process: it asks the server for the model (FedAsync answers;
    FedAvg picks it again in a later round) and misses the rounds it was down for."""

    on_crash = "restart"

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
        if self.restarted:
            self.send(self.server, None, tag="pull")
        await self.repeat(self._round)  # (a round returns None: a client's loop never ends)

    async def _round(self) -> None:
        """One round: the server's model in, ``local_steps`` steps on it, the model back."""
        return await self._train_round(await self.recv(src=self.server, tag="model"))

    async def _train_round(self, m) -> None:
        # a client that fell behind (a round slower than strategy.round_timeout, a straggler) finds the models
        # of the rounds it missed queued: it trains the newest, whose update can still be on time; an older
        # one's would be dropped as late, and the queue would grow by a model every round
        while (newer := self.recv_nowait(src=self.server, tag="model")) is not None:
            if newer.payload[1] > m.payload[1]:
                m = newer
        params, version = m.payload
        self.load(params)
        spec = self.training.spec
        self.opt = optimizer("sgd", self.model.parameters(), spec.lr, spec.momentum)
        self._trained(version, await self.train_local(self.local_steps()))

    def _trained(self, version: int, acc: tuple[int, float, int]) -> None:
        steps, loss_sum, n = acc
        self.send(self.server, (self.flat(), version, loss_sum / steps, n, self.training.shard_size(self.name)),
                  tag="update")
        if not any(True for _ in self.model.buffers()):
            # compact between rounds: a client holds no model while it waits (100 000 clients, 100 a
            # round, keep 100 models, not one per client ever sampled); the next round loads a fresh one
            self.model = self.opt = None


class FedServer(TrainingWorker):
    def __init__(self, name: str, vid: int, env: Any, clients: list[str]):
        super().__init__(name, vid, env)
        self.clients = list(clients)
        self.history: list[list[int]] = []  # the clients of each round
        self.leaving: dict[str, Any] = {}  # each client's last model: its send handle

    async def run(self) -> None:
        self.make_model()
        weighting = self.setting("weighting", "data")
        if weighting not in WEIGHTINGS:
            raise ValueError(f"strategy.weighting={weighting!r}; accepted: {' | '.join(WEIGHTINGS)}")
        self.rnd = 0  # rounds started: the keyed client sampling and the models' and updates' round tags
        self.version = 0  # aggregations: the global model's version, what metrics.csv counts
        self._order = {c: i for i, c in enumerate(self.clients)}
        await self.repeat(self._round)

    async def _round(self) -> bool:
        """One round: the model to the round's clients, their updates in, the weighted mean; True when the run
        stops."""
        fraction = float(self.setting("fraction", 1.0))
        rnd = self.rnd
        chosen = [self.clients[i] for i in sample_clients(self.env.seed, rnd, len(self.clients), fraction)]
        self.history.append([self._order[c] for c in chosen])
        params = self.flat()
        for c in chosen:
            # a round shorter than the server's NIC takes to send the models (strategy.round_timeout) would queue
            # a model per chosen client every round, without bound: a client whose last model is still leaving
            # is sent no other; it stays chosen, and its update of the older round is dropped as late
            last = self.leaving.get(c)
            if last is None or last.done:
                self.leaving[c] = self.send(c, (params, rnd), tag="model")
        return await self._average(await self._gather(chosen, rnd))

    async def _average(self, msgs: list) -> bool:
        self.rnd += 1
        if not msgs:  # every chosen client missed the round (faults): the model, and its version, stay as they were
            if self.rnd >= EMPTY_ROUNDS and getattr(self, "version", 1) == 0:  # (no version: checkpointed before)
                raise RuntimeError(
                    f"fedavg: the first {self.rnd} rounds all ended without an update (strategy.round_timeout="
                    f"{self.setting('round_timeout')} is shorter than any chosen client's round: the model to the "
                    f"client, its local steps and its update back), so the model would never change; accepted: a "
                    f"longer strategy.round_timeout, or null to wait for every chosen client")
            return False
        weighting = self.setting("weighting", "data")
        msgs.sort(key=lambda m: self._order[m.src])
        weights = [1.0 if weighting == "uniform" else float(m.payload[3] if weighting == "samples" else m.payload[4])
                   for m in msgs]
        return self._averaged(msgs, weights, await self.aggregate([m.payload[0] for m in msgs], weights))

    def _averaged(self, msgs: list, weights: list[float], mean) -> bool:
        self.load(mean)
        # a server checkpointed before versions were counted apart from rounds numbered its updates by round:
        # it goes on from there (the round is already counted here)
        self.version = getattr(self, "version", self.rnd - 1) + 1
        total = sum(weights)
        loss = sum(w * m.payload[2] for w, m in zip(weights, msgs)) / total
        return self.updated(self.version, loss, 0, sum(m.payload[3] for m in msgs), sum(m.nbytes for m in msgs))

    async def _gather(self, chosen: list[str], rnd: int) -> list:
        """The updates of round ``rnd``: from every chosen client, or (``round_timeout``) those in by the
        deadline; an update of an earlier round (a late client) or a second copy is dropped."""
        timeout = self.setting("round_timeout")
        deadline = None
        if timeout is not None:
            from agents.common.units import parse_duration

            deadline = self.now + seconds_to_ns(parse_duration(timeout, "strategy.round_timeout"))
        return await self._collect(set(chosen), rnd, deadline, {})

    async def _collect(self, want: set[str], rnd: int, deadline: int | None, got: dict) -> list:
        """``_gather`` from the updates in ``got`` on (a recv that times out returns at the deadline)."""
        while len(got) < len(want) and (deadline is None or self.now < deadline):
            timeout = None if deadline is None else deadline - self.now
            _take(got, want, rnd, await self.recv(tag="update", timeout=timeout))
        return list(got.values())


def _take(got: dict, want: set[str], rnd: int, m) -> None:
    """Keep ``m`` (None: the deadline passed) if it is the first update of round ``rnd`` from a chosen client."""
    if m is not None and m.payload[1] == rnd and m.src in want:
        got.setdefault(m.src, m)


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


# ------------------------------------------------------------------ checkpoints (agents.checkpoint)
# The rest of each frame above after the await it is suspended in (``below``), in tail-call form.
finishes(FedClient.run, None)


@continues(FedClient._round)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    if below == "recv":
        return await f["self"]._train_round(value)
    return value


@continues(FedClient._train_round)
async def _(f: dict[str, Any], acc: tuple[int, float, int], below: str) -> None:
    f["self"]._trained(f["version"], acc)


finishes(FedServer.run, None)


@continues(FedServer._round)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "_gather":
        return await f["self"]._average(value)
    return value


@continues(FedServer._average)
async def _(f: dict[str, Any], mean: Any, below: str) -> bool:
    return f["self"]._averaged(f["msgs"], f["weights"], mean)


finishes(FedServer._gather)


@continues(FedServer._collect)
async def _(f: dict[str, Any], m: Any, below: str) -> list:
    _take(f["got"], f["want"], f["rnd"], m)
    return await f["self"]._collect(f["want"], f["rnd"], f["deadline"], f["got"])

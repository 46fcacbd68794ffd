"""FedAsync (Xie, Koyejo & Gupta, "Asynchronous Federated Optimization", 2019), as used by the FL-timing thesis.

Every client trains from the global model it last received (version τ) and
returns its model w_k; the server mixes it in on arrival at its version t:
``w ← (1 − α_t)·w + α_t·w_k`` with ``α_t = alpha · s(t − τ)`` and the staleness
functions of the FedAsync paper:

* ``constant``:   s = 1
* ``polynomial``: s = (t − τ + 1)^(−a)           (the thesis: alpha = 1, a = 0.5)
* ``hinge``:      s = 1 if t − τ ≤ b, else 1 / (a·(t − τ − b) + 1)

then sends the new model back to that client only. Clients are the FedAvg ones.
"""
from __future__ import annotations

from typing import Any

import torch

from agents.checkpoint import continues, finishes
from agents.strategies.base import TrainingWorker
from agents.strategies.fedavg import FedAvg

__all__ = ["FedAsync", "FedAsyncServer", "staleness_weight", "mix", "STALENESS_FUNCTIONS"]

STALENESS_FUNCTIONS = ("constant", "polynomial", "hinge")


def staleness_weight(kind: str, staleness: int, a: float = 0.5, b: float = 4.0) -> float:
    """s(t − τ) of the FedAsync paper."""
    if staleness < 0:
        raise ValueError(f"negative staleness {staleness}")
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return 1.0 / (staleness + 1) ** a
    if kind == "hinge":
        return 1.0 if staleness <= b else 1.0 / (a * (staleness - b) + 1.0)
    raise ValueError(f"strategy.staleness={kind!r}; accepted: {' | '.join(STALENESS_FUNCTIONS)}")


def mix(w: torch.Tensor, wk: torch.Tensor, alpha: float) -> torch.Tensor:
    """``(1 − alpha)·w + alpha·wk`` (a new tensor)."""
    return w * (1.0 - alpha) + wk * alpha


class FedAsyncServer(TrainingWorker):
    def __init__(self, name: str, vid: int, env: Any, clients: list[str]):
        super().__init__(name, vid, env)
        self.clients = list(clients)
        self.history: list[tuple[int, int, float]] = []  # (t, staleness, alpha) per update

    async def run(self) -> None:
        self.make_model()
        staleness_weight(self.setting("staleness", "polynomial"), 0)  # reject a bad name before anything runs
        self.t = 0
        params = self.flat()
        for c in self.clients:
            self.send(c, (params, 0), tag="model")
        await self.repeat(self._next)

    async def _next(self) -> bool:
        """Answer the next message: a client's model is mixed in; True when the run stops."""
        return await self._on_message(await self.recv())

    async def _on_message(self, m) -> bool:
        if m.tag == "pull":  # a client restarted after a crash (faults): it starts from the current model
            self.send(m.src, (self.flat(), self.t), tag="model")
            return False
        kind = self.setting("staleness", "polynomial")
        a, b, alpha = float(self.setting("a", 0.5)), float(self.setting("b", 4)), float(self.setting("alpha", 1.0))
        wk, tau = m.payload[0], m.payload[1]
        st = self.t - tau
        alpha_t = alpha * staleness_weight(kind, st, a, b)
        self.history.append((self.t, st, alpha_t))
        return self._mixed(m, st, await self.compute(mix, self.flat(), wk, alpha_t, kind="aggregate",
                                                     cost=3.0 * wk.numel()))

    def _mixed(self, m, staleness: int, params) -> bool:
        self.load(params)
        self.t += 1
        _, _, loss, samples, _ = m.payload
        if self.updated(self.t, loss, staleness, samples, m.nbytes):
            return True
        self.send(m.src, (self.flat(), self.t), tag="model")
        return False


class FedAsync(FedAvg):
    name = "fedasync"
    server_cls = "FedAsyncServer"


# ------------------------------------------------------------------ checkpoints (agents.checkpoint)
# The rest of each frame above after the await it is suspended in (``below``), in tail-call form.
finishes(FedAsyncServer.run, None)


@continues(FedAsyncServer._next)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below == "recv":
        return await f["self"]._on_message(value)
    return value


@continues(FedAsyncServer._on_message)
async def _(f: dict[str, Any], params: Any, below: str) -> bool:
    return f["self"]._mixed(f["m"], f["st"], params)

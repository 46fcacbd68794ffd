"""Test strategies (no training): exact virtual times of cross-agent messages at window edges."""
from __future__ import annotations

from typing import Any

from agents.strategies.base import Strategy, VWorkerSpec
from agents.sim.worker import Worker
from agents.strategies.ps import PSAsync, PSWorker


class _Recording(Worker):
    def row(self, code: int, value: float = 0.0, extra: int = 0) -> None:
        """A metrics.csv row: (virtual time, name, iteration=code, loss=value, staleness=extra)."""
        self.env.recorder.update(self, code, float(value), int(extra), 0, 0)


class EdgeSender(_Recording):
    """Sends at t=0 (arrives at exactly L, the first window's end), then plays ping-pong."""

    def __init__(self, name: str, vid: int, env: Any, peer: str, rounds: int = 3):
        super().__init__(name, vid, env)
        self.peer, self.rounds = peer, rounds

    async def run(self) -> None:
        for i in range(self.rounds):
            self.send(self.peer, (i, float(self.now)), nbytes=0, tag="ping")
            m = await self.recv(src=self.peer, tag="pong")
            self.row(1, m.payload[1], m.delivered_at)
            await self.sleep(1000)  # resumes in the middle of a window


class EdgeReceiver(_Recording):
    """At exactly L (the window edge) it polls: the message arriving at L must already be there."""

    def __init__(self, name: str, vid: int, env: Any, peer: str, rounds: int = 3, poll_at: int = 0):
        super().__init__(name, vid, env)
        self.peer, self.rounds, self.poll_at = peer, rounds, poll_at

    async def run(self) -> None:
        if self.poll_at:
            await self.sleep(self.poll_at)
            m = self.recv_nowait(src=self.peer, tag="ping")
            self.row(2, -1.0 if m is None else float(m.delivered_at))
            if m is not None:
                self.send(self.peer, (0, float(self.now)), nbytes=0, tag="pong")
                start = 1
            else:
                start = 0
        else:
            start = 0
        for i in range(start, self.rounds):
            m = await self.recv(src=self.peer, tag="ping")
            self.row(3, float(m.delivered_at), m.payload[0])
            self.send(self.peer, (i, float(self.now)), nbytes=4, tag="pong")


class WindowEdge(Strategy):
    """a (id 0) and b (id 1): on different agents under round_robin with agents=2."""

    name = "window_edge"
    result = "a"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        poll_at = int(settings.get("poll_at", 0))
        rounds = int(settings.get("rounds", 3))
        return [VWorkerSpec("a", f"{__name__}.EdgeSender", {"peer": "b", "rounds": rounds}),
                VWorkerSpec("b", f"{__name__}.EdgeReceiver", {"peer": "a", "rounds": rounds, "poll_at": poll_at})]


class Poller(_Recording):
    """Pings its peer (idle by then) once, then keeps busy alone, polling for the answer every ``step`` ns."""

    def __init__(self, name: str, vid: int, env: Any, peer: str, step: int = 100_000, polls: int = 40,
                 nbytes: int = 0):
        super().__init__(name, vid, env)
        self.peer, self.step, self.polls, self.nbytes = peer, step, polls, nbytes

    async def run(self) -> None:
        await self.sleep(5_010_000)  # the peer has started and parked on its recv long before
        self.send(self.peer, None, nbytes=self.nbytes, tag="ping")
        for _ in range(self.polls):
            await self.sleep(self.step)
            m = self.recv_nowait(src=self.peer, tag="pong")
            if m is not None:
                self.row(5, float(m.delivered_at), self.now)
                return
        self.row(5, -1.0, self.now)


class Answerer(_Recording):
    """Idle until the ping, which it answers at once."""

    async def run(self) -> None:
        m = await self.recv(tag="ping")
        self.send(m.src, None, nbytes=0, tag="pong")


class Reply(Strategy):
    """a (id 0) busy alone, b (id 1) idle: a's window must stop where b's answer can arrive."""

    name = "reply"
    result = "a"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        return [VWorkerSpec("a", f"{__name__}.Poller", {"peer": "b", "nbytes": int(settings.get("nbytes", 0))}),
                VWorkerSpec("b", f"{__name__}.Answerer", {})]


def _spin(seconds: float) -> float:
    """Real CPU work for ``seconds`` wall seconds (holding the GIL most of the time, like a big model)."""
    import time

    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1
    return float(n)


class LongCompute(_Recording):
    """One real computation longer than the controller's agent timeout, inside one window."""

    def __init__(self, name: str, vid: int, env: Any, seconds: float = 1.5):
        super().__init__(name, vid, env)
        self.seconds = seconds

    async def run(self) -> None:
        n = await self.compute(_spin, self.seconds, kind="gradient")
        self.row(6, 1.0 if n > 0 else 0.0)


class LongWindow(Strategy):
    """a (id 0) computes for real for a long time; b (id 1) only waits on another agent."""

    name = "long_window"
    result = "a"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        return [VWorkerSpec("a", f"{__name__}.LongCompute", {"seconds": float(settings.get("seconds", 1.5))}),
                VWorkerSpec("b", f"{__name__}.Answerer", {})]


class BigSender(_Recording):
    """Sends tensors large enough for the direct agent-to-agent stream (and one small one)."""

    def __init__(self, name: str, vid: int, env: Any, peer: str, numel: int = 1 << 18):
        super().__init__(name, vid, env)
        self.peer, self.numel = peer, numel

    async def run(self) -> None:
        import torch

        g = torch.Generator().manual_seed(7)
        for i in range(3):
            x = torch.randn(self.numel, generator=g)
            self.send(self.peer, (x, x[:16].numpy().copy(), i), tag="big")
            await self.sleep(5000)


class BigReceiver(_Recording):
    """Records a checksum of every tensor it receives: (sum, crc32 of the bytes)."""

    def __init__(self, name: str, vid: int, env: Any, peer: str):
        super().__init__(name, vid, env)
        self.peer = peer

    async def run(self) -> None:
        import zlib

        for _ in range(3):
            m = await self.recv(src=self.peer, tag="big")
            x, a, i = m.payload
            self.row(4, float(x.double().sum()), zlib.crc32(x.numpy().tobytes()) ^ zlib.crc32(a.tobytes()) + i)


class BigTensors(Strategy):
    """tx (id 0) and rx (id 1): on different agents under round_robin with agents=2."""

    name = "big_tensors"
    result = "tx"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        return [VWorkerSpec("tx", f"{__name__}.BigSender", {"peer": "rx"}),
                VWorkerSpec("rx", f"{__name__}.BigReceiver", {"peer": "tx"})]


class UntailedWorker(PSWorker):
    """ps_async's worker behind one more frame, which has no tail: every checkpoint is refused."""

    async def run(self) -> None:
        await super().run()


class Untailed(PSAsync):
    """ps_async that cannot be checkpointed (docs/strategies.md, "Making a strategy checkpointable")."""

    name = "untailed"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        return [VWorkerSpec(s.name, f"{__name__}.UntailedWorker", s.kwargs, holds_data=s.holds_data)
                if s.name.startswith("w") else s for s in super().layout(workers, settings)]

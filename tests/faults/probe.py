"""Test strategies (no training) whose metrics.csv rows are exact virtual times, to pin what each fault does.

A row is ``(virtual_time_ns = when it happened, vworker, iteration = a code, staleness = an integer)``.
"""
from __future__ import annotations

from typing import Any

from agents.sim.worker import Worker
from agents.strategies.base import Strategy, VWorkerSpec

MS = 1_000_000


class _Rows(Worker):
    def row(self, code: int, extra: int = 0) -> None:
        self.env.recorder.update(self, code, 0.0, int(extra), 0, 0)


class Sender(_Rows):
    """Sends ``nbytes`` to every peer at each time of ``at_ms`` (message i has tag i)."""

    def __init__(self, name: str, vid: int, env: Any, peers: list[str], at_ms: list[float], nbytes: int):
        super().__init__(name, vid, env)
        self.peers, self.at_ms, self.nbytes = list(peers), list(at_ms), nbytes

    async def run(self) -> None:
        for i, t in enumerate(self.at_ms):
            await self.sleep(int(round(t * MS)) - self.now)
            for p in self.peers:
                self.send(p, i, nbytes=self.nbytes, tag=i)


class Sink(_Rows):
    """Records every delivered message: iteration = its index, staleness = when it was sent (ns)."""

    async def run(self) -> None:
        while True:
            m = await self.recv()
            self.row(m.payload, m.sent_at)


class Computer(_Rows):
    """``steps`` compute calls of kind gradient back to back; a row when each ends (staleness = its start)."""

    def __init__(self, name: str, vid: int, env: Any, steps: int = 3):
        super().__init__(name, vid, env)
        self.steps = steps

    async def run(self) -> None:
        for _ in range(self.steps):
            start = self.now
            await self.compute(_nothing, kind="gradient")
            self.row(1, start)


class Ticker(_Rows):
    """A row every ``every_ms`` (iteration = the tick); a crash freezes it (the default for a vworker)."""

    def __init__(self, name: str, vid: int, env: Any, every_ms: float = 10.0, ticks: int = 5):
        super().__init__(name, vid, env)
        self.every, self.ticks = int(round(every_ms * MS)), ticks

    async def run(self) -> None:
        for i in range(self.ticks):
            await self.sleep(self.every)
            self.row(i, int(self.restarted))


class RestartingTicker(Ticker):
    """A Ticker that a crash kills: it starts again from tick 0 at recovery (staleness 1 after a restart)."""

    on_crash = "restart"


class RestartingSink(Sink):
    on_crash = "restart"


def _nothing() -> None:
    return None


class Net(Strategy):
    """w0 sends to w1 and w2 (sinks); ``settings``: at_ms (send times), nbytes."""

    name = "probe_net"
    result = "w0"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        at = list(settings.get("at_ms") or [0.0, 10.0, 20.0])
        return [VWorkerSpec("w0", f"{__name__}.Sender", {"peers": ["w1", "w2"], "at_ms": at,
                                                         "nbytes": int(settings.get("nbytes") or 1000)}),
                VWorkerSpec("w1", f"{__name__}.Sink"), VWorkerSpec("w2", f"{__name__}.Sink")]


class Compute(Strategy):
    name = "probe_compute"
    result = "w0"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        return [VWorkerSpec(f"w{i}", f"{__name__}.Computer", holds_data=True) for i in range(workers)]


class Ticks(Strategy):
    """w0 a Ticker (a crash freezes it), w1 a RestartingTicker, w2 a Sink (freezes), w3 a RestartingSink;
    w4 sends to w2 and w3 at settings.at_ms."""

    name = "probe_ticks"
    result = "w4"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        at = list(settings.get("at_ms") or [20.0, 40.0])
        return [VWorkerSpec("w0", f"{__name__}.Ticker", holds_data=True),
                VWorkerSpec("w1", f"{__name__}.RestartingTicker", holds_data=True),
                VWorkerSpec("w2", f"{__name__}.Sink", holds_data=True),
                VWorkerSpec("w3", f"{__name__}.RestartingSink", holds_data=True),
                VWorkerSpec("w4", f"{__name__}.Sender", {"peers": ["w2", "w3"], "at_ms": at, "nbytes": 0},
                            holds_data=True)]

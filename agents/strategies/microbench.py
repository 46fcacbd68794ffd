"""Network microbenchmarks as a strategy (``strategy=microbench``): ``lockstep measure``'s p2p and fan-in, emulated.

``kind: p2p`` — ``w0`` sends ``w1`` a tiny message and waits for the echo (the round trip
``rtt``), then the model's bytes ``M`` and waits for a tiny ack; the repetition's time is
that second exchange minus ``rtt / 2`` (≈ L + M/B_eff, what ``lockstep measure`` and
realrun report as ``p2p.transfer_s``). ``kind: fanin`` — ``w1 … wK`` each send ``w0`` M
bytes at once; the repetition's time is until the last has arrived. Repetitions are
``gap`` apart (50 ms, like the real benchmark). No gradient is computed: ``w0`` records each
repetition as a global update whose ``loss`` column holds the time in seconds, which is what
``lockstep validate`` reads back.
"""
from __future__ import annotations

from typing import Any

from agents.checkpoint import continues, finishes
from agents.strategies.base import Strategy, TrainingWorker, VWorkerSpec

__all__ = ["Microbench", "BenchWorker"]

TINY = 4  # bytes of the ping, the echo and the ack (one float32)
KINDS = ("p2p", "fanin")


class BenchWorker(TrainingWorker):
    def __init__(self, name: str, vid: int, env: Any, kind: str, peers: list[str]):
        super().__init__(name, vid, env)
        self.kind, self.peers = kind, list(peers)

    def evaluate(self, version: int) -> None:
        """No model to evaluate: a benchmark."""

    async def run(self) -> None:
        if self.name != "w0":  # a peer: echo pings, receive the bytes, ack
            return await self.repeat(self._answer)
        self.make_model()  # the run's result vworker holds a (flat) model
        self.version = 0
        await self.repeat(self._repetition)

    async def _answer(self) -> None:
        if self.kind == "p2p":
            await self.recv(src="w0", tag="ping")
            return await self._pinged()
        await self.recv(src="w0", tag="go")
        self._go()

    async def _pinged(self) -> None:
        self.send("w0", None, nbytes=TINY, tag="echo")
        await self.recv(src="w0", tag="data")
        self._ack()

    def _ack(self) -> None:
        self.send("w0", None, nbytes=TINY, tag="ack")

    def _go(self) -> None:
        self.send("w0", None, nbytes=self.training.model_bytes, tag="data")

    async def _repetition(self) -> bool:
        """One repetition, recorded as a global update, then the gap; True when the run stops."""
        return await self._measured(await (self._p2p() if self.kind == "p2p" else self._fanin()))

    async def _measured(self, took: float) -> bool:
        self.version += 1
        if self.updated(self.version, took, 0, 0, self.training.model_bytes):
            return True
        await self.sleep(int(round(float(self.setting("gap", 0.05)) * 1e9)))
        return False

    async def _p2p(self) -> float:
        t0 = self.now
        self.send("w1", None, nbytes=TINY, tag="ping")
        await self.recv(src="w1", tag="echo")
        return await self._p2p_data(self.now - t0)

    async def _p2p_data(self, rtt: int) -> float:
        t1 = self.now
        self.send("w1", None, nbytes=self.training.model_bytes, tag="data")
        await self.recv(src="w1", tag="ack")
        return self._took(t1, rtt)

    def _took(self, t1: int, rtt: int = 0) -> float:
        """Seconds since ``t1``, less half the round trip ``rtt``."""
        return (self.now - t1 - rtt / 2) / 1e9

    async def _fanin(self) -> float:
        """A start signal stands in for the barrier; the clock starts when it has reached them."""
        for p in self.peers:
            self.send(p, None, nbytes=TINY, tag="go")
        return await self._fanin_wait(self.now)

    async def _fanin_wait(self, t1: int, i: int = 0) -> float:
        """Until the data of ``peers[i:]`` has arrived (the clock started at ``t1``)."""
        while i < len(self.peers):
            await self.recv(src=self.peers[i], tag="data")
            i += 1
        return self._took(t1)


class Microbench(Strategy):
    name = "microbench"
    result = "w0"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        kind = settings.get("kind") or "p2p"
        if kind not in KINDS:
            raise ValueError(f"strategy.kind={kind!r} is not valid; accepted: {' | '.join(KINDS)}")
        n = 1 if kind == "p2p" else workers
        names = [f"w{i}" for i in range(n + 1)]
        # every vworker "holds data" only so that the workload has shards; none is read
        return [VWorkerSpec(w, f"{__name__}.BenchWorker", {"kind": kind, "peers": names[1:]}, holds_data=True)
                for w in names]


# ------------------------------------------------------------------ checkpoints (agents.checkpoint)
# The rest of each frame above after the await it is suspended in (``below``), in tail-call form.
finishes(BenchWorker.run, None)


@continues(BenchWorker._answer)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    if below == "_pinged":
        return value
    if f["self"].kind == "p2p":
        return await f["self"]._pinged()
    f["self"]._go()


@continues(BenchWorker._pinged)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    f["self"]._ack()


@continues(BenchWorker._repetition)
async def _(f: dict[str, Any], value: Any, below: str) -> bool:
    if below in ("_p2p", "_fanin"):
        return await f["self"]._measured(value)
    return value


finishes(BenchWorker._measured, False)


@continues(BenchWorker._p2p)
async def _(f: dict[str, Any], value: Any, below: str) -> float:
    if below == "recv":
        return await f["self"]._p2p_data(f["self"].now - f["t0"])
    return value


@continues(BenchWorker._p2p_data)
async def _(f: dict[str, Any], value: Any, below: str) -> float:
    return f["self"]._took(f["t1"], f["rtt"])


finishes(BenchWorker._fanin)


@continues(BenchWorker._fanin_wait)
async def _(f: dict[str, Any], value: Any, below: str) -> float:
    return await f["self"]._fanin_wait(f["t1"], f["i"] + 1)

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
        nbytes = self.training.model_bytes
        gap = int(round(float(self.setting("gap", 0.05)) * 1e9))
        version = 0
        if self.name != "w0":  # a peer: echo pings, receive the bytes, ack
            while True:
                if self.kind == "p2p":
                    await self.recv(src="w0", tag="ping")
                    self.send("w0", None, nbytes=TINY, tag="echo")
                    await self.recv(src="w0", tag="data")
                    self.send("w0", None, nbytes=TINY, tag="ack")
                else:
                    await self.recv(src="w0", tag="go")
                    self.send("w0", None, nbytes=nbytes, tag="data")
        self.make_model()  # the run's result vworker holds a (flat) model
        while True:
            t0 = self.now
            if self.kind == "p2p":
                self.send("w1", None, nbytes=TINY, tag="ping")
                await self.recv(src="w1", tag="echo")
                rtt = self.now - t0
                t1 = self.now
                self.send("w1", None, nbytes=nbytes, tag="data")
                await self.recv(src="w1", tag="ack")
                took = (self.now - t1 - rtt / 2) / 1e9
            else:  # a start signal stands in for the barrier; the clock starts when it has reached them
                for p in self.peers:
                    self.send(p, None, nbytes=TINY, tag="go")
                t1 = self.now
                for p in self.peers:
                    await self.recv(src=p, tag="data")
                took = (self.now - t1) / 1e9
            version += 1
            if self.updated(version, took, 0, 0, nbytes):
                return
            await self.sleep(gap)


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

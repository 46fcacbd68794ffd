"""Cross-agent tensor throughput: 100 MB of gradients from a vworker on agent 0 to one on agent 1.

The tensor bytes travel on the direct stream from agent 0 to agent 1 (agents/direct.py); the events
that reference them go agent 0 -> controller -> agent 1 over gRPC as usual. ``--via-controller``
starts the agents with LOCKSTEP_DIRECT=0 (lockstep agent --no-direct): the bytes then travel chunked through the controller (two gRPC
hops). The time is the wall time of the windows that carry them (summary wall_barrier_s). The
baseline sends the same bytes over a raw loopback TCP socket (one hop, 1 MiB reads) in this process.
The machine is shared, so each side is measured REPEATS times (interleaved) and the best is kept.
Prints MB/s and the ratio (target >= 0.5).
usage: python benchmarks/bench_tensor_throughput.py [MB] [REPEATS] [--via-controller]
"""
from __future__ import annotations

import os
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from agents.strategies.base import Strategy, VWorkerSpec
from agents.sim.worker import Worker

CHUNK_TENSOR_MB = 25


class Sender(Worker):
    def __init__(self, name: str, vid: int, env: Any, mb: int):
        super().__init__(name, vid, env)
        n = mb // CHUNK_TENSOR_MB
        self.grads = [torch.full((CHUNK_TENSOR_MB * 2**20 // 4,), float(i)) for i in range(n)]  # built before t=0

    async def run(self) -> None:
        for i, g in enumerate(self.grads):
            self.send("rx", (g, i, 0.5, 32), tag="grad")


class Receiver(Worker):
    def __init__(self, name: str, vid: int, env: Any, mb: int):
        super().__init__(name, vid, env)
        self.n = mb // CHUNK_TENSOR_MB

    async def run(self) -> None:
        for _ in range(self.n):
            await self.recv(tag="grad")


class Blast(Strategy):
    name = "blast"
    result = "rx"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        mb = int(settings.get("mb", 100))
        return [VWorkerSpec("tx", f"{__name__}.Sender", {"mb": mb}), VWorkerSpec("rx", f"{__name__}.Receiver", {"mb": mb})]


def raw_tcp(nbytes: int) -> float:
    """MB/s of one loopback TCP connection moving ``nbytes`` (sendall / recv_into, 1 MiB buffers)."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    data = memoryview(bytearray(nbytes))
    got = [0]

    def rx():
        c, _ = srv.accept()
        buf = bytearray(nbytes)
        mv = memoryview(buf)
        while got[0] < nbytes:
            n = c.recv_into(mv[got[0]:], min(1 << 20, nbytes - got[0]))
            if n == 0:
                break
            got[0] += n
        c.close()

    t = threading.Thread(target=rx)
    t.start()
    s = socket.create_connection(("127.0.0.1", port))
    t0 = time.perf_counter()
    s.sendall(data)
    t.join()
    dt = time.perf_counter() - t0
    s.close()
    srv.close()
    return nbytes / 1e6 / dt


def main() -> None:
    from _common import run

    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    via = "--via-controller" in sys.argv[1:]
    mb = int(args[0]) if args else 100
    repeats = int(args[1]) if len(args) > 1 else 3
    nbytes = mb // CHUNK_TENSOR_MB * CHUNK_TENSOR_MB * 2**20
    if via:
        os.environ["LOCKSTEP_DIRECT"] = "0"  # the agents inherit it
    best_s, base = float("inf"), 0.0
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as d:
            r = run(Path(d), ["strategy._target_=bench_tensor_throughput.Blast", f"+strategy.mb={mb}", "workers=1",
                              "agents=2", "placement=round_robin", "network.latency=1ms", "model=mlp",
                              "compute=constant", "stop.updates=1",
                              # the payload is not model-sized: allow all of it in flight (docs/security.md)
                              f"controller.max_held_bytes={2 * nbytes}"], local=True)
        best_s = min(best_s, r.summary["wall_barrier_s"])
        base = max(base, raw_tcp(nbytes))
    ours = nbytes / 1e6 / best_s
    how = "chunked through the controller, two gRPC hops" if via else "direct stream, events via the controller"
    print(f"bench_tensor_throughput: {nbytes / 1e6:.0f} MB agent 0 -> agent 1 in {best_s:.3f} s (best of {repeats}): "
          f"{ours:.0f} MB/s ({how}); raw loopback TCP: {base:.0f} MB/s (best of {repeats}); "
          f"ratio {ours / base:.2f} (target >= 0.50)")


if __name__ == "__main__":
    main()

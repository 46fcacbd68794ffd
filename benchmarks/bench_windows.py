"""Windows per second with 4 local agents and (nearly) empty windows, vs a bare grpc.aio ping-pong.

Each of 4 vworkers (one per agent) only sleeps 1 ms at a time; the lookahead is 1 ms, so every window
is one Advance/Reached round trip per agent with no messages. The baseline does the same round trips
over 4 bare grpc.aio bidirectional streams (bytes echo) in one process. Prints windows/s and the ratio.
usage: python benchmarks/bench_windows.py [STEPS]
"""
from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agents.strategies.base import Strategy, VWorkerSpec
from agents.sim.worker import Worker


class Ticker(Worker):
    def __init__(self, name: str, vid: int, env: Any, steps: int):
        super().__init__(name, vid, env)
        self.steps = steps

    async def run(self) -> None:
        for _ in range(self.steps):
            await self.sleep(1_000_000)


class Tickers(Strategy):
    name = "tickers"
    result = "t0"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        return [VWorkerSpec(f"t{i}", f"{__name__}.Ticker", {"steps": int(settings.get("steps", 1000))})
                for i in range(workers)]


async def pingpong(rounds: int, streams: int = 4) -> float:
    import grpc

    async def echo(it, ctx):
        async for m in it:
            yield m

    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler("bench.Echo", {"Echo": grpc.stream_stream_rpc_method_handler(echo)})
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    ch = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    calls = [ch.stream_stream("/bench.Echo/Echo")() for _ in range(streams)]
    payload = b"x" * 64
    for c in calls:  # warm up
        await c.write(payload)
        await c.read()
    t0 = time.perf_counter()
    for _ in range(rounds):
        for c in calls:
            await c.write(payload)
        for c in calls:
            await c.read()
    dt = time.perf_counter() - t0
    for c in calls:
        await c.done_writing()
    await ch.close()
    await server.stop(0)
    return rounds / dt


def main() -> None:
    from _common import run

    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    with tempfile.TemporaryDirectory() as d:
        r = run(Path(d), ["strategy._target_=bench_windows.Tickers", f"+strategy.steps={steps}", "workers=4",
                          "agents=4", "placement=round_robin", "network.latency=1ms", "model=mlp",
                          "compute=constant", "stop.updates=1"], local=True)
    s = r.summary
    wps = s["windows"] / s["wall_barrier_s"]
    base = asyncio.run(pingpong(steps))
    print(f"bench_windows: {s['windows']} windows over 4 local agents in {s['wall_barrier_s']:.2f} s: "
          f"{wps:.0f} windows/s; bare grpc.aio ping-pong over 4 streams: {base:.0f} rounds/s; "
          f"ratio {wps / base:.2f}")


if __name__ == "__main__":
    main()

"""Overhead of the 64-worker default experiment (ps_async, cnn) with agents=2 local vs launcher=inprocess.

Prints both wall times (whole run: ``execute`` from the plan to summary.json, agent start-up and shutdown
included) and the window-loop time, and their ratios (target <= 1.15). Each run is a fresh Python process
(a second run in the same process would find torch._dynamo imported and the data set loaded). The machine
is shared, so each side runs REPEATS times, interleaved, and the best of each is kept.

It also prints the *floor* of any implementation of the window protocol (DESIGN §5) over gRPC on this
machine: every window the agents=2 run needs costs at least one gRPC round trip between two processes,
so ``floor = (inprocess loop + windows x bare round trip) / inprocess loop``. The bare round trip is a
grpc.aio bidirectional stream echoing 1 KiB between this process and a child, measured in the same run,
back to back (the lower bound) and with 1 ms of busy work in the child between round trips (as agents
compute between windows; the idle side then has to wake up).
usage: python benchmarks/bench_agents_overhead.py [UPDATES] [REPEATS]
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path


def one(updates: int, name: str, run_dir: str) -> None:
    from _common import run

    over = [f"stop.updates={updates}"] + (["agents=1"] if name == "inprocess" else ["agents=2"])
    s = run(Path(run_dir), over, local=name == "local").summary
    print(json.dumps({"wall_time_s": s["wall_time_s"], "wall_barrier_s": s["wall_barrier_s"],
                      "windows": s["windows"]}))


_PAYLOAD = b"x" * 1024


async def _echo_server(rounds: int, gap_s: float = 0.0) -> float:
    """Serve one echo stream to a child process that times ``rounds`` round trips; its rounds/s.

    ``gap_s``: busy work in the child between round trips (not timed).
    """
    import asyncio

    import grpc

    async def echo(it, ctx):
        async for m in it:
            yield m

    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "bench.Echo", {"Echo": grpc.stream_stream_rpc_method_handler(echo)}),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    child = await asyncio.create_subprocess_exec(sys.executable, __file__, "--client", str(port), str(rounds),
                                                 str(gap_s), stdout=asyncio.subprocess.PIPE)
    out, _ = await child.communicate()
    await server.stop(0)
    return float(out.decode().strip().splitlines()[-1])


async def _echo_client(port: int, rounds: int, gap_s: float) -> None:
    import time

    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.stream_stream("/bench.Echo/Echo")()
        for _ in range(200):  # warm up
            await call.write(_PAYLOAD)
            await call.read()
        dt = 0.0
        for _ in range(rounds):
            end = time.perf_counter() + gap_s
            while time.perf_counter() < end:  # busy, like an agent running its window
                pass
            t0 = time.perf_counter()
            await call.write(_PAYLOAD)
            await call.read()
            dt += time.perf_counter() - t0
        await call.done_writing()
    print(rounds / dt)


def main() -> None:
    import asyncio

    if sys.argv[1:2] == ["--one"]:
        return one(int(sys.argv[2]), sys.argv[3], sys.argv[4])
    if sys.argv[1:2] == ["--client"]:
        return asyncio.run(_echo_client(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])))
    updates = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    best: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as d:
        for i in range(repeats):
            for name in ("inprocess", "local"):
                out = subprocess.run([sys.executable, __file__, "--one", str(updates), name, f"{d}/{name}-{i}"],
                                     check=True, capture_output=True, text=True).stdout
                s = json.loads(out.strip().splitlines()[-1])
                if name not in best or s["wall_time_s"] < best[name]["wall_time_s"]:
                    best[name] = s
    rtt = 1.0 / max(asyncio.run(_echo_server(3000)) for _ in range(repeats))
    rtt_gap = 1.0 / max(asyncio.run(_echo_server(2000, 0.001)) for _ in range(repeats))
    base, two = best["inprocess"], best["local"]
    floor = (base["wall_barrier_s"] + two["windows"] * rtt) / base["wall_barrier_s"]
    floor_gap = (base["wall_barrier_s"] + two["windows"] * rtt_gap) / base["wall_barrier_s"]
    print(f"bench_agents_overhead: 64 workers ps_async cnn, {updates} updates, best of {repeats}: inprocess "
          f"{base['wall_time_s']:.2f} s (loop {base['wall_barrier_s']:.2f} s); agents=2 local "
          f"{two['wall_time_s']:.2f} s (loop {two['wall_barrier_s']:.2f} s, {two['windows']} windows); ratio "
          f"whole run {two['wall_time_s'] / base['wall_time_s']:.2f}, window loop "
          f"{two['wall_barrier_s'] / base['wall_barrier_s']:.2f} (target <= 1.15); bare grpc.aio round trip "
          f"between two processes {rtt * 1e6:.0f} us back to back, {rtt_gap * 1e6:.0f} us with 1 ms of work between "
          f"round trips, so the protocol's floor for the loop is {floor:.2f} ({floor_gap:.2f})")


if __name__ == "__main__":
    main()

"""Exact virtual times of the Worker API on one kernel."""
from __future__ import annotations

import asyncio

import pytest

from agents.sim.kernel import KernelError, WorkerCrashed
from agents.sim.worker import Worker


class Log(Worker):
    def __init__(self, name, vid, env, script):
        super().__init__(name, vid, env)
        self.script, self.log = script, []

    async def run(self):
        await self.script(self)


def test_sleep_resumes_at_exact_times(build_kernel):
    async def script(w):
        w.log.append(w.now)
        await w.sleep(5)
        w.log.append(w.now)
        await w.sleep(0)
        w.log.append(w.now)
        await w.sleep(1_000_000_007)
        w.log.append(w.now)

    k, _, o = build_kernel({"a": (Log, {"script": script})})
    k.run_until()
    assert o["a"].log == [0, 5, 5, 1_000_000_012]


def test_compute_takes_the_configured_time_scaled_by_speed(build_kernel):
    async def script(w):
        r = await w.compute(lambda x: x * 2, 21, kind="gradient")
        w.log.append((w.now, r))
        await w.compute(lambda: None, kind="update")
        w.log.append(w.now)

    k, env, o = build_kernel({"a": (Log, {"script": script}), "b": (Log, {"script": script})},
                             constant={"gradient": 0.25, "update": 0.001}, speed=(1.0, 2.0))
    k.run_until()
    assert o["a"].log == [(250_000_000, 42), 251_000_000]
    assert o["b"].log == [(500_000_000, 42), 502_000_000]
    assert env.stats.compute_virtual_ns == {"gradient": 750_000_000, "update": 3_000_000}


def test_compute_with_unknown_kind_names_the_key(build_kernel):
    async def script(w):
        await w.compute(lambda: None, kind="mystery")

    k, _, _ = build_kernel({"a": (Log, {"script": script})})
    with pytest.raises(WorkerCrashed, match="compute.mystery"):
        k.run_until()


def test_ping_pong_times(build_kernel):
    # 1000 bytes at 1e6 B/s = 1 ms; latency 2 ms: each hop 3 ms.
    async def ping(w):
        for _ in range(3):
            w.send("b", None, nbytes=1000, tag="ping")
            m = await w.recv(src="b")
            w.log.append((m.sent_at, m.delivered_at, w.now))

    async def pong(w):
        for _ in range(3):
            m = await w.recv(tag="ping")
            w.log.append(m.delivered_at)
            w.send(m.src, None, nbytes=1000)

    k, _, o = build_kernel({"a": (Log, {"script": ping}), "b": (Log, {"script": pong})},
                           latency_ns=2_000_000, bw=1e6)
    k.run_until()
    assert o["b"].log == [3_000_000, 9_000_000, 15_000_000]
    assert o["a"].log == [(3_000_000, 6_000_000, 6_000_000), (9_000_000, 12_000_000, 12_000_000),
                          (15_000_000, 18_000_000, 18_000_000)]


def test_send_handle_resumes_when_last_byte_left(build_kernel):
    async def sender(w):
        h1 = w.send("b", None, nbytes=500)
        h2 = w.send("b", None, nbytes=500)
        await h1
        w.log.append(w.now)
        await h2
        w.log.append(w.now)

    async def sink(w):
        for _ in range(2):
            m = await w.recv()
            w.log.append(m.delivered_at)

    k, _, o = build_kernel({"a": (Log, {"script": sender}), "b": (Log, {"script": sink})},
                           latency_ns=10, bw=1e9)
    k.run_until()
    assert o["a"].log == [500, 1000]
    assert o["b"].log == [510, 1010]


def test_recv_nowait_and_filters(build_kernel):
    async def sender(w):
        w.send("b", 1, nbytes=0, tag="x")
        w.send("b", 2, nbytes=0, tag="y")

    async def sink(w):
        assert w.recv_nowait() is None
        await w.sleep(100)
        y = w.recv_nowait(tag="y")
        x = w.recv_nowait(src="a")
        w.log.extend([y.payload, x.payload, w.recv_nowait()])

    k, _, o = build_kernel({"a": (Log, {"script": sender}), "b": (Log, {"script": sink})}, latency_ns=10)
    k.run_until()
    assert o["b"].log == [2, 1, None]


def test_wait_notify_local_is_immediate_and_remote_takes_latency(build_kernel):
    async def owner(w):
        cond = w.condition("go")
        w.env.shared = cond
        await w.wait(cond)
        w.log.append(w.now)
        w.notify(cond)  # rung before waiting: remembered once
        await w.wait(cond)
        w.log.append(w.now)

    async def other(w):
        await w.sleep(40)
        w.notify(w.env.shared)

    k, _, o = build_kernel({"a": (Log, {"script": owner}), "b": (Log, {"script": other})}, latency_ns=7)
    k.run_until()
    assert o["a"].log == [47, 47]


def test_only_the_owner_waits_on_a_condition(build_kernel):
    async def owner(w):
        w.env.shared = w.condition("c")
        await w.sleep(10)

    async def other(w):
        await w.wait(w.env.shared)

    k, _, _ = build_kernel({"a": (Log, {"script": owner}), "b": (Log, {"script": other})})
    with pytest.raises(WorkerCrashed, match="only its owner"):
        k.run_until()


def test_awaiting_asyncio_is_a_clear_error(build_kernel):
    async def script(w):
        await asyncio.sleep(1)

    k, _, _ = build_kernel({"a": (Log, {"script": script})})
    with pytest.raises(WorkerCrashed, match=r"vworker a .*not a lockstep kernel awaitable"):
        k.run_until()


def test_run_must_be_async(build_kernel):
    class Sync(Worker):
        def run(self):
            return None

    k, _, _ = build_kernel({"a": (Sync, {})})
    with pytest.raises(KernelError, match="must be 'async def'"):
        k.run_until()


def test_windows_stop_before_their_end_and_stop_finishes_the_instant(build_kernel):
    async def a(w):
        for _ in range(10):
            await w.sleep(10)
            w.log.append(w.now)
            if w.now == 30:
                w.stop_run()

    async def b(w):
        await w.sleep(30)
        w.log.append(w.now)
        await w.sleep(1)
        w.log.append(w.now)

    k, _, o = build_kernel({"a": (Log, {"script": a}), "b": (Log, {"script": b})})
    assert k.run_until(20) == 20
    assert o["a"].log == [10]
    k.run_until()
    assert o["a"].log == [10, 20, 30]
    assert o["b"].log == [30]  # same instant as the stop: runs; later: does not
    assert k.stop_time == 30

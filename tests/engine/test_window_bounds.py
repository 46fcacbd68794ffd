"""What the controller's per-agent window ends rest on: cancellable timers, output bounds, the reply cap."""
from __future__ import annotations

import math
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.sim.compute import ComputeSpec
from agents.sim.env import Environment
from agents.sim.kernel import INFINITY, Kernel, RemoteEvent
from agents.sim.kernel import _fire as kernel_fire
from agents.sim.network import ConstantLatency, NetworkSpec
from agents.sim.worker import Worker
from controller.clock import window_ends

MS = 1_000_000


class Script(Worker):
    def __init__(self, name, vid, env, script):
        super().__init__(name, vid, env)
        self.script, self.log = script, []

    async def run(self):
        await self.script(self)


def half(script, *, latency_ns=MS, bw=1e6, egress="fifo", ingress="fifo"):
    """A kernel hosting vworker "a" (id 0) of a two-vworker run; "b" (id 1) lives on another agent."""
    k = Kernel()
    env = Environment(k, ["a", "b"], NetworkSpec(ConstantLatency(latency_ns), (bw, bw), (bw, bw), egress, ingress),
                      ComputeSpec(model="constant", constant_s={"gradient": 0.0, "update": 0.0, "aggregate": 0.0}))
    w = Script("a", 0, env, script)
    k.add_worker(w)
    return k, w


def test_window_ends_are_the_lookahead_after_the_first_action_of_any_other_agent():
    ev = RemoteEvent(20, 0, 0, 1, 1, "arrive", None, effect=40)
    # agent 1 can act at 40 at the earliest (its own bound 50, the arrival routed to it acts at 40)
    assert window_ends(10, [10, 50, 30], [[], [ev], []], 5) == [35, 15, 15]
    assert window_ends(10, [10, 50], [[], []], 5) == [55, 15]
    assert window_ends(10, [10, INFINITY], [[], []], 5) == [INFINITY, 15]
    assert window_ends(10, [10, 50], [[], []], 0) == [11, 11]  # zero lookahead: the instant T
    assert window_ends(10, [10], [[]], 5) == [INFINITY]
    assert window_ends(10, [10, 50], [[], []], INFINITY) == [INFINITY, INFINITY]


def test_a_cancelled_timer_neither_runs_nor_counts_nor_shows_as_next():
    fired = []
    k = Kernel()

    async def idle(w):
        return None

    env = Environment(k, ["a"], NetworkSpec(ConstantLatency(0), (1e9,), (1e9,)),
                      ComputeSpec(model="constant", constant_s={"gradient": 0.0}))
    w = Script("a", 0, env, idle)
    k.add_worker(w)
    k.run_until()
    before = k.events_processed
    t1 = k.timer(5, 0, w, lambda: fired.append(5))
    k.timer(9, 0, w, lambda: fired.append(9))
    t1.cancel()
    assert k.next_time() == 9 and k.output_bound() == 9
    k.run_until()
    assert fired == [9] and k.events_processed == before + 1


def test_an_arrival_acts_only_once_its_bytes_have_crossed():
    async def send(w):
        await w.sleep(3)
        w.send("b", None, nbytes=1000)  # 1000 B at 1 MB/s: 1 ms on the wire, after 1 ms of latency

    k, _ = half(send)
    k.run_until()
    (ev,) = k.outbox
    assert (ev.kind, ev.time, ev.effect, ev.acts_at) == ("arrive", 3 + MS, 3 + 2 * MS - 2, 3 + 2 * MS - 2)

    # on the receiving side the queued arrival bounds the output at its effect, not its time
    got = []

    async def recv(w):
        m = await w.recv()
        got.append(m.delivered_at)

    k2 = Kernel()
    env = Environment(k2, ["a", "b"], NetworkSpec(ConstantLatency(MS), (1e6, 1e6), (1e6, 1e6), "fifo", "fifo"),
                      ComputeSpec(model="constant", constant_s={"gradient": 0.0}))
    k2.add_worker(Script("b", 1, env, recv))
    k2.run_until(1)
    k2.inject(ev)
    assert k2.next_time() == 3 + MS and k2.output_bound() == 3 + 2 * MS - 2
    k2.run_until()
    assert got == [3 + 2 * MS] and got[0] >= ev.effect


def test_a_window_stops_a_lookahead_after_the_earliest_reply_to_what_it_sent():
    async def chatter(w):
        await w.sleep(10)
        w.send("b", None, nbytes=0)  # b could act on it at 10 + 1 ms and answer 1 ms later
        for _ in range(10):
            await w.sleep(MS // 2)
            w.log.append(w.now)

    k, w = half(chatter)
    k.reply_lookahead = MS
    nxt = k.run_until(INFINITY)
    assert w.log == [10 + MS // 2, 10 + MS, 10 + 3 * MS // 2]  # 10 + 2 ms is the reply's earliest arrival
    assert nxt == 10 + 2 * MS and k.now < 10 + 2 * MS
    k.run_until(INFINITY)  # a new window (the controller's) starts uncapped until the next remote post
    assert len(w.log) == 10


def test_a_tcp_ack_crossing_agents_acts_only_after_the_hosts_share_of_the_round_trip():
    """An ACK's effect is its arrival plus what the sender's host adds before acting on it (docs/engine.md,
    "Transport model": host_rtt per connection, a keyed draw of mean ack_delay per ACK): the receiving
    agent's window may reach that far, and the sender acts exactly then on an idle port."""
    from dataclasses import replace

    from agents.sim import tcp as tcp_model
    from agents.sim.tcp import TcpSpec

    B, H, D, SEG = 125e6, 40_000, 300_000, 1448
    spec = replace(TcpSpec(), host_latency_ns=0, host_rtt_min_ns=H, host_rtt_max_ns=H, ack_delay_ns=D)

    def agent(name, vid, cls):
        k = Kernel()
        env = Environment(k, ["a", "b"], NetworkSpec(ConstantLatency(MS), (B, B), (B, B), "fifo", "fifo", spec),
                          ComputeSpec(model="constant", constant_s={"gradient": 0.0}), seed=3)
        w = cls(name, vid, env)
        k.add_worker(w)
        return k, w

    class A(Worker):
        async def run(self):
            self.send("b", None, nbytes=5 * SEG)  # one packet of 5 segments: 7 690 wire bytes

    class Bw(Worker):
        async def run(self):
            await self.recv()

    ka, wa = agent("a", 0, A)
    kb, _ = agent("b", 1, Bw)
    ka.run_until()
    (pkt,) = ka.outbox
    kb.inject(pkt)
    kb.run_until()
    (ack,) = kb.outbox
    # the data's last bit at b: 61 520 + L; the ACK leaves at once (90 bytes, 720 ns), crosses L
    u = tcp_model.keyed.uniform(3, "ack", 1, 0, 5 * SEG)
    d = int(-D * math.log1p(-u))
    assert ack.time == 61_520 + 2 * MS and ack.acts_at == 61_520 + 720 + 2 * MS + H + d
    acted = []
    net = wa.env.network
    snd = net._hosts[0].senders[1]
    on_ack = snd.on_ack
    snd.on_ack = lambda seq, tsent: (acted.append(ka.now), on_ack(seq, tsent))
    ka.inject(ack)
    assert ka.next_time() == ack.time and ka.output_bound() == ack.acts_at
    ka.run_until()
    assert acted == [ack.acts_at]


def test_why_windows_names_what_ended_every_window_of_a_run(tmp_path):
    """benchmarks/why_windows.py (docs/benchmarks.md, "What bounds the windows on the tcp network") counts
    one reason per window: as many as the run's summary has windows, the tcp conversation among them."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "why_windows.py"), "run", "launcher=inprocess", "agents=2",
         "workers=4", "model=mlp", "compute=constant", "network=tcp", "eval.every=0", "progress=false",
         "stop.updates=20", f"hydra.run.dir={tmp_path}"],
        cwd=root, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    total = int(lines[0].split()[0])
    counts = {ln.split()[2]: int(ln.split()[0]) for ln in lines[1:-3]}
    assert total == json.loads((tmp_path / "summary.json").read_text())["windows"] == sum(counts.values()) > 0
    runners = dict(item.split(":") for item in lines[-1].removeprefix("agents per window: ").split())
    assert set(runners) <= {"1", "2"} and sum(map(int, runners.values())) == total
    assert any(k.startswith("_arrive:") for k in counts) and any(k.startswith("_serve:") for k in counts)
    every, least = ([int(item.split(":")[1]) for item in ln.split(": ")[1].split()] for ln in lines[-3:-1])
    # two agents: each hears of every window the other ran, and needs at least those it runs next
    assert len(every) == len(least) == 2 and 0 < least[0] <= every[0] <= total and 0 < least[1] <= every[1]
    # a window run by one agent wakes the other; one run by both wakes each
    assert every[0] + every[1] == int(runners.get("1", 0)) + 2 * int(runners.get("2", 0))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.sampled_from(["plain", "effect", "timer", "cancelled"]),
                          st.integers(0, 30)), max_size=40))
def test_the_output_bound_is_the_earliest_action_of_any_queued_event(queued):
    """Kernel.first_output walks the heap and skips subtrees that start after its best bound so far; it
    must find what a scan of the heap's list finds: the bound, and of the events that give it the first in
    the list (so benchmarks/why_windows.py names the same event as before the walk)."""
    k = Kernel()
    owner = SimpleNamespace(id=0, name="owner", origin_seq=0)

    def plain(arg):  # pragma: no cover - never run
        pass

    def delayed(arg):  # pragma: no cover - never run
        pass

    k.on_remote("delayed", delayed, effect=lambda d, t: t + d[2])
    acts: list[tuple[int, object, object]] = []  # (when it can act, fn, arg) of every live event
    for i, (t, kind, extra) in enumerate(queued):
        if kind == "plain":
            arg = ("plain", i)
            k.schedule(t, 0, owner, plain, arg)
            acts.append((t, plain, arg))
        elif kind == "effect":
            arg = ("delayed", i, extra)
            k.schedule(t, 0, owner, delayed, arg)
            acts.append((t + extra, delayed, arg))
        else:
            timer = k.timer(t, 0, owner, lambda: None)
            if kind == "cancelled":
                timer.cancel()
            else:
                acts.append((t, kernel_fire, timer))
    bound, fn, arg = k.first_output()
    assert bound == min((a for a, _, _ in acts), default=INFINITY)
    acts_at = {id(x): a for a, _, x in acts}
    giving = [(f, x) for _, _, f, x in k._heap if acts_at.get(id(x)) == bound]
    first = giving[0] if giving else (None, None)
    assert fn is first[0] and arg is first[1]
    assert k.output_bound() == bound

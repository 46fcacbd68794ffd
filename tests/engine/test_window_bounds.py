"""What the controller's per-agent window ends rest on: cancellable timers, output bounds, the reply cap."""
from __future__ import annotations

from agents.sim.compute import ComputeSpec
from agents.sim.env import Environment
from agents.sim.kernel import INFINITY, Kernel, RemoteEvent
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

"""Multi-hop topologies (DESIGN §4.1, "Topologies"): links with bandwidth and latency, routes, max-min sharing.

A topology is a set of nodes joined by full-duplex links (each direction its own
capacity and latency); every vworker sits on a node behind its own NIC (egress at
``B_out``, ingress at ``B_in``: ``network.bandwidth``). A message is a *flow* along its
route: the sender's NIC, the directed links between the two nodes, the receiver's NIC.
The flows in transit share every link on their routes **max-min fairly** (progressive
filling: the most contended link fixes the rate of its flows, which are then taken out,
and so on), so a flow runs at the rate of its bottleneck and speeds up only when that
bottleneck frees. Rates are recomputed at every start and end of a flow. A flow that
finished sending at ``t`` is delivered at ``t + L``, ``L`` the route's latency: the
sender's ``network.latency`` plus the latency of every link on the route.

Presets: ``star`` is not built here — it is the per-NIC model of :mod:`agents.sim.network`
(one switch whose ports are the NICs). ``tree`` is sim4DistrDL's edge network (Fig. 3 of
the paper: a cloud node, edge nodes below it, end devices below each edge node, gigabit
links); ``fat_tree`` an oversubscribed two-level leaf–spine network. A topology couples
every flow that crosses a link at the same instant, wherever its sender runs, so it needs
all vworkers on one agent (validation says so).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agents.sim.kernel import PRIO_NET, Kernel, Timer
from agents.sim.network import NetworkSpec, SharedFlows, Transfer, payload_nbytes, transfer_ns
from agents.sim.routes import TopologySpec
from agents.sim.types import VirtualTime
from agents.sim.worker import Message, SendHandle

if TYPE_CHECKING:  # pragma: no cover
    from agents.sim.env import Environment
    from agents.sim.worker import Worker

__all__ = ["TopologyNetwork", "max_min_rates"]


def max_min_rates(flows: list["_Flow"], capacity: list[float]) -> None:
    """Progressive filling: set each flow's ``rate`` to its max-min fair share over the links it crosses."""
    left = list(capacity)
    users: dict[int, list[_Flow]] = {}
    for f in flows:
        f.rate = -1.0
        for l in f.links:
            users.setdefault(l, []).append(f)
    count = {l: len(fs) for l, fs in users.items()}
    unfixed = len(flows)
    while unfixed:
        link = min((l for l in users if count[l] > 0), key=lambda l: (left[l] / count[l], l))
        share = left[link] / count[link]
        for f in users[link]:
            if f.rate < 0:
                f.rate = share
                unfixed -= 1
                for l in f.links:
                    left[l] -= share
                    count[l] -= 1


class _Flow:
    __slots__ = ("links", "remaining", "rate", "tr", "handle", "owner")

    def __init__(self, links: tuple[int, ...], nbytes: float, tr: Transfer, handle: SendHandle, owner: "Worker"):
        self.links, self.remaining, self.tr, self.handle, self.owner = links, float(nbytes), tr, handle, owner
        self.rate = 0.0

    def left_ns(self) -> VirtualTime:
        return transfer_ns(max(self.remaining, 0.0), self.rate)


class TopologyNetwork(SharedFlows):
    """The Network of a run with a topology: every flow of the (single) agent over shared directed links."""

    def __init__(self, kernel: Kernel, spec: NetworkSpec, env: "Environment"):
        self.kernel, self.spec, self.env = kernel, spec, env
        topo: TopologySpec = spec.topology
        n = len(topo.node_of)
        # directed link ids: 0..n-1 NIC egress, n..2n-1 NIC ingress, then two per topology link
        self.capacity = list(spec.bandwidth_out) + list(spec.bandwidth_in)
        index: dict[tuple[str, str], int] = {}
        self.link_latency: dict[int, int] = {}
        for l in topo.links:
            for u, v in ((l.a, l.b), (l.b, l.a)):
                index[(u, v)] = len(self.capacity)
                self.link_latency[len(self.capacity)] = l.latency_ns
                self.capacity.append(l.bandwidth)
        self._index = index
        self._route_cache: dict[tuple[int, int], tuple[tuple[int, ...], int]] = {}
        self.flows: list[_Flow] = []
        self.last: VirtualTime = 0
        self.timer: Timer | None = None
        self.n = n
        kernel.on_remote("notify", self._on_notify)

    def route(self, src: int, dst: int) -> tuple[tuple[int, ...], int]:
        """The directed links (NICs included) of a message from vworker ``src`` to ``dst``, and their latency."""
        got = self._route_cache.get((src, dst))
        if got is None:
            topo = self.spec.topology
            path = topo.route(topo.node_of[src], topo.node_of[dst])
            hops = tuple(self._index[(u, v)] for u, v in zip(path, path[1:]))
            got = self._route_cache[(src, dst)] = ((src, *hops, self.n + dst), sum(self.link_latency[h] for h in hops))
        return got

    # ------------------------------------------------------------ sender
    def send(self, w: "Worker", dst: int, payload: Any, nbytes: int | None, tag: Any) -> SendHandle:
        k = self.kernel
        size = payload_nbytes(payload) if nbytes is None else int(nbytes)
        if size < 0:
            raise ValueError(f"{w.name}: send with negative nbytes {size}")
        now = k.now
        w.msg_seq += 1
        links, hop_lat = self.route(w.id, dst)
        lat = self.spec.latency.sample(w.id, dst, w.msg_seq) + hop_lat
        tr = Transfer(w.id, dst, w.name, self.env.names[dst], w.msg_seq, tag, payload, size, now, now, lat,
                      None, self.spec.bandwidth_out[w.id])
        self.env.on_send(w, tr, remote=False)
        if size == 0:
            tr.tail = tr.done = now + lat
            handle = SendHandle(k, now)
            k.schedule(now + lat, PRIO_NET, k.workers[dst], self._deliver, tr)
            return handle
        handle = SendHandle(k, None)
        self._advance()
        self.flows.append(_Flow(links, size, tr, handle, w))
        self._reschedule()
        return handle

    def notify(self, w: "Worker", owner: int, name: str) -> None:
        if owner == w.id:
            w.ring(name)
            return
        w.msg_seq += 1
        lat = self.spec.latency.sample(w.id, owner, w.msg_seq) + self.route(w.id, owner)[1]
        self.kernel.post(self.kernel.now + lat, PRIO_NET, w, owner, "notify", (owner, name))

    def _on_notify(self, data: tuple[int, str]) -> None:
        owner, name = data
        self.kernel.workers[owner].ring(name)

    # ------------------------------------------------------------- flows
    def _reschedule(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.flows:
            return
        max_min_rates(self.flows, self.capacity)
        first = min(self.flows, key=lambda f: f.left_ns())
        self.timer = self.kernel.timer(self.kernel.now + first.left_ns(), PRIO_NET, first.owner, self._tick)

    def _tick(self) -> None:
        done = self._finish()
        k = self.kernel
        for f in done:
            f.tr.tail = f.tr.done = k.now + f.tr.latency  # the last byte left now, arrives L later
            f.handle.complete(k.now)
            k.schedule(k.now + f.tr.latency, PRIO_NET, k.workers[f.tr.dst], self._deliver, f.tr)

    def _deliver(self, tr: Transfer) -> None:
        now = self.kernel.now
        msg = Message(tr.src_name, tr.dst_name, tr.tag, tr.payload, tr.nbytes, tr.sent_at, tr.seq)
        msg.delivered_at = now
        self.env.deliver(self.kernel.workers[tr.dst], msg, tr, now)

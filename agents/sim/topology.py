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

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from agents.sim.kernel import PRIO_NET, Kernel, Timer
from agents.sim.network import NetworkSpec, SharedFlows, Transfer, payload_nbytes, transfer_ns
from agents.sim.routes import TopologyError, TopologySpec
from agents.sim.types import NS_PER_S, VirtualTime
from agents.sim.worker import Message, SendHandle

if TYPE_CHECKING:  # pragma: no cover
    from agents.sim.env import Environment
    from agents.sim.worker import Worker

__all__ = ["TopologyNetwork", "max_min_rates", "max_min_columns"]

# From this many flows in transit the flows are kept as columns (numpy arrays: bytes left, rate, the links of each
# as a row) and shared by max_min_columns; below half of it, as _Flow attributes and max_min_rates again. Both do
# the same IEEE-754 operations in the same order on each flow and link (np.subtract.at subtracts once per
# occurrence, in order; argmin takes the first of equal minima, as min() does), so a run's times do not depend on
# the switch (tests/engine/test_topology.py compares them). Progressive filling over F flows costs O(F) Python
# steps per start or end of a flow; a broadcast to thousands of workers made that O(F^2) (docs/engine.md).
COLUMNS_FROM = 64


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
        if share == math.inf:  # every link the unfixed flows cross is unlimited: so are they
            for f in flows:
                if f.rate < 0:
                    f.rate = share
            return
        for f in users[link]:
            if f.rate < 0:
                f.rate = share
                unfixed -= 1
                for l in f.links:
                    left[l] -= share
                    count[l] -= 1


def max_min_columns(hops: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """:func:`max_min_rates` over columns: ``hops[i]`` the links of flow ``i`` (padded with -1), in flow order;
    returns each flow's rate."""
    rate = np.full(len(hops), -1.0)
    real = hops >= 0
    count = np.bincount(hops[real], minlength=len(capacity))
    # a copy with numpy's own float64 dtype: an array restored from a checkpoint (pickled) carries a fresh dtype
    # instance (numpy/numpy#6422), and np.subtract.at then takes its generic path (about 17x slower per element
    # here; a 4 000-worker fat tree's calls 2.9x slower in all, docs/engine.md)
    left = capacity.astype(np.float64)
    unfixed = len(hops)
    while unfixed:
        used = np.flatnonzero(count > 0)
        link = used[np.argmin(left[used] / count[used])]  # the first (smallest id) of equal shares, as min() takes
        share = left[link] / count[link]
        if share == np.inf:  # as the loop: the unfixed flows cross unlimited links only (no inf - inf)
            rate[rate < 0] = share
            return rate
        on = (hops == link).any(axis=1)
        on &= rate < 0
        rate[on] = share
        crossed = hops[on]
        crossed = crossed[crossed >= 0]
        np.subtract.at(left, crossed, share)  # once per flow crossing a link, as the loop does
        np.subtract.at(count, crossed, 1)
        unfixed -= int(np.count_nonzero(on))
    return rate


class _Columns:
    """The flows in transit as columns, in the order of ``TopologyNetwork.flows``."""

    __slots__ = ("hops", "remaining", "rate")

    def __init__(self, flows: list["_Flow"]):
        self.hops = np.full((len(flows), max(len(f.links) for f in flows)), -1, dtype=np.int64)
        for i, f in enumerate(flows):
            self.hops[i, :len(f.links)] = f.links
        self.remaining = np.array([f.remaining for f in flows], dtype=np.float64)
        self.rate = np.array([f.rate for f in flows], dtype=np.float64)

    def add(self, f: "_Flow") -> None:
        if len(f.links) > self.hops.shape[1]:
            self.hops = np.pad(self.hops, ((0, 0), (0, len(f.links) - self.hops.shape[1])), constant_values=-1)
        row = np.full((1, self.hops.shape[1]), -1, dtype=np.int64)
        row[0, :len(f.links)] = f.links
        self.hops = np.concatenate([self.hops, row])
        self.remaining = np.append(self.remaining, f.remaining)
        self.rate = np.append(self.rate, f.rate)

    def left_ns(self) -> np.ndarray:
        """:func:`transfer_ns` of each flow: round(bytes left · 1e9 / rate), half to even as round() does."""
        out = np.zeros(len(self.remaining), dtype=np.int64)
        going = (self.remaining > 0) & ~np.isinf(self.rate)
        out[going] = np.rint(self.remaining[going] * NS_PER_S / self.rate[going]).astype(np.int64)
        return out

    def keep(self, keep: np.ndarray) -> None:
        self.hops, self.remaining, self.rate = self.hops[keep], self.remaining[keep], self.rate[keep]

    def back(self, flows: list["_Flow"]) -> None:
        """Write each flow's bytes left and rate back into its _Flow (leaving columns)."""
        for f, r, q in zip(flows, self.remaining.tolist(), self.rate.tolist()):
            f.remaining, f.rate = r, q


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
            if (l.a, l.b) in index:  # refused by validation (controller.topology): one full-duplex link per pair
                raise TopologyError(f"network.topology: a second link between {l.a} and {l.b}; accepted: one "
                                    "full-duplex link per pair of nodes.")
            for u, v in ((l.a, l.b), (l.b, l.a)):
                index[(u, v)] = len(self.capacity)
                self.link_latency[len(self.capacity)] = l.latency_ns
                self.capacity.append(l.bandwidth)
        self._index = index
        self._route_cache: dict[tuple[int, int], tuple[tuple[int, ...], int]] = {}
        self.flows: list[_Flow] = []
        self.cols: _Columns | None = None  # the flows as columns, from COLUMNS_FROM of them on
        self._capacity = np.array(self.capacity, dtype=np.float64)
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
        f = _Flow(links, size, tr, handle, w)
        self.flows.append(f)
        if self.cols is not None:
            self.cols.add(f)
        elif len(self.flows) >= COLUMNS_FROM:
            self.cols = _Columns(self.flows)
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
    def _advance(self) -> None:
        if self.cols is None:
            super()._advance()
            return
        dt = self.kernel.now - self.last
        if dt:
            self.cols.remaining -= self.cols.rate * dt / NS_PER_S  # as f.remaining -= f.rate * dt / NS_PER_S
        self.last = self.kernel.now

    def _finish(self) -> list:
        if self.cols is None:
            return super()._finish()
        self.timer = None
        self._advance()
        ended = self.cols.left_ns() == 0
        done = [self.flows[i] for i in np.flatnonzero(ended).tolist()]
        going = ~ended
        self.flows = [self.flows[i] for i in np.flatnonzero(going).tolist()]
        self.cols.keep(going)
        if len(self.flows) < COLUMNS_FROM // 2:
            self.cols.back(self.flows)
            self.cols = None
        self._reschedule()
        return done

    def _reschedule(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if not self.flows:
            return
        if self.cols is not None:
            self.cols.rate = max_min_columns(self.cols.hops, self._capacity)
            left = self.cols.left_ns()
            i = int(np.argmin(left))  # the first of equal times, as min() takes
            self.timer = self.kernel.timer(self.kernel.now + int(left[i]), PRIO_NET, self.flows[i].owner, self._tick)
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

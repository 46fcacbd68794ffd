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
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agents.sim.kernel import PRIO_NET, Kernel, Timer
from agents.sim.network import NetworkSpec, Transfer, payload_nbytes, transfer_ns
from agents.sim.types import NS_PER_S, VirtualTime
from agents.sim.worker import Message, SendHandle

if TYPE_CHECKING:  # pragma: no cover
    from agents.sim.env import Environment
    from agents.sim.worker import Worker

__all__ = ["Link", "TopologySpec", "TopologyError", "TopologyNetwork", "build_routes", "max_min_rates",
           "tree_preset", "fat_tree_preset"]


class TopologyError(ValueError):
    """A topology that cannot carry messages (a missing link on a route, a routing loop, no route)."""


@dataclass(frozen=True)
class Link:
    """A full-duplex link between nodes ``a`` and ``b``: bytes/s and one-way latency (ns) in each direction."""

    a: str
    b: str
    bandwidth: float
    latency_ns: VirtualTime = 0


@dataclass(frozen=True)
class TopologySpec:
    """The resolved topology of a run: links, the node of each vworker, and the node path of each pair.

    ``routes[(src_node, dst_node)]`` lists the nodes a message passes, both ends included.
    """

    name: str
    links: tuple[Link, ...]
    node_of: tuple[str, ...]  # by vworker id
    routes: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "links": [[l.a, l.b, l.bandwidth, l.latency_ns] for l in self.links],
                "node_of": list(self.node_of), "routes": [[a, b, list(p)] for (a, b), p in sorted(self.routes.items())]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TopologySpec":
        return cls(d["name"], tuple(Link(a, b, float(bw), int(lat)) for a, b, bw, lat in d["links"]),
                   tuple(d["node_of"]), {(a, b): tuple(p) for a, b, p in d["routes"]})


def build_routes(links: tuple[Link, ...], nodes: list[str],
                 explicit: dict[tuple[str, str], list[str]] | None = None) -> dict[tuple[str, str], tuple[str, ...]]:
    """A route for every ordered pair of ``nodes``: the explicit one, checked, or a shortest path (BFS).

    Ties between shortest paths go to the neighbour listed first, so routes are deterministic.
    Raises TopologyError with one sentence for a route through a missing link, a route that
    visits a node twice (a loop), or two nodes no path joins.
    """
    adj: dict[str, list[str]] = {}
    for l in links:
        adj.setdefault(l.a, []).append(l.b)
        adj.setdefault(l.b, []).append(l.a)
    out: dict[tuple[str, str], tuple[str, ...]] = {}
    for (a, b), path in (explicit or {}).items():
        if not path or path[0] != a or path[-1] != b:
            raise TopologyError(f"network.topology.routes: the route {a}->{b} must start at {a} and end at {b}, "
                                f"got {path}.")
        for u, v in zip(path, path[1:]):
            if v not in adj.get(u, []):
                raise TopologyError(f"network.topology.routes: the route {a}->{b} ({' -> '.join(path)}) goes "
                                    f"through {u} -> {v}, which is not a link; accepted: routes along the links "
                                    "listed in network.topology.links.")
        if len(set(path)) != len(path):
            twice = next(n for n in path if path.count(n) > 1)
            raise TopologyError(f"network.topology.routes: the route {a}->{b} ({' -> '.join(path)}) visits {twice} "
                                "twice (a routing loop); accepted: routes that visit each node once.")
        out[(a, b)] = tuple(path)
    for a in dict.fromkeys(nodes):
        prev = {a: None}
        q = deque([a])
        while q:
            u = q.popleft()
            for v in adj.get(u, []):
                if v not in prev:
                    prev[v] = u
                    q.append(v)
        for b in dict.fromkeys(nodes):
            if (a, b) in out:
                continue
            if b not in prev:
                raise TopologyError(f"network.topology: no route from node {a} to node {b}; accepted: links that "
                                    "connect every node a vworker sits on.")
            path = [b]
            while path[-1] != a:
                path.append(prev[path[-1]])
            out[(a, b)] = tuple(reversed(path))
    return out


def tree_preset(n_vworkers: int, holders: list[int], data: list[int], edges: int, ends_per_edge: int,
                bandwidth: float, latency_ns: int) -> tuple[tuple[Link, ...], tuple[str, ...]]:
    """sim4DistrDL's edge network: cloud — ``edges`` edge nodes — ``ends_per_edge`` end devices each.

    Training vworkers go to the edge nodes (worker i on edge i mod edges), vworkers that hold
    data for others (``data``, the end devices of ``data.placement=end_devices``) to the end
    devices of their worker's edge, everything else (a PS, a server) to the cloud.
    """
    links = []
    for e in range(edges):
        links.append(Link("cloud", f"edge{e}", bandwidth, latency_ns))
        for j in range(ends_per_edge):
            links.append(Link(f"edge{e}", f"end{e}.{j}", bandwidth, latency_ns))
    node = ["cloud"] * n_vworkers
    for i, vid in enumerate(holders):
        node[vid] = f"edge{i % edges}"
    for i, vid in enumerate(data):
        e = i % edges if len(data) <= edges * ends_per_edge else (i % len(holders)) % edges
        node[vid] = f"end{e}.{(i // edges) % ends_per_edge}"
    return tuple(links), tuple(node)


def fat_tree_preset(n_vworkers: int, hosts_per_leaf: int, spines: int, bandwidth: float, oversubscription: float,
                    latency_ns: int) -> tuple[tuple[Link, ...], tuple[str, ...], dict]:
    """A two-level leaf–spine network: one vworker per host, ``hosts_per_leaf`` hosts per leaf switch, every leaf
    linked to every spine at ``hosts_per_leaf · bandwidth / (spines · oversubscription)``; a route between two
    leaves takes the spine ``(src leaf + dst leaf) mod spines`` (a deterministic ECMP)."""
    leaves = max(1, math.ceil(n_vworkers / hosts_per_leaf))
    up = hosts_per_leaf * bandwidth / (spines * oversubscription)
    links = [Link(f"leaf{l}", f"spine{s}", up, latency_ns) for l in range(leaves) for s in range(spines)]
    links += [Link(f"leaf{v // hosts_per_leaf}", f"host{v}", bandwidth, latency_ns) for v in range(n_vworkers)]
    node = tuple(f"host{v}" for v in range(n_vworkers))
    routes = {}
    for a in range(n_vworkers):
        for b in range(n_vworkers):
            la, lb = a // hosts_per_leaf, b // hosts_per_leaf
            if a == b:
                routes[(node[a], node[b])] = [node[a]]
            elif la == lb:
                routes[(node[a], node[b])] = [node[a], f"leaf{la}", node[b]]
            else:
                routes[(node[a], node[b])] = [node[a], f"leaf{la}", f"spine{(la + lb) % spines}", f"leaf{lb}", node[b]]
    return tuple(links), node, routes


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


class TopologyNetwork:
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
            path = topo.routes[(topo.node_of[src], topo.node_of[dst])]
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
    def _advance(self) -> None:
        now = self.kernel.now
        dt = now - self.last
        if dt:
            for f in self.flows:
                f.remaining -= f.rate * dt / NS_PER_S
        self.last = now

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
        self.timer = None
        self._advance()
        done = [f for f in self.flows if f.left_ns() == 0]
        self.flows = [f for f in self.flows if f.left_ns() != 0]
        self._reschedule()
        k = self.kernel
        for f in done:
            f.tr.tail = f.tr.done = k.now + f.tr.latency  # the last byte left now, arrives L later
            f.handle.complete(k.now)
            k.schedule(k.now + f.tr.latency, PRIO_NET, k.workers[f.tr.dst], self._deliver, f.tr)

    def _deliver(self, tr: Transfer) -> None:
        now = self.kernel.now
        msg = Message(tr.src_name, tr.dst_name, tr.tag, tr.payload, tr.nbytes, tr.sent_at, tr.seq)
        msg.delivered_at = now
        w = self.kernel.workers[tr.dst]
        self.env.on_deliver(w, tr, now)
        w.deliver(msg)

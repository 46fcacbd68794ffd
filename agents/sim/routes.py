"""The shape of a topology (DESIGN §4.1, "Topologies"): links, where each vworker sits, and routes.

Plain data shared by the plan and the engine; :mod:`agents.sim.topology` moves the bytes over it.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from agents.sim.types import VirtualTime

__all__ = ["Link", "TopologySpec", "TopologyError", "check_routes", "shortest_path", "tree_preset", "fat_tree_preset"]


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
    """The resolved topology of a run: links, the node of each vworker, and how messages are routed.

    :meth:`route` gives the nodes a message from one node to another passes, both ends included: the route
    listed in ``routes`` (a custom topology's ``routes``, checked by :func:`check_routes`), else, on a fat tree
    (``spines`` > 0), the spine ``(src leaf + dst leaf) mod spines``, else a shortest path (BFS, ties to the
    neighbour whose link is listed first). Routes are found when a message first needs them and kept, so a
    plan carries the links and the listed routes, never a route for every pair of nodes (a fat tree of
    10 000 hosts has 10^8 pairs).
    """

    name: str
    links: tuple[Link, ...]
    node_of: tuple[str, ...]  # by vworker id
    routes: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)  # the routes listed
    hosts_per_leaf: int = 0  # fat_tree: host v sits under leaf v // hosts_per_leaf
    spines: int = 0  # fat_tree: > 0; a route between two leaves takes spine (src leaf + dst leaf) mod spines
    _found: dict = field(default_factory=dict, init=False, compare=False, repr=False)  # (a, b) -> route
    _adj: dict = field(default_factory=dict, init=False, compare=False, repr=False)  # node -> neighbours

    def route(self, a: str, b: str) -> tuple[str, ...]:
        """The nodes a message from node ``a`` to node ``b`` passes, both ends included."""
        got = self._found.get((a, b))
        if got is None:
            got = self.routes.get((a, b))
            if got is None:
                got = self._fat_tree_route(a, b) if self.spines else None
            if got is None:
                got = shortest_path(self._adj or _fill(self._adj, self.links), a, b)
            self._found[(a, b)] = got
        return got

    def _fat_tree_route(self, a: str, b: str) -> tuple[str, ...] | None:
        if not (a.startswith("host") and b.startswith("host")):
            return None
        la, lb = int(a[4:]) // self.hosts_per_leaf, int(b[4:]) // self.hosts_per_leaf
        if a == b:
            return (a,)
        if la == lb:
            return (a, f"leaf{la}", b)
        return (a, f"leaf{la}", f"spine{(la + lb) % self.spines}", f"leaf{lb}", b)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "links": [[l.a, l.b, l.bandwidth, l.latency_ns] for l in self.links],
                "node_of": list(self.node_of), "routes": [list(p) for _, p in sorted(self.routes.items())],
                "hosts_per_leaf": self.hosts_per_leaf, "spines": self.spines}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TopologySpec":
        return cls(d["name"], tuple(Link(a, b, float(bw), int(lat)) for a, b, bw, lat in d["links"]),
                   tuple(d["node_of"]), {(p[0], p[-1]): tuple(p) for p in d["routes"]},
                   int(d.get("hosts_per_leaf", 0)), int(d.get("spines", 0)))

    def __getstate__(self) -> dict[str, Any]:  # a checkpoint keeps the spec, not the routes found so far
        return {**self.__dict__, "_found": {}, "_adj": {}}


def _fill(adj: dict[str, list[str]], links: tuple[Link, ...]) -> dict[str, list[str]]:
    """Each node's neighbours, in the order their links are listed."""
    for l in links:
        adj.setdefault(l.a, []).append(l.b)
        adj.setdefault(l.b, []).append(l.a)
    return adj


def shortest_path(adj: dict[str, list[str]], a: str, b: str) -> tuple[str, ...]:
    """A shortest path from ``a`` to ``b`` by breadth-first search, ties to the neighbour listed first.

    The search stops once ``b`` is found; the path is the one a search of every node would give, since a
    node's predecessor is fixed when the node is first reached."""
    prev: dict[str, str | None] = {a: None}
    q = deque([a])
    while q and b not in prev:
        u = q.popleft()
        for v in adj.get(u, ()):
            if v not in prev:
                prev[v] = u
                q.append(v)
    if b not in prev:
        raise TopologyError(f"network.topology: no route from node {a} to node {b}; accepted: links that "
                            "connect every node a vworker sits on.")
    path = [b]
    while path[-1] != a:
        path.append(prev[path[-1]])
    return tuple(reversed(path))


def check_routes(links: tuple[Link, ...], nodes: list[str],
                 explicit: dict[tuple[str, str], list[str]] | None = None) -> dict[tuple[str, str], tuple[str, ...]]:
    """The listed routes, checked, as tuples; and that the links join every node of ``nodes``.

    Raises TopologyError with one sentence for a route through a missing link, a route that visits a
    node twice (a loop), or a node of ``nodes`` no path joins to the first (links are full-duplex, so then
    every pair has a route: :meth:`TopologySpec.route` finds it when a message needs it).
    """
    adj = _fill({}, links)
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
    nodes = list(dict.fromkeys(nodes))
    if nodes:
        a = nodes[0]
        seen = {a}
        q = deque([a])
        while q:
            for v in adj.get(q.popleft(), ()):
                if v not in seen:
                    seen.add(v)
                    q.append(v)
        for b in nodes:
            if b not in seen:
                raise TopologyError(f"network.topology: no route from node {a} to node {b}; accepted: links that "
                                    "connect every node a vworker sits on.")
    return out


def tree_preset(n_vworkers: int, holders: list[int], data: list[int], edges: int, ends_per_edge: int,
                bandwidth: float, latency_ns: int) -> tuple[tuple[Link, ...], tuple[str, ...]]:
    """sim4DistrDL's edge network: cloud — ``edges`` edge nodes — ``ends_per_edge`` end devices each.

    Training vworkers go to the edge nodes (worker i on edge i mod edges), vworkers that hold
    data for others (``data``, the end devices of ``data.placement=end_devices``) to the end
    devices of their worker's edge, everything else (a PS, a server) to the cloud. Data vworker i
    serves worker ``holders[i mod len(holders)]`` (:func:`controller.plan.with_data_servers`), so it
    sits on that worker's edge ``e``, on end device ``end{e}.{k mod ends_per_edge}``, ``k`` the
    number of data vworkers placed on edge ``e`` before it.
    """
    links = []
    for e in range(edges):
        links.append(Link("cloud", f"edge{e}", bandwidth, latency_ns))
        for j in range(ends_per_edge):
            links.append(Link(f"edge{e}", f"end{e}.{j}", bandwidth, latency_ns))
    node = ["cloud"] * n_vworkers
    for i, vid in enumerate(holders):
        node[vid] = f"edge{i % edges}"
    placed = [0] * edges  # data vworkers placed on each edge so far
    for i, vid in enumerate(data):
        e = (i % max(1, len(holders))) % edges  # the edge of the worker it serves
        node[vid] = f"end{e}.{placed[e] % ends_per_edge}"
        placed[e] += 1
    return tuple(links), tuple(node)


def fat_tree_preset(n_vworkers: int, hosts_per_leaf: int, spines: int, bandwidth: float, oversubscription: float,
                    latency_ns: int) -> tuple[tuple[Link, ...], tuple[str, ...]]:
    """A two-level leaf–spine network: one vworker per host, ``hosts_per_leaf`` hosts per leaf switch, every leaf
    linked to every spine at ``hosts_per_leaf · bandwidth / (spines · oversubscription)``; a route between two
    leaves takes the spine ``(src leaf + dst leaf) mod spines`` (a deterministic ECMP: :meth:`TopologySpec.route`
    with ``spines`` set)."""
    leaves = max(1, math.ceil(n_vworkers / hosts_per_leaf))
    up = hosts_per_leaf * bandwidth / (spines * oversubscription)
    links = [Link(f"leaf{l}", f"spine{s}", up, latency_ns) for l in range(leaves) for s in range(spines)]
    links += [Link(f"leaf{v // hosts_per_leaf}", f"host{v}", bandwidth, latency_ns) for v in range(n_vworkers)]
    return tuple(links), tuple(f"host{v}" for v in range(n_vworkers))

"""The shape of a topology (DESIGN §4.1, "Topologies"): links, where each vworker sits, and routes.

Plain data shared by the plan and the engine; :mod:`agents.sim.topology` moves the bytes over it.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from agents.sim.types import VirtualTime

__all__ = ["Link", "TopologySpec", "TopologyError", "build_routes", "tree_preset", "fat_tree_preset"]


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



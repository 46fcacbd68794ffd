"""``network.topology`` from the config to a :class:`~agents.sim.topology.TopologySpec` for the plan.

Validation calls :func:`topology_spec` with the run's vworkers so that a bad topology (a
route through a missing link, a routing loop, a node no link reaches, an unknown vworker, two
links between one pair of nodes)
stops the run before anything starts, in one sentence; the plan calls it again to build it.
"""
from __future__ import annotations

from typing import Any

from agents.common.units import UnitError, parse_duration, parse_rate
from agents.sim.routes import Link, TopologyError, TopologySpec, check_routes, fat_tree_preset, tree_preset
from agents.sim.types import seconds_to_ns

__all__ = ["PRESETS", "topology_spec", "TopologyError"]

PRESETS = ("star", "tree", "fat_tree")


def _rate(key: str, v: Any) -> float:
    try:
        r = parse_rate(v, key)
    except UnitError:
        r = -1.0
    if not r > 0:
        raise TopologyError(f"{key}={v!r} is not valid; accepted: bytes/s > 0 or a string like 1Gbit/s.")
    return r


def _lat(key: str, v: Any) -> int:
    try:
        s = parse_duration(v, key)
    except UnitError:
        s = -1.0
    if s < 0:
        raise TopologyError(f"{key}={v!r} is not valid; accepted: a duration >= 0 (seconds or a string like 100us).")
    return seconds_to_ns(s)


MAX_LINKS = 65_536
"""A preset topology has at most this many links (the plan carries every one to every agent)."""


def _check_size(topology: str, links: int, what: str) -> None:
    """Refuse, before anything is built, a preset whose links would not fit a plan. (Routes are found when a
    message needs them, :meth:`TopologySpec.route`; when the plan stored one for every pair of nodes, the fuzzer
    found ``workers=3750 network.topology=fat_tree`` taking 21 GB: 14 million routes.)"""
    if links > MAX_LINKS:
        raise TopologyError(f"network.topology={topology} with {what} has {links} links; accepted: at most "
                            f"{MAX_LINKS} links.")


def topology_spec(topology: Any, links_cfg: Any, vworkers: list[Any], data_vworkers: list[int] | None = None
                  ) -> TopologySpec | None:
    """The topology of a run with ``vworkers`` (VWorkerSpecs; ``data_vworkers`` the ids of end devices); None = star."""
    if topology in (None, "star"):
        return None
    names = [v.name for v in vworkers]
    holders = [i for i, v in enumerate(vworkers) if v.holds_data]
    data = list(data_vworkers or [])
    bw = _rate("network.links.bandwidth", links_cfg.bandwidth)
    lat = _lat("network.links.latency", links_cfg.latency)
    if topology == "tree":
        edges, ends = links_cfg.edges, links_cfg.ends_per_edge
        _check_size("tree", edges * (1 + ends),
                    f"network.links.edges={edges} and network.links.ends_per_edge={ends}")
        links, node = tree_preset(len(names), holders, data, edges, ends, bw, lat)
        return TopologySpec("tree", links, node, check_routes(links, list(node)))
    if topology == "fat_tree":
        per_leaf, spines = links_cfg.hosts_per_leaf, links_cfg.spines
        leaves = -(-len(names) // per_leaf)
        _check_size("fat_tree", leaves * spines + len(names),
                    f"{leaves} leaves and network.links.spines={spines}")
        links, node = fat_tree_preset(len(names), per_leaf, spines, bw, links_cfg.oversubscription, lat)
        return TopologySpec("fat_tree", links, node, check_routes(links, list(node)), per_leaf, spines)
    if not isinstance(topology, dict):
        raise TopologyError(f"network.topology={topology!r} is not valid; accepted: {' | '.join(PRESETS)} or a mapping "
                            "{links: [[a, b, bandwidth, latency], ...], attach: {vworker: node}, routes: [[a, ..., b], ...]}.")
    extra = sorted(set(topology) - {"links", "attach", "routes"})
    if extra:
        raise TopologyError(f"network.topology.{extra[0]} is not a key of a custom topology (accepted: links, attach, "
                            "routes).")
    raw_links = topology.get("links") or []
    if not isinstance(raw_links, list) or not raw_links:
        raise TopologyError("network.topology.links is not valid; accepted: a non-empty list of [a, b, bandwidth, "
                            "latency] (latency optional).")
    links = []
    first: dict[frozenset[str], int] = {}  # each pair of nodes linked -> the entry that links it
    for i, l in enumerate(raw_links):
        if not (isinstance(l, list) and 3 <= len(l) <= 4 and all(isinstance(x, str) for x in l[:2]) and l[0] != l[1]):
            raise TopologyError(f"network.topology.links[{i}]={l!r} is not valid; accepted: [a, b, bandwidth, "
                                "latency] with two different node names.")
        j = first.setdefault(frozenset(l[:2]), i)
        if j != i:  # the engine has one link per pair: a second one silently replaced the first
            raise TopologyError(f"network.topology.links[{i}]={l!r} links {l[0]} and {l[1]} again, as "
                                f"network.topology.links[{j}]={raw_links[j]!r} does; accepted: one entry per pair of "
                                "nodes (a link is full-duplex: one entry gives both directions its bandwidth and "
                                "latency).")
        links.append(Link(l[0], l[1], _rate(f"network.topology.links[{i}]", l[2]),
                          _lat(f"network.topology.links[{i}]", l[3] if len(l) > 3 else 0)))
    nodes = {n for l in links for n in (l.a, l.b)}
    attach = topology.get("attach") or {}
    if not isinstance(attach, dict):
        raise TopologyError("network.topology.attach is not valid; accepted: a mapping {vworker: node}.")
    for name, node in attach.items():
        if name not in names:
            raise TopologyError(f"network.topology.attach names {name!r}, which is not a vworker of this run (they are "
                                f"{', '.join(names)}).")
        if node not in nodes:
            raise TopologyError(f"network.topology.attach puts {name} on node {node!r}, which no link reaches "
                                f"(nodes: {', '.join(sorted(nodes))}).")
    missing = [n for n in names if n not in attach]
    if missing:
        raise TopologyError(f"network.topology.attach does not place {', '.join(missing)}; accepted: a node for every "
                            "vworker of the run.")
    routes = {}
    raw_routes = topology.get("routes") or []
    if not isinstance(raw_routes, list):
        raise TopologyError("network.topology.routes is not valid; accepted: a list of node paths [a, ..., b].")
    for i, path in enumerate(raw_routes):
        if not (isinstance(path, list) and len(path) >= 2 and all(isinstance(x, str) for x in path)):
            raise TopologyError(f"network.topology.routes[{i}]={path!r} is not valid; accepted: a node path [a, ..., b] "
                                "(the route from its first node to its last).")
        routes[(path[0], path[-1])] = list(path)
    node_of = tuple(attach[n] for n in names)
    return TopologySpec("custom", tuple(links), node_of, check_routes(tuple(links), list(node_of), routes))

"""Topologies (DESIGN §4.1): routes, max-min sharing of every link on a route, exact virtual times."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.sim.compute import ComputeSpec
from agents.sim.env import Environment
from agents.sim.kernel import Kernel
from agents.sim.network import ConstantLatency, NetworkSpec
from agents.sim.topology import max_min_columns, max_min_rates
from agents.sim.routes import Link, TopologyError, TopologySpec, check_routes, fat_tree_preset, tree_preset
from agents.sim.worker import Worker
from tests.engine.workers import Sink

MS = 1_000_000
S = 1_000_000_000


class Sender(Worker):
    def __init__(self, name, vid, env, to=()):
        super().__init__(name, vid, env)
        self.to, self.left = to, []

    async def run(self):
        handles = [self.send(dst, None, nbytes=n) for dst, n in self.to]
        for h in handles:
            await h
        self.left = [h.done_at for h in handles]


def build(workers, links, node_of, routes=None, nic=1e15, latency_ns=0):
    names = list(workers)
    nodes = list(dict.fromkeys(node_of))
    topo = TopologySpec("test", tuple(links), tuple(node_of), check_routes(tuple(links), nodes, routes))
    k = Kernel()
    n = len(names)
    env = Environment(k, names, NetworkSpec(ConstantLatency(latency_ns), (nic,) * n, (nic,) * n, "fair", "fair", topology=topo),
                      ComputeSpec(model="constant", constant_s={"gradient": 0.0, "update": 0.0, "aggregate": 0.0}))
    objs = {}
    for vid, name in enumerate(names):
        cls, kw = workers[name]
        objs[name] = cls(name, vid, env, **kw)
        k.add_worker(objs[name])
    return k, objs


TREE = [Link("r", "a", 1000.0, 10 * MS), Link("r", "b", 1000.0, 10 * MS), Link("r", "c", 1000.0, 10 * MS)]


def test_flows_share_every_link_of_their_route_max_min_on_a_three_link_tree():
    # x on a, y on b, z on c. At t=0: F1 x->z 1000 B (a->r, r->c), F2 y->z 3000 B (b->r, r->c),
    # F3 x->y 500 B (a->r, r->b). a->r and r->c each carry two flows: all three run at 500 B/s.
    # t=1: F3 is done (+20 ms of links: delivered at 1.02 s). a->r frees, but F1 is still held at 500 B/s by
    # r->c, which it shares with F2: F1 ends at 2 s (delivered 2.02). F2 sent 1000 B by then, the other 2000
    # alone at 1000 B/s: 4 s (delivered 4.02).
    k, o = build({"x": (Sender, {"to": [("z", 1000), ("y_sink", 500)]}), "y": (Sender, {"to": [("z", 3000)]}),
                  "z": (Sink, {"expect": 2}), "y_sink": (Sink, {})}, TREE, ["a", "b", "c", "b"])
    k.run_until()
    assert o["z"].got == {"x": 2 * S + 20 * MS, "y": 4 * S + 20 * MS}
    assert o["y_sink"].got == {"x": S + 20 * MS}
    assert o["x"].left == [2 * S, S] and o["y"].left == [4 * S]


def test_the_sender_latency_adds_to_the_links_and_a_lone_flow_gets_its_bottleneck():
    links = [Link("r", "a", 4000.0, 5 * MS), Link("r", "b", 1000.0, 7 * MS)]
    k, o = build({"x": (Sender, {"to": [("z", 2000)]}), "z": (Sink, {})}, links, ["a", "b"], latency_ns=MS)
    k.run_until()
    assert o["z"].got == {"x": 2 * S + 13 * MS}  # 2000 B at the 1000 B/s link, 5 + 7 ms of links, 1 ms of host


def test_the_nic_is_a_link_too():
    k, o = build({"x": (Sender, {"to": [("z", 1000)]}), "z": (Sink, {})}, TREE[:2], ["a", "b"], nic=250.0)
    k.run_until()
    assert o["z"].got == {"x": 4 * S + 20 * MS}


def test_a_route_through_a_missing_link_is_refused_in_one_sentence():
    with pytest.raises(TopologyError) as e:
        check_routes(tuple(TREE), ["a", "c"], {("a", "c"): ["a", "b", "c"]})
    assert str(e.value) == ("network.topology.routes: the route a->c (a -> b -> c) goes through a -> b, which is not "
                            "a link; accepted: routes along the links listed in network.topology.links.")


def test_a_route_that_loops_is_refused_in_one_sentence():
    with pytest.raises(TopologyError, match=r"visits r twice \(a routing loop\)"):
        check_routes(tuple(TREE), ["a", "c"], {("a", "c"): ["a", "r", "b", "r", "c"]})


def test_nodes_no_link_joins_are_refused():
    with pytest.raises(TopologyError, match="no route from node a to node d"):
        check_routes(tuple(TREE), ["a", "d"])


def test_tree_preset_puts_workers_on_edges_data_on_end_devices_and_the_rest_in_the_cloud():
    links, node = tree_preset(7, holders=[0, 1, 2], data=[4, 5, 6], edges=3, ends_per_edge=1, bandwidth=125e6,
                              latency_ns=100_000)
    assert node == ("edge0", "edge1", "edge2", "cloud", "end0.0", "end1.0", "end2.0")
    assert len(links) == 6 and all(l.bandwidth == 125e6 for l in links)


def test_fat_tree_oversubscribes_the_uplinks_and_spreads_pairs_over_spines():
    links, node = fat_tree_preset(8, hosts_per_leaf=4, spines=2, bandwidth=1000.0, oversubscription=4.0, latency_ns=0)
    up = [l for l in links if l.b.startswith("spine")]
    assert len(up) == 4 and all(l.bandwidth == 500.0 for l in up)  # 4 hosts x 1000 / (2 spines x 4)
    topo = TopologySpec("fat_tree", links, node, check_routes(links, list(node)), hosts_per_leaf=4, spines=2)
    assert topo.route("host0", "host5") == ("host0", "leaf0", "spine1", "leaf1", "host5")
    assert topo.route("host4", "host1") == ("host4", "leaf1", "spine1", "leaf0", "host1")
    assert topo.route("host0", "host1") == ("host0", "leaf0", "host1")
    assert topo.route("host3", "host3") == ("host3",)


def _lockstep_run(*overrides):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "controller.cli", "run", "model=mlp", "compute=constant",
                           "launcher=inprocess", "workers=2", *overrides], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("routes,sentence", [
    ("[[a,c]]", "network.topology.routes: the route a->c (a -> c) goes through a -> c, which is not a link; "
                "accepted: routes along the links listed in network.topology.links."),
    ("[[a,b,a,b,c]]", "network.topology.routes: the route a->c (a -> b -> a -> b -> c) visits a twice (a routing "
                      "loop); accepted: routes that visit each node once."),
])
def test_a_bad_topology_stops_lockstep_run_with_one_sentence_and_exit_2(tmp_path, routes, sentence):
    topology = f"network.topology={{links:[[a,b,1e9],[b,c,1e9]],attach:{{w0:a,w1:c,ps0:b}},routes:{routes}}}"
    p = _lockstep_run("network=ideal", topology, f"hydra.run.dir={tmp_path}")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == ["lockstep: invalid configuration:", f"  {sentence}"]
    assert not (tmp_path / "metrics.csv").exists()


def test_network_tcp_with_a_tree_stops_lockstep_run_with_one_sentence_and_exit_2(tmp_path):
    p = _lockstep_run("network=tcp", "network.topology=tree", f"hydra.run.dir={tmp_path}")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "lockstep: invalid configuration:",
        "  network.topology=tree is not valid with network.model=tcp; accepted: star (the tcp model has no links "
        "beyond the NICs; tree, fat_tree and custom topologies run on network=ideal)."]
    assert not (tmp_path / "metrics.csv").exists()


def test_a_tree_on_the_ideal_network_preset_routes_through_the_cloud(tmp_path):
    from controller.config import load
    from controller.plan import make_plan

    plan = make_plan(load(["model=mlp", "compute=constant", "workers=2", "network=ideal", "network.topology=tree"],
                          check_data=False))
    topo = plan.network.topology
    assert plan.network.tcp is None and topo.name == "tree"
    assert topo.node_of == ("edge0", "edge1", "cloud")
    assert topo.route("edge0", "edge1") == ("edge0", "cloud", "edge1")


@pytest.mark.parametrize("overrides, sentence", [
    (["network.topology=fat_tree", "network.links.spines=100000"],
     "network.topology=fat_tree with 17 leaves and network.links.spines=100000 has 1700065 links; accepted: at most "
     "65536 links."),
    (["network.topology=tree", "network.links.edges=1000", "network.links.ends_per_edge=1000"],
     "network.topology=tree with network.links.edges=1000 and network.links.ends_per_edge=1000 has 1001000 links; "
     "accepted: at most 65536 links."),
])
def test_a_topology_too_large_for_the_plan_is_refused_before_it_is_built(overrides, sentence):
    from controller.config import ConfigError, load

    with pytest.raises(ConfigError) as e:
        load(["network=ideal", *overrides])
    assert sentence in e.value.problems[0], e.value.problems


def test_a_fat_tree_of_10000_hosts_is_planned_without_a_route_per_pair():
    """The plan keeps the links and the listed routes; a route is found when a message first needs it. When the plan
    stored a route for every pair of nodes, the fuzzer's ``workers=3750 network.topology=fat_tree`` took 21 GB
    (14 million routes), and more than 1 024 nodes were refused; 10 000 hosts have 10^8 pairs."""
    import json

    from controller.config import load
    from controller.plan import make_plan

    plan = make_plan(load(["model=mlp", "compute=constant", "batch_size=4", "workers=9999", "network=ideal",
                           "network.topology=fat_tree"], check_data=False))
    topo = plan.network.topology
    d = topo.to_dict()
    assert d["routes"] == [] and (d["hosts_per_leaf"], d["spines"]) == (4, 2)
    assert len(json.dumps(d)) < 2_000_000  # links only: 2 500 leaves x 2 spines + 10 000 hosts
    assert topo.route("host0", "host9999") == ("host0", "leaf0", "spine1", "leaf2499", "host9999")
    assert TopologySpec.from_dict(json.loads(json.dumps(d))) == topo


def every_route(links, nodes, explicit=None):
    """The route table the plan stored before routes were found on demand: a BFS of every node from each node
    (also benchmarks/bench_topology.py's baseline)."""
    from collections import deque

    adj = {}
    for l in links:
        adj.setdefault(l.a, []).append(l.b)
        adj.setdefault(l.b, []).append(l.a)
    out = {k: tuple(v) for k, v in (explicit or {}).items()}
    for a in nodes:
        prev, q = {a: None}, deque([a])
        while q:
            u = q.popleft()
            for v in adj.get(u, []):
                if v not in prev:
                    prev[v] = u
                    q.append(v)
        for b in nodes:
            if (a, b) not in out:
                path = [b]
                while path[-1] != a:
                    path.append(prev[path[-1]])
                out[(a, b)] = tuple(reversed(path))
    return out


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_routes_found_on_demand_are_the_routes_of_a_search_of_every_node(data):
    """On random connected graphs full of ties (and a listed route), in any order of asking, with the caches kept
    and after a pickle (a checkpoint drops them)."""
    import pickle

    n = data.draw(st.integers(2, 9))
    names = [f"n{i}" for i in range(n)]
    links = [Link(names[data.draw(st.integers(0, i - 1))], names[i], 1.0) for i in range(1, n)]  # a spanning tree
    for _ in range(data.draw(st.integers(0, 8))):
        a, b = data.draw(st.sampled_from(names)), data.draw(st.sampled_from(names))
        if a != b:
            links.append(Link(a, b, 1.0))
    links = data.draw(st.permutations(links))
    nodes = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=n, unique=True))
    explicit = {}
    if len(nodes) > 1 and data.draw(st.booleans()):
        explicit[(nodes[0], nodes[1])] = list(every_route(links, [nodes[0], nodes[1]])[(nodes[0], nodes[1])])
    topo = TopologySpec("custom", tuple(links), tuple(nodes), check_routes(tuple(links), nodes, explicit))
    want = every_route(links, nodes, explicit)
    pairs = data.draw(st.permutations(sorted(want)))
    for i, (a, b) in enumerate(pairs):
        if i == len(pairs) // 2:
            topo = pickle.loads(pickle.dumps(topo))
            assert topo._found == {} and topo._adj == {}
        assert topo.route(a, b) == want[(a, b)]


def _rates_by_the_loop(hops, capacity):
    from agents.sim.topology import _Flow

    flows = [_Flow(tuple(h), 1.0, None, None, None) for h in hops]
    max_min_rates(flows, list(capacity))
    return [f.rate for f in flows]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_max_min_over_columns_gives_the_loops_rates_to_the_bit(data):
    """Random flows over a few links with equal and unequal capacities (ties between links, shares that do not
    divide evenly, links without a limit): the columns' rates are the loop's, float for float."""
    import numpy as np

    n_links = data.draw(st.integers(2, 12))
    capacity = data.draw(st.lists(st.sampled_from([1000.0, 1000.0, 333.3, 1e9 / 7, 125e6, math.inf]),
                                  min_size=n_links, max_size=n_links))
    if all(math.isinf(c) for c in capacity):
        capacity[0] = 1000.0
    hops = data.draw(st.lists(st.lists(st.integers(0, n_links - 1), min_size=1, max_size=6, unique=True),
                              min_size=1, max_size=120))
    width = max(len(h) for h in hops)
    cols = np.full((len(hops), width), -1, dtype=np.int64)
    for i, h in enumerate(hops):
        cols[i, :len(h)] = h
    got = max_min_columns(cols, np.array(capacity, dtype=np.float64)).tolist()
    want = _rates_by_the_loop(hops, capacity)
    assert [x.hex() for x in got] == [x.hex() for x in want]


def test_the_columns_subtract_with_numpys_own_dtype_after_a_restore(monkeypatch):
    """A network restored from a checkpoint holds unpickled arrays, whose dtype is a fresh instance
    (numpy/numpy#6422); np.subtract.at then takes its generic path, about 17x slower per element on this VM (a
    4 000-worker fat tree's calls: 1016 against 350 us each). The filling subtracts from a copy with numpy's own
    float64."""
    import pickle

    import numpy as np

    import agents.sim.topology as topology

    capacity = pickle.loads(pickle.dumps(np.array([1000.0, 300.0, 2000.0])))
    assert capacity.dtype is not np.dtype(np.float64)  # the premise: pickle does not intern the dtype
    seen = []

    class Subtract:
        @staticmethod
        def at(a, idx, v):
            seen.append(a.dtype is np.dtype(a.dtype.char))
            np.subtract.at(a, idx, v)

    class Numpy:
        subtract = Subtract

        def __getattr__(self, name):
            return getattr(np, name)

    monkeypatch.setattr(topology, "np", Numpy())
    hops = np.array([[0, 1], [1, 2], [2, -1]])
    assert max_min_columns(hops, capacity).tolist() == [150.0, 150.0, 1850.0]
    assert seen and all(seen)


def test_flows_on_unlimited_links_alone_are_unlimited_and_never_nan():
    """The draw the property above once found (a clean-clone CI run, 2026-11-30): two flows share an unlimited
    link and cross nothing else. The loop subtracted one's infinite share from the link's infinite capacity
    (inf - inf = nan), and the next choice between a nan share and an inf one differed between the loop and
    the columns: one gave the second flow inf, the other nan — a rate no transfer could finish at."""
    import numpy as np

    inf = math.inf
    capacity = [1000.0, 1000.0, 1000.0, inf, 1000.0, inf, 1000.0, 1000.0, 1000.0, 1000.0, inf]
    hops = [[0, 1, 2, 3, 4, 5], [3, 10], [10, 5]]
    cols = np.full((3, 6), -1, dtype=np.int64)
    for i, h in enumerate(hops):
        cols[i, :len(h)] = h
    assert _rates_by_the_loop(hops, capacity) == [1000.0, inf, inf]
    assert max_min_columns(cols, np.array(capacity)).tolist() == [1000.0, inf, inf]


class LateSender(Sender):
    def __init__(self, name, vid, env, to=(), at=0):
        super().__init__(name, vid, env, to)
        self.at = at

    async def run(self):
        await self.sleep(self.at)
        await super().run()


def _crowd(n=200):
    """``n`` senders on four leaves of two spines, in two waves 2 s apart, to three sinks: more than COLUMNS_FROM
    flows at once, then fewer than half of it, then more again."""
    links = [Link(f"leaf{l}", f"spine{s}", 3e5 + 1e5 * s, 10_000) for l in range(4) for s in range(2)]
    links += [Link(f"leaf{l}", f"h{l}.{j}", 1e6 / (j + 1), 5_000) for l in range(4) for j in range(3)]
    workers, node_of = {}, []
    for i in range(n):
        workers[f"s{i}"] = (LateSender, {"to": [(f"k{i % 3}", 1000 + 37 * i)], "at": (i % 2) * 2 * S + i * 1000})
        node_of.append(f"h{i % 4}.{i % 3}")
    for j in range(3):
        workers[f"k{j}"] = (Sink, {"expect": len(range(j, n, 3))})
        node_of.append(f"h{(j + 1) % 4}.{j}")
    return workers, links, node_of


def test_a_crowd_of_flows_ends_at_the_same_nanoseconds_with_columns_as_with_the_loop(monkeypatch):
    import agents.sim.topology as topology

    def run():
        k, o = build(*_crowd(), nic=2e6, latency_ns=1_000)
        k.run_until()
        return {name: (w.got if isinstance(w, Sink) else w.left) for name, w in o.items()}

    calls, switches = [], []
    real, back = topology.max_min_columns, topology._Columns.back
    monkeypatch.setattr(topology, "max_min_columns", lambda *a: calls.append(len(a[0])) or real(*a))
    monkeypatch.setattr(topology._Columns, "back", lambda self, flows: switches.append(len(flows)) or back(self, flows))
    with_columns = run()
    assert max(calls) >= 90 and len(calls) > 100  # the columns ran, with the crowd in them ...
    assert len(switches) == 2 and max(switches) < topology.COLUMNS_FROM // 2  # ... left twice, one wave each
    monkeypatch.setattr(topology, "COLUMNS_FROM", 10 ** 9)
    calls.clear()
    assert run() == with_columns and not calls
    assert sum(len(v) for v in with_columns.values()) == 2 * 200

"""Two topology bugs: end devices under another worker's edge (tree preset), a repeated custom link."""
from __future__ import annotations

import pytest

from agents.sim.compute import ComputeSpec
from agents.sim.env import Environment
from agents.sim.kernel import Kernel
from agents.sim.network import ConstantLatency, NetworkSpec
from agents.sim.routes import Link, TopologyError, TopologySpec, tree_preset


def _plan(*overrides):
    from controller.config import load
    from controller.plan import make_plan

    return make_plan(load(["model=mlp", "compute=constant", *overrides], check_data=False))


def test_every_end_device_sits_under_the_edge_of_the_worker_it_serves():
    # the tester's run: 2 workers on edge0 and edge1, 2 end devices each, 2 end nodes per edge. d2 serves c0 and
    # was put on end2.0 (under edge2), d3 serves c1 and was put on end0.1 (under edge0).
    plan = _plan("+experiment=sim4distrdl_edge", "workers=2", "data.end_devices=2", "network.links.ends_per_edge=2")
    names = [v.name for v in plan.vworkers]
    node = dict(zip(names, plan.network.topology.node_of))
    serves = {v.name: v.kwargs["serves"] for v in plan.vworkers if v.cls.endswith("DataServer")}
    assert serves == {"d0": "c0", "d1": "c1", "d2": "c0", "d3": "c1"}
    assert [node[n] for n in ("c0", "c1", "server")] == ["edge0", "edge1", "cloud"]
    assert {d: node[d] for d in serves} == {"d0": "end0.0", "d1": "end1.0", "d2": "end0.1", "d3": "end1.1"}
    for d, w in serves.items():  # below its worker's edge: one link away
        assert plan.network.topology.route(node[d], node[w]) == (node[d], node[w])


@pytest.mark.parametrize("holders, n_data, edges, ends, want", [
    # fewer data vworkers than end nodes, fewer workers than edges: edge2 has no worker, so no end device in use
    (2, 4, 3, 2, ["end0.0", "end1.0", "end0.1", "end1.1"]),
    # more workers than edges: c3 shares edge0 with c0, so its end device takes edge0's next end node
    (4, 4, 3, 2, ["end0.0", "end1.0", "end2.0", "end0.1"]),
    # more data vworkers than end nodes: each edge's end nodes in turn
    (2, 8, 3, 2, ["end0.0", "end1.0", "end0.1", "end1.1", "end0.0", "end1.0", "end0.1", "end1.1"]),
    # the default experiment (3 workers, 3 edges, 1 end each), and 2 end devices per worker
    (3, 3, 3, 1, ["end0.0", "end1.0", "end2.0"]),
    (3, 6, 3, 1, ["end0.0", "end1.0", "end2.0"] * 2),
])
def test_tree_preset_puts_data_vworker_i_under_the_edge_of_worker_i_mod_workers(holders, n_data, edges, ends, want):
    n = holders + 1 + n_data  # the workers, a server, the data vworkers (controller.plan.with_data_servers)
    data = list(range(holders + 1, n))
    links, node = tree_preset(n, list(range(holders)), data, edges, ends, 1e9, 0)
    assert [node[v] for v in data] == want
    for i, v in enumerate(data):
        edge = node[i % holders]
        assert any({l.a, l.b} == {edge, node[v]} for l in links), (v, node[v], edge)


@pytest.mark.parametrize("links, i, j", [
    ("[[a,b,1Gbit/s,100us],[a,b,10Mbit/s,100us]]", 1, 0),
    ("[[a,b,10Mbit/s,100us],[a,b,1Gbit/s,100us]]", 1, 0),
    ("[[a,b,1Gbit/s],[b,a,10Mbit/s]]", 1, 0),  # the other order is the same pair: a link is duplex
    ("[[a,c,1Gbit/s],[a,b,1Gbit/s],[c,b,1Gbit/s],[b,a,1Gbit/s]]", 3, 1),
])
def test_a_second_link_between_two_nodes_is_refused_before_the_run(links, i, j):
    from controller.config import ConfigError, load

    topology = f"network.topology={{links:{links},attach:{{w0:a,w1:a,w2:a,w3:a,ps0:b}}}}"
    with pytest.raises(ConfigError) as e:
        load(["model=mlp", "compute=constant", "network=ideal", topology], check_data=False)
    problems = [p for p in e.value.problems if "network.topology.links" in p]
    assert len(problems) == 1, e.value.problems
    p = problems[0]
    assert p.startswith(f"network.topology.links[{i}]=") and f"network.topology.links[{j}]=" in p
    assert "full-duplex" in p and p.count(". ") == 0 and p.endswith(".")


def test_the_exact_sentence_for_a_repeated_link():
    from controller.config import ConfigError, load

    with pytest.raises(ConfigError) as e:
        load(["model=mlp", "compute=constant", "network=ideal",
              "network.topology={links:[[a,b,1Gbit/s],[b,a,10Mbit/s]],attach:{w0:a,w1:a,w2:a,w3:a,ps0:b}}"],
             check_data=False)
    assert ("network.topology.links[1]=['b', 'a', '10Mbit/s'] links b and a again, as network.topology.links[0]="
            "['a', 'b', '1Gbit/s'] does; accepted: one entry per pair of nodes (a link is full-duplex: one entry "
            "gives both directions its bandwidth and latency).") in e.value.problems


def test_the_engine_refuses_a_second_link_between_two_nodes_too():
    topo = TopologySpec("test", (Link("a", "b", 1e9), Link("b", "a", 1e6)), ("a", "b"))
    with pytest.raises(TopologyError, match="a second link between b and a"):
        Environment(Kernel(), ["x", "y"], NetworkSpec(ConstantLatency(0), (1e15,) * 2, (1e15,) * 2, "fair", "fair",
                                                     topology=topo),
                    ComputeSpec(model="constant", constant_s={"gradient": 0.0, "update": 0.0, "aggregate": 0.0}))


def test_distinct_links_in_a_custom_topology_still_run_the_run(tmp_path):
    plan = _plan("network=ideal", "workers=2",
                 "network.topology={links:[[a,b,1Gbit/s,100us],[b,c,10Mbit/s]],attach:{w0:a,w1:c,ps0:b}}")
    assert [(l.a, l.b) for l in plan.network.topology.links] == [("a", "b"), ("b", "c")]

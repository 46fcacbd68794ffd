"""DESIGN §5 placement independence: 1, 2 and 4 agents, two placements, in-process and over gRPC."""
from __future__ import annotations

import pytest

from .conftest import assert_same_outputs, run

COMMON = ["workers=8", "stop.updates=24", "eval.every=8", "eval.samples=500", "network.latency=1ms"]

# (agents, placement, over local gRPC subprocesses?)
VARIANTS = [(2, "round_robin", True), (2, "block", False), (4, "round_robin", False), (4, "block", True)]


@pytest.mark.parametrize("strategy", ["ps_sync", "ps_async"])
def test_results_do_not_depend_on_agents_or_placement(tmp_path, strategy):
    base = tmp_path / "a1"
    r1 = run(base, COMMON + [f"strategy={strategy}", "agents=1"])
    assert r1.summary["updates"] == 24
    for agents, placement, local in VARIANTS:
        d = tmp_path / f"a{agents}-{placement}-{'local' if local else 'inprocess'}"
        r = run(d, COMMON + [f"strategy={strategy}", f"agents={agents}", f"placement={placement}"], local=local)
        assert r.summary["messages_remote"] > 0, "vworkers should really be spread over agents"
        assert_same_outputs(base, d)
        cpu = r.summary["wall_cpu_s"]  # where the work went: each agent's process reports its own CPU time
        assert len(cpu["agents"]) == agents and cpu["controller"] > 0
        assert all(s > 0 for s in cpu["agents"])
        if local:  # separate processes, started fresh: no agent counts the controller's CPU (this test process)
            assert max(cpu["agents"]) < cpu["controller"]
            # direct windows: the thread that ran them in each agent, a part of that agent's process
            assert len(cpu["window_loops"]) == agents
            assert all(0 < w <= a for w, a in zip(cpu["window_loops"], cpu["agents"]))
        else:  # the controller's own loop ran the windows
            assert "window_loops" not in cpu


TCP = ["workers=4", "eval.every=4", "eval.samples=200", "network=tcp", "network.latency=1ms",
       "network.bandwidth=100Mbit/s", "network.tcp.host_jitter=100us", "compute.gradient=0.005"]


@pytest.mark.parametrize("strategy", [["strategy=ring_allreduce", "strategy.collective=gloo", "stop.updates=6"],
                                      ["strategy=ps_async", "stop.updates=16"],
                                      # the receiver's delayed ACKs: timers, pingpong, ACKs with two send times
                                      ["strategy=ps_async", "strategy.collective=gloo", "network.tcp.delayed_ack=true",
                                       "stop.updates=16"]])
def test_the_tcp_transport_does_not_depend_on_agents_or_placement_and_reruns_identically(tmp_path, strategy):
    base = tmp_path / "a1"
    r1 = run(base, TCP + strategy + ["agents=1"])
    assert r1.summary["updates"] in (6, 16)
    again = tmp_path / "a1-again"
    run(again, TCP + strategy + ["agents=1"])
    assert_same_outputs(base, again)
    for agents, placement, local in [(2, "round_robin", True), (3, "block", False)]:
        d = tmp_path / f"a{agents}-{placement}"
        r = run(d, TCP + strategy + [f"agents={agents}", f"placement={placement}"], local=local)
        assert r.summary["messages_remote"] > 0, "vworkers should really be spread over agents"
        assert_same_outputs(base, d)

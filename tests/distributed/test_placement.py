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

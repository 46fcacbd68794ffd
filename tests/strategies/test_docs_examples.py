"""The strategies written in docs/strategies.md run as documented."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "strategies.md"


def modules() -> dict[str, str]:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    out = {}
    for b in blocks:
        m = re.match(r"# (\w+)\.py", b)
        if m:
            out[m.group(1)] = b
    return out


@pytest.fixture
def doc_modules(tmp_path, monkeypatch):
    mods = modules()
    assert set(mods) == {"myexchange", "sparse_ps", "ckpt_ps"}
    for name, code in mods.items():
        (tmp_path / f"{name}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    return mods


def test_ping_pong_round_trips_take_two_latencies_plus_two_transfers(run, doc_modules):
    ran = run(["strategy._target_=myexchange.PingPong", "strategy.name=pingpong", "workers=2", "stop.updates=5",
               "network.latency=1ms", "network.bandwidth=1e8", "network.discipline=fifo"])
    t = [int(r["virtual_time_ns"]) for r in ran.rows()]
    assert t == [i * 22_000_000 for i in range(1, 6)]


def test_sparse_ps_moves_fewer_bytes_than_a_dense_gradient(run, doc_modules):
    ran = run(["strategy._target_=sparse_ps.SparseAsyncPS", "strategy.name=sparse_ps", "+strategy.k=5000",
               "workers=3", "stop.updates=6"])
    rows = ran.rows()
    assert len(rows) == 6
    assert all(int(r["bytes"]) == 5000 * (8 + 4) for r in rows)  # int64 indices + float32 values


def test_the_checkpointable_ps_restored_mid_run_ends_exactly_as_an_undisturbed_run(doc_modules):
    from agents import checkpoint
    from agents.core import AgentCore
    from agents.sim.types import INFINITY
    from controller.config import load
    from controller.plan import make_plan
    from tests import helpers

    plan = make_plan(load([*helpers.FAST, "strategy._target_=ckpt_ps.AsyncPS", "strategy.name=ckpt_ps", "workers=3",
                           "stop.updates=30", "network.latency=1ms"]), run_id="doc")

    whole, want, _, cuts = helpers.whole_run_and_cuts(plan)
    for cut in cuts:
        core = AgentCore(plan, 0, data=whole.training.data)
        got = helpers.core_rows(core.advance(cut))[0]
        core = checkpoint.restore(plan, 0, checkpoint.snapshot(core), data=whole.training.data)
        assert got + helpers.core_rows(core.advance(INFINITY))[0] == want, cut



@pytest.mark.parametrize("where", ["launcher=inprocess", "agents=2"])
def test_ping_pongs_own_rtt_records_reach_the_state_log_from_one_process_or_two_agents(doc_modules, tmp_path, where):
    # `lockstep run` as the document says, the module on PYTHONPATH. With two agents the controller once
    # refused the record ("unknown record kind 'rtt'") and failed the run; in one process it went nowhere.
    import json
    import os
    import subprocess
    import sys

    root = DOC.parents[1]
    d = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    out = subprocess.run([sys.executable, "-m", "controller.cli", "run", "strategy._target_=myexchange.PingPong",
                          "strategy.name=pingpong", "workers=2", "stop.updates=5", "network=ideal",
                          "network.latency=1ms", "network.bandwidth=1e8", "network.discipline=fifo", "progress=false",
                          where, f"hydra.run.dir={d}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    log = [json.loads(line) for line in (d / "statelog.jsonl").read_text().splitlines()]
    assert log == [{"t": i * 22_000_000, "vworker": "ping", "kind": "rtt", "ns": 22_000_000} for i in range(1, 6)]

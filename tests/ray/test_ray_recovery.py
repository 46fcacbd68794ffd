"""Agent recovery with ``launcher=ray`` on the real Ray cluster of conftest.py: an agent actor whose process
is SIGKILLed mid-run is a lost agent; the controller removes every actor and its placement group, starts a
new set in a new one, and the replayed run ends with the outputs of an undisturbed run.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import agent_pids, alive, wait_until
from tests.recovery.test_recovery import assert_identical

from .conftest import ROOT, marked_env

pytestmark = pytest.mark.slow

# about 600 rows in ~10 s on the 2-core VM: time to kill an actor in the middle
RUN = ["workers=8", "agents=2", "model=mlp", "compute=constant", "stop.updates=600", "eval.every=200",
       "progress=false", "launcher=ray", "launcher.log_poll_s=0.2", "controller.heartbeat_s=0.5",
       "network.latency=1ms"]


def _rows(run_dir: Path) -> int:
    try:
        return max(0, len((run_dir / "metrics.csv").read_text().splitlines()) - 1)
    except FileNotFoundError:
        return 0


def _lockstep(address: str, run_dir: Path, mark: str) -> subprocess.Popen:
    """``lockstep run`` on the session's cluster; its log and stderr as one stream."""
    return subprocess.Popen([sys.executable, "-m", "controller.cli", "run", *RUN, f"launcher.address={address}",
                             f"hydra.run.dir={run_dir}"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=marked_env(mark))


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory, ray_cluster) -> Path:
    d = tmp_path_factory.mktemp("undisturbed") / "run"
    proc = _lockstep(ray_cluster, d, "ray-undisturbed")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    return d


def test_an_agent_actor_killed_mid_run_is_restarted_and_the_run_ends_as_if_nothing_happened(
        tmp_path, ray_cluster, undisturbed):
    d = tmp_path / "run"
    proc = _lockstep(ray_cluster, d, "ray-restart")
    try:
        pids = agent_pids(d, 2, timeout=180, what="both actors to build their vworkers (logs copied to the run dir)")
        wait_until(lambda: _rows(d) > 200 or proc.poll() is not None, timeout=120, what="200 rows of metrics.csv")
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        os.kill(pids[1], signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert re.search(r"agent 1 was lost \(", out), out[-3000:]
    assert "the replay caught up with the" in out, out[-3000:]
    # the new set of actors in a placement group of its own, on the connection of the first
    assert re.search(r"created 2 agent actors \(placement group lockstep-\S+-r1,", out), out[-3000:]
    assert out.count("connected to the Ray cluster in") == 1, out[-3000:]
    assert_identical(undisturbed, d)
    events = [json.loads(line) for line in (d / "recovery.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["restart", "caught_up"]
    assert events[0]["agent"] == "1" and events[0]["rows_written"] > 200
    assert json.loads((d / "summary.json").read_text())["recovery"]["agent_restarts"] == 1
    new = agent_pids(d, 2, timeout=5)  # the last actor of each agent: not the first set's
    assert not set(new) & set(pids)
    wait_until(lambda: not any(alive(p) for p in pids + new), timeout=60,
               what="the processes of both sets of actors to end")

"""Agent recovery with ``launcher=ray``: an agent actor whose process is SIGKILLed mid-run is a lost agent; the
controller removes every actor and its placement group, starts a new set in a new one on the same private
Ray cluster (the default, ``launcher.address=null``: a real Ray cluster of one node on 127.0.0.1, started
for the run), and the replayed run ends with the outputs of an undisturbed run.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.helpers import agent_pids, assert_one_agent_recovered, wait_until
from tests.recovery.test_recovery import assert_identical

from .conftest import ROOT, kill_marked, marked_env, processes_with

pytestmark = pytest.mark.slow

# about 600 rows in ~10 s on the 2-core VM: time to kill an actor in the middle
RUN = ["workers=8", "agents=2", "model=mlp", "compute=constant", "stop.updates=600", "eval.every=200",
       "progress=false", "launcher=ray", "launcher.address=null", "launcher.log_poll_s=0.2",
       "controller.heartbeat_s=0.5", "network.latency=1ms"]
REPLAY = "recovery.checkpoint_every_s=0"  # the replay from virtual time 0
CHECKPOINTS = "recovery.checkpoint_every_s=0.5"  # from the latest checkpoint (docs/recovery.md)


def _rows(run_dir: Path) -> int:
    try:
        return max(0, len((run_dir / "metrics.csv").read_text().splitlines()) - 1)
    except FileNotFoundError:
        return 0


def _lockstep(run_dir: Path, mark: str, *extra: str) -> subprocess.Popen:
    """``lockstep run`` (on a private Ray cluster unless ``extra`` names one); its log and stderr as one stream."""
    return subprocess.Popen([sys.executable, "-m", "controller.cli", "run", *RUN, *extra, f"hydra.run.dir={run_dir}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=marked_env(mark))


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory, ray_cluster) -> Path:
    """On the session's cluster (the other Ray tests' too), which saves starting a private one: the same outputs."""
    d = tmp_path_factory.mktemp("undisturbed") / "run"
    proc = _lockstep(d, "ray-undisturbed", f"launcher.address={ray_cluster}", REPLAY)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    return d


@pytest.mark.parametrize("checkpoints", [False, True], ids=["replay from 0", "from a checkpoint"])
def test_an_agent_actor_killed_mid_run_is_restarted_and_the_run_ends_as_if_nothing_happened(tmp_path, undisturbed,
                                                                                             checkpoints):
    d, mark = tmp_path / "run", f"ray-restart-{uuid.uuid4().hex[:12]}"
    try:
        _restart_mid_run(d, mark, undisturbed, checkpoints)
    finally:
        kill_marked(mark)


def _restart_mid_run(d: Path, mark: str, undisturbed: Path, checkpoints: bool) -> None:
    proc = _lockstep(d, mark, CHECKPOINTS if checkpoints else REPLAY)
    try:
        pids = agent_pids(d, 2, timeout=180, what="both actors to build their vworkers (logs copied to the run dir)")
        wait_until(lambda: (_rows(d) > 200 and (not checkpoints or (d / "checkpoints" / "latest").exists()))
                   or proc.poll() is not None, timeout=120, what="200 rows of metrics.csv (and a checkpoint)")
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        os.kill(pids[1], signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert re.search(r"agent 1 was lost \(", out), out[-3000:]
    assert "the replay caught up with the" in out or checkpoints, out[-3000:]
    # the new set of actors in a placement group of its own, on the cluster of the first
    assert re.search(r"created 2 agent actors \(placement group lockstep-\S+-r1,", out), out[-3000:]
    assert out.count("started a private Ray cluster in") == 1, out[-3000:]
    assert_identical(undisturbed, d, same_config=False)  # launcher.address differs, and so does config_hash
    events = assert_one_agent_recovered(d, checkpoints)  # the new actors: from the checkpoint, or a replay
    assert events[0]["agent"] == "1"
    new = agent_pids(d, 2, timeout=5)  # the last actor of each agent: not the first set's
    assert not set(new) & set(pids)
    # the run stopped its private cluster at the end: no process it started (Ray's or an agent of either set) is left
    wait_until(lambda: not processes_with(mark), timeout=30, what="every process of the run's Ray cluster to end",
               on_timeout=lambda: f"left: {processes_with(mark)}")

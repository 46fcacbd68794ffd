"""Failure handling: a killed agent, a silent agent, Ctrl-C — bounded time, clear error, outputs kept.

The agent failures here run with recovery.agents=fail; tests/recovery has what restart does."""
from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from controller.launchers.base import AgentFailure
from tests.helpers import agent_pids, alive

from .conftest import ROOT, run

LONG = ["workers=8", "agents=2", "model=mlp", "compute=constant", "stop.updates=1000000", "eval.every=0",
        "recovery.agents=fail",
        "progress=false", "launcher=local", "controller.heartbeat_s=0.5", "network.latency=1ms"]


def _cli(run_dir: Path, overrides: list[str], new_session: bool = False) -> subprocess.Popen:
    """``lockstep run`` as a process (``new_session``: leading a process group of its own, as in a terminal)."""
    return subprocess.Popen([sys.executable, "-m", "controller.cli", "run", *overrides, f"hydra.run.dir={run_dir}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=new_session)


def test_a_killed_agent_stops_the_run_with_a_clear_error_and_readable_outputs(tmp_path):
    d = tmp_path / "run"
    proc = _cli(d, LONG)
    try:
        pids = agent_pids(d, 2, timeout=90, first_rows=True)
        os.kill(pids[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    assert "agent 1 failed" in err and "SIGKILL" in err, err
    assert "last log lines of agent 1" in err and "hosting" in err, err
    assert "Traceback" not in err, err
    with open(d / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["vworker"] == "ps0" for r in rows)
    assert not any(alive(p) for p in pids)


def test_a_silent_agent_stops_the_run_after_the_agent_timeout(tmp_path):
    d = tmp_path / "run"
    stopped: list[int] = []

    def freeze():
        pids = agent_pids(d, 2, timeout=90, first_rows=True)
        os.kill(pids[0], signal.SIGSTOP)  # alive, but no more heartbeats or answers
        stopped.append(pids[0])

    t = threading.Thread(target=freeze, daemon=True)
    t.start()
    over = [o for o in LONG if not o.startswith(("launcher=", "controller.", "progress="))]
    with pytest.raises(AgentFailure) as e:
        run(d, over, local=True, heartbeat_s=0.5, agent_timeout_s=3.0)
    t.join(5)
    assert e.value.agent == "0" and "sent nothing for" in e.value.reason
    assert "agent_timeout_s=3" in e.value.reason
    assert "hosting" in e.value.log_tail
    assert stopped and not alive(stopped[0]), "the frozen agent must be killed and reaped"


def test_ctrl_c_stops_the_controller_and_every_agent_within_seconds(tmp_path):
    d = tmp_path / "run"
    proc = _cli(d, LONG)
    try:
        pids = agent_pids(d, 2, timeout=90, first_rows=True)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)  # a deadline (a pod's grace period), not a timing
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err, err
    assert not any(alive(p) for p in pids)


def test_an_agent_busy_in_a_long_window_keeps_beating(tmp_path):
    # a window that computes for 1.5 s of real time, three times the agent timeout: the agent's Beat
    # calls come from their own thread, so the controller never takes it for dead
    over = ["strategy=ps_async", "strategy._target_=tests.distributed.probe.LongWindow", "+strategy.seconds=1.5",
            "workers=1", "agents=2", "placement=round_robin", "network.latency=1ms", "stop.updates=10"]
    r = run(tmp_path / "run", over, local=True, heartbeat_s=0.1, agent_timeout_s=0.5)
    assert r.summary["updates"] == 1 and r.summary["stopped_by"] == "no_more_events"

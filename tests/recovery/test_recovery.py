"""Nothing lost (DESIGN §11, docs/recovery.md): a killed agent is restarted, a killed controller is resumed,
and either way the run ends with the outputs of an undisturbed run — the CSVs byte for byte but their
wall_* columns, params.pt bit for bit, summary.json but its wall-clock fields.

Real processes, real SIGKILL: the controller is ``lockstep run`` (launcher=local, direct windows, the
default), its agents are subprocesses speaking gRPC on 127.0.0.1.
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from controller.outputs import ReplayDiverged
from tests.distributed.conftest import ROOT, assert_same_outputs, run, wait_until
from tests.helpers import agent_pids, alive

# about 1 500 rows in ~20 s on the 2-core VM: long enough to kill something in the middle
RUN = ["workers=8", "agents=2", "model=mlp", "compute=constant", "stop.updates=1500", "eval.every=500",
       "progress=false", "launcher=local", "controller.heartbeat_s=0.5", "network.latency=1ms",
       "recovery.checkpoint_every_s=0"]  # replay from virtual time 0 (checkpoints: test_checkpoints.py)
# summary.json fields that depend on the wall clock or on the history of the run, not on its result
WALL = ("wall_time_s", "wall_compute_s", "wall_barrier_s", "wall_cpu_s", "speed_ratio", "peak_memory", "recovery", "run_id")


def _cli(*args: str) -> subprocess.Popen:
    """``lockstep ARGS``; its log (Hydra's console handler writes to stdout) and stderr come as one stream."""
    return subprocess.Popen([sys.executable, "-m", "controller.cli", *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _rows(run_dir: Path) -> int:
    try:
        return max(0, len((run_dir / "metrics.csv").read_text().splitlines()) - 1)
    except FileNotFoundError:
        return 0


def _summary(run_dir: Path) -> dict:
    s = json.loads((run_dir / "summary.json").read_text())
    s["compute_batch"].pop("overlap_wait_s", None)  # wall seconds too
    return {k: v for k, v in s.items() if k not in WALL}


def assert_identical(undisturbed: Path, recovered: Path, same_config: bool = True) -> None:
    """``same_config=False``: the runs' controller settings differ (so does their config_hash), not their results."""
    assert_same_outputs(undisturbed, recovered)
    a, b = _summary(undisturbed), _summary(recovered)
    if not same_config:
        a.pop("config_hash"), b.pop("config_hash")
    assert b == a


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("undisturbed") / "run"
    proc = _cli("run", *RUN, f"hydra.run.dir={d}")
    err, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    return d


def test_an_agent_killed_mid_run_is_restarted_and_the_run_ends_as_if_nothing_happened(tmp_path, undisturbed):
    d = tmp_path / "run"
    proc = _cli("run", *RUN, f"hydra.run.dir={d}")
    try:
        pids = agent_pids(d, 2, timeout=120)
        wait_until(lambda: _rows(d) > 400, timeout=120, what="400 rows of metrics.csv")
        os.kill(pids[1], signal.SIGKILL)
        err, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "agent 1 was lost (its process" in err and "SIGKILL" in err, err
    assert "the replay caught up with the" in err, err
    assert_identical(undisturbed, d)
    events = [json.loads(line) for line in (d / "recovery.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["restart", "caught_up"]
    assert events[0]["agent"] == "1" and events[0]["rows_written"] > 400
    assert json.loads((d / "summary.json").read_text())["recovery"]["agent_restarts"] == 1
    assert not any(alive(p) for p in pids)


def test_an_agent_that_stops_answering_is_restarted_too_with_windows_through_the_controller(tmp_path, undisturbed):
    d = tmp_path / "run"
    proc = _cli("run", *RUN, "controller.windows=hub", "controller.agent_timeout_s=3", f"hydra.run.dir={d}")
    try:
        pids = agent_pids(d, 2, timeout=120)
        wait_until(lambda: _rows(d) > 300, timeout=120, what="300 rows of metrics.csv")
        os.kill(pids[0], signal.SIGSTOP)  # alive, but no more heartbeats or answers
        err, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "agent 0 was lost (sent nothing for" in err, err
    assert_identical(undisturbed, d, same_config=False)
    assert not alive(pids[0]), "the frozen agent must be killed and reaped"


def test_a_strategy_that_cannot_be_checkpointed_says_so_once_and_its_restarted_agents_are_not_asked_again(
        tmp_path, undisturbed):
    d = tmp_path / "run"
    over = [o for o in RUN if not o.startswith("recovery.checkpoint_every_s=")]
    proc = _cli("run", *over, "strategy._target_=tests.distributed.probe.Untailed", "recovery.checkpoint_every_s=0.05",
                f"hydra.run.dir={d}")
    try:
        pids = agent_pids(d, 2, timeout=120)
        log = d / "lockstep.log"
        wait_until(lambda: log.exists() and "no checkpoints in this run" in log.read_text(), timeout=120,
                   what="three refused checkpoints")
        assert _rows(d) < 1500, "the run ended before its agent could be killed"
        os.kill(pids[1], signal.SIGKILL)
        err, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert err.count("no checkpoints in this run: vworker w") == 1, err
    assert err.count("no checkpoint this time") == 1, err
    assert "agent 1 was lost (its process" in err, err
    assert_same_outputs(undisturbed, d)  # ps_async's results, replayed from the start
    events = [json.loads(line) for line in (d / "recovery.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["restart", "caught_up"]


def test_with_recovery_agents_fail_a_killed_agent_stops_the_run_with_the_agents_error(tmp_path):
    d = tmp_path / "run"
    proc = _cli("run", *RUN, "recovery.agents=fail", f"hydra.run.dir={d}")
    try:
        pids = agent_pids(d, 2, timeout=120)
        wait_until(lambda: _rows(d) > 100, timeout=120, what="100 rows of metrics.csv")
        os.kill(pids[0], signal.SIGKILL)
        err, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    assert "the run stopped because agent 0 failed: its process" in err and "SIGKILL" in err, err
    assert "Traceback" not in err and "restarting" not in err, err
    assert not (d / "recovery.jsonl").exists()


def test_a_controller_killed_mid_run_is_finished_by_lockstep_resume_with_identical_outputs(tmp_path, undisturbed):
    d = tmp_path / "run"
    proc = _cli("run", *RUN, f"hydra.run.dir={d}")
    try:
        pids = agent_pids(d, 2, timeout=120)
        wait_until(lambda: _rows(d) > 700, timeout=120, what="700 rows of metrics.csv")
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        proc.kill()
    written = (d / "metrics.csv").read_bytes()
    # the orphaned agents notice their controller is gone and exit
    wait_until(lambda: not any(alive(p) for p in pids), timeout=120, what="the orphaned agents to exit")
    if (d / "summary.json").exists():
        assert not json.loads((d / "summary.json").read_text())["complete"]
    res = _cli("resume", str(d))
    err, _ = res.communicate(timeout=600)
    assert res.returncode == 0, err
    assert "resuming the run: replaying it to the" in err and "caught up" in err, err
    assert_identical(undisturbed, d)
    whole = written[: written.rfind(b"\n") + 1]
    assert (d / "metrics.csv").read_bytes().startswith(whole), "rows written before the crash must be kept as they were"
    again = _cli("resume", str(d))
    err, _ = again.communicate(timeout=60)
    assert again.returncode == 0 and "is complete" in err, err


# --- the replay itself, in one process (launcher=inprocess) --------------------------------------------------
SMALL = ["workers=4", "agents=2", "stop.updates=200", "eval.every=50"]


def _cut(run_dir: Path, rows: int, partial: bool = True) -> None:
    """Make ``run_dir`` look like a run whose controller died after writing ``rows`` rows of metrics.csv."""
    lines = (run_dir / "metrics.csv").read_text().splitlines(keepends=True)
    tail = lines[rows + 1][:7] if partial else ""  # half a line: the process died while writing it
    (run_dir / "metrics.csv").write_text("".join(lines[: rows + 1]) + tail)
    evals = (run_dir / "eval.csv").read_text().splitlines(keepends=True)
    (run_dir / "eval.csv").write_text("".join(evals[:2]))
    log = (run_dir / "statelog.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "statelog.jsonl").write_text("".join(log[: len(log) // 2]) + log[len(log) // 2][:9])
    for name in ("summary.json", "params.pt"):
        (run_dir / name).unlink()


def _resume(d: Path):
    """``lockstep resume d``'s run: its config.yaml, and the observer the command gives it (the state log)."""
    from controller.observe import Observer
    from controller.recovery import load_run_config
    from controller.run import execute

    rc = load_run_config(d)
    observer, r = Observer(rc, d), None
    try:
        r = execute(rc, d, resume=True, observer=observer)
    finally:
        observer.finish(None if r is None else r.summary)
    return r


def test_a_resumed_run_keeps_the_rows_on_disk_and_appends_the_rest(tmp_path):
    whole = tmp_path / "whole"
    run(whole, SMALL)
    cut = tmp_path / "cut"
    shutil.copytree(whole, cut)
    _cut(cut, 80)
    kept = (cut / "metrics.csv").read_bytes()
    kept = kept[: kept.rfind(b"\n") + 1]
    from controller.config import load
    from controller.recovery import load_run_config
    from tests.helpers import FAST

    rc = load_run_config(cut)
    assert rc.raw == load(FAST + SMALL).raw
    r = _resume(cut)
    assert (cut / "metrics.csv").read_bytes().startswith(kept)
    assert_same_outputs(whole, cut)
    rec = r.summary["recovery"]
    assert (rec["agent_restarts"], rec["resumes"]) == (0, 1) and rec["replay_wall_s"] > 0
    with open(cut / "metrics.csv", newline="") as f:
        assert len(list(csv.reader(f))) == 201


def test_a_replay_that_differs_from_the_rows_on_disk_stops_with_the_row_and_column(tmp_path):
    d = tmp_path / "run"
    run(d, SMALL)
    _cut(d, 50, partial=False)
    lines = (d / "metrics.csv").read_text().splitlines(keepends=True)
    cells = lines[10].split(",")
    cells[4] = "0.5"  # the loss of row 10
    lines[10] = ",".join(cells)
    (d / "metrics.csv").write_text("".join(lines))
    with pytest.raises(ReplayDiverged, match=r"metrics.csv row 10 \(columns loss:"):
        _resume(d)


def test_lockstep_resume_of_a_directory_without_a_run_says_so_in_one_sentence(tmp_path):
    p = _cli("resume", str(tmp_path))
    err, _ = p.communicate(timeout=60)
    assert p.returncode == 2
    assert err.strip() == (f"lockstep resume: {tmp_path} holds no run to resume (a run writes config.yaml and "
                           "plan.json there when it starts)")


def test_lockstep_run_with_recovery_resume_auto_resumes_an_unfinished_run_directory(tmp_path):
    # what the Helm chart's Job does when it restarts its controller pod: the same command line again
    from tests.helpers import FAST

    whole = tmp_path / "whole"
    first = _cli("run", *FAST, *SMALL, f"hydra.run.dir={whole}")
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out
    d = tmp_path / "run"
    shutil.copytree(whole, d)
    _cut(d, 60)
    p = _cli("run", *FAST, *SMALL, "recovery.resume=auto", f"hydra.run.dir={d}")
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 0, out
    assert f"resuming the unfinished run in {d} (recovery.resume=auto)" in out, out
    assert_same_outputs(whole, d)
    again = _cli("run", *FAST, *SMALL, "recovery.resume=auto", f"hydra.run.dir={d}")
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0 and "is complete (summary.json); nothing to resume" in out, out

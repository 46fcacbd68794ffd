"""A job of a ``--multirun`` that fails does not end the sweep: every job runs, each failure is one line naming
the job's overrides and why, and the sweep exits 1 naming how many failed (a job's ``sys.exit`` ended the sweep
there; a job's exception ended it after the last job with the first one's traceback)."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from tests.helpers import FAST

ROOT = Path(__file__).resolve().parents[2]
SHORT = [*FAST, "stop.updates=2", "workers=2", "batch_size=8", "eval.samples=10"]

# each job's outcome chosen by its seed, in place of a run (the sweep machinery around it is the real one)
_FAKE_RUNS = """
import sys
from pathlib import Path
import controller.cli as cli

def fake_run_task(cfg):
    from hydra.core.hydra_config import HydraConfig
    here = Path(HydraConfig.get().runtime.output_dir)
    if cfg.seed == 1:
        print("lockstep: cannot listen on 127.0.0.1:1 (controller.host / controller.port): in use", file=sys.stderr)
        sys.exit(1)
    if cfg.seed == 2:
        raise ValueError("a bug in a strategy\\nits second line")
    if cfg.seed == 4:
        print("lockstep: invalid configuration:", file=sys.stderr)
        print("  workers=0 is not valid; accepted: an integer >= 1.", file=sys.stderr)
        sys.exit(2)
    (here / "done").write_text(str(cfg.seed))
    return {}

cli._run_task = fake_run_task
sys.exit(cli.main(sys.argv[1:]))
"""


def _run(*args: str, code: str | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "controller.cli"]
    return subprocess.run([*cmd, "run", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_every_job_of_a_sweep_runs_and_each_failure_is_one_line_naming_the_job_and_why(tmp_path):
    sweep = tmp_path / "sweep"
    p = _run("--multirun", "seed=1,2,3,4,5", "launcher=inprocess", "model=mlp", f"hydra.sweep.dir={sweep}",
             code=_FAKE_RUNS)
    assert p.returncode == 1, p.stderr
    said = [line for line in p.stderr.splitlines() if line.startswith("lockstep: ")]
    assert said == [
        "lockstep: cannot listen on 127.0.0.1:1 (controller.host / controller.port): in use",
        "lockstep: job 0 (seed=1 launcher=inprocess model=mlp) failed: cannot listen on 127.0.0.1:1 "
        "(controller.host / controller.port): in use",
        f"lockstep: job 1 (seed=2 launcher=inprocess model=mlp) failed: ValueError: a bug in a strategy (the "
        f"traceback is in {sweep / '1' / 'lockstep.log'})",
        "lockstep: invalid configuration:",
        "lockstep: job 3 (seed=4 launcher=inprocess model=mlp) failed: invalid configuration: workers=0 is not "
        "valid; accepted: an integer >= 1.",
        f"lockstep: 3 of 5 jobs of the sweep failed (each named above); the other jobs' outputs are in {sweep}",
    ], p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    assert [(sweep / str(i) / "done").is_file() for i in range(5)] == [False, False, True, False, True]
    log = (sweep / "1" / "lockstep.log").read_text()
    assert "Traceback" in log and "ValueError: a bug in a strategy" in log, log


def test_a_sweep_without_a_failure_exits_0(tmp_path):
    p = _run("--multirun", "seed=3,5", "launcher=inprocess", "model=mlp", f"hydra.sweep.dir={tmp_path / 's'}",
             code=_FAKE_RUNS)
    assert p.returncode == 0, p.stderr
    assert "failed" not in p.stderr, p.stderr


def test_a_job_whose_run_fails_leaves_the_jobs_after_it_to_run_and_their_outputs_whole(tmp_path):
    sweep = tmp_path / "sweep"
    with socket.socket() as held:  # job 1's metrics endpoint cannot listen: its run exits with status 1
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        p = _run("--multirun", f"metrics.port=null,{port},null", *SHORT, f"hydra.sweep.dir={sweep}")
    assert p.returncode == 1, p.stderr
    failed = [line for line in p.stderr.splitlines() if " failed" in line]
    job = " ".join(SHORT).replace("progress=false", "progress=False")  # as Hydra's sweeper writes the override
    assert failed == [
        f"lockstep: job 1 (metrics.port={port} {job}) failed: cannot serve metrics on 127.0.0.1:{port} "
        "(metrics.host / metrics.port): Address already in use",
        f"lockstep: 1 of 3 jobs of the sweep failed (each named above); the other jobs' outputs are in {sweep}",
    ], p.stderr
    for job in ("0", "2"):
        assert json.loads((sweep / job / "summary.json").read_text())["complete"] is True, job
    assert not (sweep / "1" / "summary.json").is_file()


def test_a_sweep_with_an_invalid_job_runs_none_and_names_every_invalid_job(tmp_path):
    sweep = tmp_path / "sweep"
    p = _run("--multirun", "workers=2,0,-1", *[o for o in SHORT if not o.startswith("workers=")],
             f"hydra.sweep.dir={sweep}")
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines[0] == "lockstep: invalid configuration:", p.stderr
    assert [line.split(" (")[0] for line in lines[1:]] == ["  job 1", "  job 2"], p.stderr
    assert lines[1].endswith("): workers=0 is not valid; accepted: an integer >= 1."), p.stderr
    assert not sweep.exists()

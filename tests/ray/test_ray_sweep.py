"""hydra/launcher=ray: each job of a multirun is a Ray task on the sweep's cluster (a private one here)."""
from __future__ import annotations

import json
import subprocess
import sys
import uuid

from omegaconf import OmegaConf

from tests.distributed.conftest import assert_same_outputs
from tests.helpers import run, wait_until

from .conftest import ROOT, kill_marked, marked_env, need_ray, processes_with

JOB = ["workers=4", "model=mlp", "compute=constant", "stop.updates=24", "eval.every=12", "eval.samples=200",
       "progress=false"]


def test_a_two_job_multirun_on_ray_writes_both_run_directories_in_full(tmp_path):
    need_ray()
    sweep, mark = tmp_path / "sweep", f"ray-sweep-{uuid.uuid4().hex[:12]}"
    # each job is a controller with two agent subprocesses, inside a Ray task
    args = ["--multirun", "hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2", f"hydra.sweep.dir={sweep}",
            "seed=0,1", "launcher=local", "agents=2", *JOB]
    try:
        p = subprocess.run([sys.executable, "-m", "controller.cli", "run", *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=600, env=marked_env(mark))
        assert p.returncode == 0, p.stdout + p.stderr
        assert "Ray Launcher is launching 2 jobs" in p.stdout + p.stderr
        assert "started a private Ray cluster" in p.stdout + p.stderr
        for job, seed in ((0, 0), (1, 1)):
            d = sweep / str(job)
            summary = json.loads((d / "summary.json").read_text())
            assert (summary["updates"], summary["seed"], summary["agents"]) == (24, seed, 2)
            assert OmegaConf.load(d / "config.yaml").seed == seed
            assert {"metrics.csv", "eval.csv", "params.pt", "trace.json", "plan.json"} <= {f.name for f in d.iterdir()}
            assert (d / "agents" / "agent-1.log").read_text().count("hosting") == 1
        # the job ran exactly what a run of its own gives
        alone = tmp_path / "alone"
        run(alone, JOB + ["seed=1"], fast=False)
        assert_same_outputs(alone, sweep / "1")
        # the sweep stopped its private cluster: nothing it started is left
        wait_until(lambda: not processes_with(mark), timeout=30, what="every process of the sweep's Ray cluster to end",
                   on_timeout=lambda: f"left: {processes_with(mark)}")
    finally:
        kill_marked(mark)


def test_another_launcher_leaves_ray_alone():
    from controller.launchers.ray import SweepCluster

    cfg = OmegaConf.create({"hydra": {"launcher": {"_target_": "hydra._internal.core_plugins.basic_launcher."
                                                                "BasicLauncher"}}})
    cb = SweepCluster()
    cb.on_multirun_start(cfg)
    assert cb.conn is None
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()


def test_a_job_that_fails_runs_once_and_fails_the_sweep(tmp_path):
    """Ray took the job's sys.exit for its worker's crash and ran it three more times, rewriting its run
    directory, and the sweep ended with Ray's WorkerCrashedError."""
    import socket

    need_ray()
    sweep, mark = tmp_path / "sweep", f"ray-sweep-{uuid.uuid4().hex[:12]}"
    with socket.socket() as held:  # the job's controller cannot listen: lockstep exits with status 1
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        args = ["--multirun", "hydra/launcher=ray", "+hydra.launcher.ray.init.num_cpus=2", f"hydra.sweep.dir={sweep}",
                "seed=0", "launcher=local", "agents=2", f"controller.port={port}", *JOB]
        try:
            p = subprocess.run([sys.executable, "-m", "controller.cli", "run", *args], cwd=ROOT, capture_output=True,
                               text=True, timeout=600, env=marked_env(mark))
        finally:
            kill_marked(mark)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out
    assert out.count(f"lockstep: cannot listen on 127.0.0.1:{port}") == 1, out
    assert "retries remaining" not in out and "WorkerCrashedError" not in out, out
    assert "SweepJobFailed: lockstep exited with status 1; its lines above say why" in out, out

"""A relative path in the config means relative to the directory ``lockstep run`` ran in, also when
``hydra.job.chdir=true`` moves each run into its run directory (it was a DataNotFoundError traceback)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from controller.config import compose_config
from controller.config.load import absolute_paths
from tests.helpers import FAST

ROOT = Path(__file__).resolve().parents[2]
FMNIST = Path("/usr/share/datasets/fashion-mnist")
SHORT = [*FAST, "stop.updates=2", "workers=2", "batch_size=8", "eval.samples=10"]


def _lockstep(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))  # run from another directory, with this checkout's code
    return subprocess.run([sys.executable, "-m", "controller.cli", "run", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env=env)


@pytest.fixture
def launch_dir(tmp_path: Path) -> Path:
    if not (FMNIST / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip("needs Debian's dataset-fashion-mnist")
    d = tmp_path / "launch"
    (d / "data").mkdir(parents=True)
    (d / "data" / "fmnist").symlink_to(FMNIST)
    return d


def test_a_relative_data_root_with_hydra_job_chdir_is_read_from_the_launch_directory(launch_dir, tmp_path):
    run = tmp_path / "run"
    p = _lockstep(launch_dir, *SHORT, "data.root=data/fmnist", "hydra.job.chdir=true", f"hydra.run.dir={run}")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "Traceback" not in out, out
    assert yaml.safe_load((run / "config.yaml").read_text())["data"]["root"] == str(launch_dir / "data" / "fmnist")


def test_every_point_of_a_sweep_with_hydra_job_chdir_reads_a_relative_data_root_from_the_launch_directory(
        launch_dir, tmp_path):
    sweep = tmp_path / "sweep"
    p = _lockstep(launch_dir, "--multirun", *SHORT, "seed=1,2", "data.root=data/fmnist", "hydra.job.chdir=true",
                  f"hydra.sweep.dir={sweep}")
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    for point in ("0", "1"):
        cfg = yaml.safe_load((sweep / point / "config.yaml").read_text())
        assert cfg["data"]["root"] == str(launch_dir / "data" / "fmnist"), point


def test_a_missing_relative_data_root_is_one_sentence_naming_where_it_looked(launch_dir, tmp_path):
    p = _lockstep(launch_dir, *SHORT, "data.root=data/none", "hydra.job.chdir=true", f"hydra.run.dir={tmp_path / 'r'}")
    assert p.returncode == 2, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines[0] == "lockstep: invalid configuration:", p.stderr
    assert lines[1].startswith(f"  data.root='{launch_dir / 'data' / 'none'}': Fashion-MNIST not found in "), p.stderr
    assert len(lines) == 2, p.stderr


def test_relative_paths_are_made_absolute_against_the_launch_directory_and_the_rest_kept():
    cfg = compose_config(["launcher=local", "data.root=data/x", "compute.db=../db.json", "compute.profile=epyc-1t",
                          "controller.token_file=tok", "controller.tls.cert=/etc/c.pem", "controller.tls.key='~/k.pem'",
                          "controller.tls.agent_cert=a.pem"])
    absolute_paths(cfg, "/launch/here")
    assert (cfg.data.root, cfg.compute.db, cfg.compute.profile, cfg.controller.token_file) == (
        "/launch/here/data/x", "/launch/db.json", "epyc-1t", "/launch/here/tok")
    assert (cfg.controller.tls.cert, cfg.controller.tls.key, cfg.controller.tls.agent_cert) == (
        "/etc/c.pem", "~/k.pem", "/launch/here/a.pem")


def test_a_profile_given_as_a_relative_file_is_made_absolute():
    cfg = compose_config(["launcher=inprocess", "compute.profile=profiles/mine.json"])
    absolute_paths(cfg, "/launch")
    assert cfg.compute.profile == "/launch/profiles/mine.json"


def test_the_agents_paths_of_agents_on_other_machines_stay_as_written():
    cfg = compose_config(["launcher=kubernetes", "data.root=data/x", "launcher.pod_template_file=pod.yaml",
                          "launcher.kubeconfig=kube/config", "controller.tls.agent_cert=a.pem"])
    absolute_paths(cfg, "/launch")
    assert (cfg.data.root, cfg.controller.tls.agent_cert) == ("data/x", "a.pem")  # the pods' own paths
    assert (cfg.launcher.pod_template_file, cfg.launcher.kubeconfig) == ("/launch/pod.yaml", "/launch/kube/config")

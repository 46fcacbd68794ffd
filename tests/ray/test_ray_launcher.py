"""launcher=ray on a real Ray cluster: the same outputs as local subprocesses, placement, logs, failures.

The cluster is real (``ray start --head`` on 127.0.0.1, see conftest.py), the agents are real Ray actors
speaking real gRPC to the controller. Only the GPU is pretend: the cluster declares one that Ray
counts but nobody computes on (this machine has none).
"""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from controller.config import load
from controller.launchers.base import AgentFailure
from controller.plan import make_plan
from controller.remote import ControllerSettings, RemoteAgents
from controller.run import execute
from tests.distributed.conftest import FAST, agents_env, assert_same_outputs, run as run_local
from tests.helpers import agent_pids, wait_until

from .conftest import ROOT, is_loopback, kill_marked, listening, marked_env, need_ray, processes_with

COMMON = ["workers=8", "stop.updates=24", "eval.every=8", "eval.samples=500", "network.latency=1ms"]


def ray_pool(address: str, **launcher) -> tuple[RemoteAgents, "RayLauncher"]:  # noqa: F821
    from controller.launchers.ray import RayLauncher

    impl = RayLauncher({"address": address, "log_poll_s": 0.2, "stop_grace_s": 5.0, **launcher})
    settings = ControllerSettings(agent_timeout_s=30.0, startup_timeout_s=180.0, heartbeat_s=0.5)
    return RemoteAgents(impl, settings, log_level="INFO", extra_env=agents_env()), impl


def run_ray(tmp: Path, overrides: list[str], address: str, **launcher):
    pool, _ = ray_pool(address, **launcher)
    return execute(load(FAST + overrides), Path(tmp), launcher=pool)


@pytest.mark.parametrize("strategy", ["ps_sync", "ps_async"])
def test_ray_actors_give_the_same_outputs_as_local_agent_processes(tmp_path, ray_cluster, strategy):
    over = COMMON + [f"strategy={strategy}", "agents=2"]
    local = tmp_path / "local"
    run_local(local, over, local=True)
    d = tmp_path / "ray"
    r = run_ray(d, over, ray_cluster)
    assert r.summary["updates"] == 24 and r.summary["agents"] == 2
    assert r.summary["messages_remote"] > 0, "vworkers should really be spread over the two actors"
    assert_same_outputs(local, d)  # metrics.csv (but wall_*), eval.csv, params.pt
    # each actor's log, collected into the run directory
    for i in range(2):
        text = (d / "agents" / f"agent-{i}.log").read_text()
        assert f"[agent-{i}]" in text and "[lockstep.agent][INFO] registered with" in text and "hosting" in text
        assert "run finished; exiting" in text


def test_fractional_gpus_and_custom_resources_reserve_a_bundle_per_agent(tmp_path, ray_cluster):
    import ray
    from ray.util import placement_group_table

    rc = load(FAST + COMMON + ["agents=2"])
    pool, impl = ray_pool(ray_cluster, gpus_per_agent=0.5, resources_per_agent={"lockstep_slot": 1},
                          cpus_per_agent=0.5, strategy="STRICT_PACK")
    try:
        pool.start_agents(make_plan(rc), tmp_path)  # returns once both agents are Ready
        table = placement_group_table(impl.pg)
        assert table["strategy"] == "STRICT_PACK"
        assert list(table["bundles"].values()) == [{"CPU": 0.5, "GPU": 0.5, "lockstep_slot": 1.0}] * 2
        where = ray.get(impl._where)
        # two halves of the cluster's one (pretend) GPU: Ray shows both actors GPU 0
        assert [w["cuda_visible_devices"] for w in where] == ["0", "0"]
        assert len({w["pid"] for w in where}) == 2
    finally:
        pool.close()
    assert impl.conn is None and impl.pg is None


def test_a_placement_group_that_cannot_be_placed_fails_the_run_naming_what_it_asked_for(tmp_path, ray_cluster):
    # STRICT_SPREAD wants a node per agent; the cluster has one node
    with pytest.raises(AgentFailure) as e:
        run_ray(tmp_path / "run", COMMON + ["agents=2"], ray_cluster, strategy="STRICT_SPREAD",
                startup_timeout_s=2.0)
    assert e.value.agent == "all"
    assert re.search(r"placement group lockstep-\S+ \(2 bundles of \{'CPU': 1.0\}, strategy STRICT_SPREAD\) is "
                     r"still \w+ after \d+ s \(launcher.startup_timeout_s\)", e.value.reason), e.value.reason


def test_a_shared_cluster_is_left_running_with_the_runs_actors_and_placement_group_removed(tmp_path, ray_cluster):
    import ray
    from ray.util import list_named_actors, placement_group_table

    from controller.launchers.ray import Connection

    pool, _ = ray_pool(ray_cluster)
    r = execute(load(FAST + COMMON + ["agents=2"]), tmp_path / "run", launcher=pool)
    assert not ray.is_initialized(), "the controller disconnects from a cluster it did not start"
    conn = Connection(ray_cluster).open()  # the cluster still answers
    try:
        name = f"lockstep-{r.summary['run_id']}"
        assert not [a for a in list_named_actors(all_namespaces=True) if a["name"].startswith(name)]
        groups = [g for g in placement_group_table().values() if g["name"] == name]
        assert [g["state"] for g in groups] == ["REMOVED"]
    finally:
        conn.close()


def test_the_token_never_appears_in_what_ray_shows_about_an_actor(tmp_path):
    need_ray()
    from controller.launchers.base import LaunchSpec
    from controller.launchers.ray import RayLauncher

    token = "tok-" + uuid.uuid4().hex
    spec = LaunchSpec(run_id="r1", n_agents=2, controller_address="127.0.0.1:5000", token=token,
                      run_dir=tmp_path, extra_env={"PYTHONPATH": "/src"})
    impl = RayLauncher({"address": None, "runtime_env": {"env_vars": {"A": "1"}, "pip": ["x"]}})
    opts = impl.actor_options(spec, 1)
    # name, namespace, resources, runtime_env: everything Ray's dashboard and state API show of an actor
    assert token not in repr(opts)
    assert opts["name"] == "lockstep-r1-agent-1" and opts["namespace"] == "lockstep"
    assert opts["runtime_env"] == {"env_vars": {"A": "1", "PYTHONPATH": "/src"}, "pip": ["x"]}
    assert opts["max_restarts"] == 0 and opts["max_concurrency"] == 2


def test_killing_an_actors_process_stops_the_run_with_a_clear_error_and_leaves_no_ray_process(tmp_path):
    """With recovery.agents=fail; the restart (the default) is tests/ray/test_ray_recovery.py."""
    need_ray()
    d, mark = tmp_path / "run", f"ray-kill-{uuid.uuid4().hex[:12]}"
    timeout_s = 10
    over = ["workers=8", "agents=2", "model=mlp", "compute=constant", "stop.updates=1000000", "eval.every=0",
            "progress=false", "launcher=ray", "launcher.address=null", "launcher.log_poll_s=0.2", "recovery.agents=fail",
            "controller.heartbeat_s=0.5", f"controller.agent_timeout_s={timeout_s}", "network.latency=1ms"]
    proc = subprocess.Popen([sys.executable, "-m", "controller.cli", "run", *over, f"hydra.run.dir={d}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=marked_env(mark))
    try:
        pids = agent_pids(d, 2, timeout=240, what="both actors to build their vworkers (logs copied to the run dir)",
                          first_rows=True)
        # the private cluster for the run listens on 127.0.0.1 only: every Ray server, worker and agent
        ports = listening(processes_with(mark))
        assert ports and all(is_loopback(a) for a, _ in ports), sorted(ports)
        os.kill(pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=120)
        elapsed = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    try:
        assert proc.returncode == 1, err
        assert elapsed < timeout_s, f"took {elapsed:.1f} s to notice (controller.agent_timeout_s={timeout_s})"
        line = next(ln for ln in err.splitlines() if "the run stopped because" in ln)
        assert re.search(r"agent 1 failed: its Ray actor lockstep-\S+-agent-1 \(pid " + str(pids[1]) +
                         r" on node 127\.0\.0\.1, id [0-9a-f]{8}\) died: The actor is dead because its worker "
                         r"process has died\. Worker exit type: \w+", line), line
        assert "last log lines of agent 1" in err and "hosting" in err, err
        assert "Traceback" not in err and "restarting" not in err, err
        assert not (d / "recovery.jsonl").exists()
        with open(d / "metrics.csv", newline="") as f:
            rows = list(csv.DictReader(f))
        assert rows and all(r["vworker"] == "ps0" for r in rows)
        # the run stopped its private cluster: no process it started (Ray's or an agent) is left
        wait_until(lambda: not processes_with(mark), timeout=30, what="every process of the run's Ray cluster to end",
                   on_timeout=lambda: f"left: {processes_with(mark)}")
    finally:
        kill_marked(mark)


def test_sigterm_stops_a_ray_run_gracefully_and_leaves_no_ray_process(tmp_path):
    """What KubeRay's pod deletion sends the controller: ray.init had taken SIGTERM over (its core worker aborted
    the process: exit 134, no summary's stopped_by, no trace.json); lockstep takes it back."""
    need_ray()
    d, mark = tmp_path / "run", f"ray-term-{uuid.uuid4().hex[:12]}"
    over = ["workers=4", "agents=2", "model=mlp", "compute=constant", "stop.updates=1000000", "eval.every=0",
            "progress=false", "launcher=ray", "launcher.address=null", "network.latency=1ms"]
    proc = subprocess.Popen([sys.executable, "-m", "controller.cli", "run", *over, f"hydra.run.dir={d}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=marked_env(mark))
    try:
        agent_pids(d, 2, timeout=240, what="both actors to build their vworkers", first_rows=True)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    try:
        assert proc.returncode == 128 + signal.SIGTERM, err
        assert "interrupted by SIGTERM; every agent was stopped" in err and "Traceback" not in err, err
        summary = json.loads((d / "summary.json").read_text())
        assert summary["stopped_by"] == "signal" and summary["signal"] == "SIGTERM"
        with open(d / "metrics.csv", newline="") as f:
            assert summary["updates"] == len(list(csv.DictReader(f))) > 0
        wait_until(lambda: not processes_with(mark), timeout=30, what="every process of the run's Ray cluster to end",
                   on_timeout=lambda: f"left: {processes_with(mark)}")
    finally:
        kill_marked(mark)


def test_launcher_address_auto_finds_a_token_authenticated_cluster_without_ray_auth_mode(tmp_path, ray_cluster):
    """Ray 2.60's `ray start --head` turns token authentication on; only ray.init(address="auto") finds the token
    by itself. The launcher resolved auto to the head's HOST:PORT first (to check it answers) and gave ray.init
    that: InvalidAuthToken for 20 s, then exit 2."""
    env = {k: v for k, v in marked_env(f"ray-auto-{uuid.uuid4().hex[:12]}").items()
           if k not in ("RAY_AUTH_MODE", "RAY_ADDRESS")}
    d = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "controller.cli", "run", "workers=4", "agents=2", "model=mlp",
                        "compute=constant", "stop.updates=20", "eval.every=0", "progress=false", "launcher=ray",
                        "launcher.address=auto", "network.latency=1ms", f"hydra.run.dir={d}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert json.loads((d / "summary.json").read_text())["updates"] == 20


def test_two_runs_with_one_run_id_on_a_shared_cluster_each_get_their_own_placement_group(tmp_path, ray_cluster):
    """Two sweep jobs whose configs differ only where the run id's hash does not look, started in the same
    second, share a run id: the second job's placement group was refused ("already exists"), its run failed."""
    from ray.util import placement_group_table

    from controller.launchers.ray import Connection

    mark = f"ray-dup-{uuid.uuid4().hex[:12]}"
    common = ["workers=4", "agents=2", "model=mlp", "compute=constant", "eval.every=0", "progress=false",
              "launcher=ray", f"launcher.address={ray_cluster}", "network.latency=1ms", "run_id=dup"]
    first = subprocess.Popen([sys.executable, "-m", "controller.cli", "run", *common, "stop.updates=1000000",
                              f"hydra.run.dir={tmp_path / 'a'}"], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=marked_env(mark))
    try:
        agent_pids(tmp_path / "a", 2, timeout=240, what="the first run's actors", first_rows=True)
        p = subprocess.run([sys.executable, "-m", "controller.cli", "run", *common, "stop.updates=20",
                            f"hydra.run.dir={tmp_path / 'b'}"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300, env=marked_env(mark))
        assert p.returncode == 0, p.stderr[-3000:]
        assert json.loads((tmp_path / "b" / "summary.json").read_text())["updates"] == 20
        assert "placement group lockstep-dup-r1," in (tmp_path / "b" / "lockstep.log").read_text()
        conn = Connection(ray_cluster).open()
        try:  # the first run's group still holds its name
            assert any(g["name"] == "lockstep-dup" and g["state"] == "CREATED"
                       for g in placement_group_table().values())
        finally:
            conn.close()
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
        assert first.returncode == 143
    finally:
        first.kill()
        first.wait()


def test_a_cause_no_single_agent_owns_is_said_of_every_agent(tmp_path, ray_cluster):
    # the sentence read "the run stopped because agent all failed: the Ray placement group ..."
    mark = f"ray-pg-{uuid.uuid4().hex[:12]}"
    try:
        p = subprocess.run([sys.executable, "-m", "controller.cli", "run", "workers=4", "agents=2", "model=mlp",
                            "compute=constant", "stop.updates=20", "eval.every=0", "progress=false", "launcher=ray",
                            f"launcher.address={ray_cluster}", "launcher.strategy=STRICT_SPREAD",
                            "launcher.startup_timeout_s=2",
                            f"hydra.run.dir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300, env=marked_env(mark))
    finally:
        kill_marked(mark)
    assert p.returncode == 1, p.stderr[-3000:]
    assert "lockstep: the run stopped because every agent failed: the Ray placement group lockstep-" in p.stderr

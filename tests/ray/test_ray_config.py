"""launcher=ray given bad input: one clear sentence, exit 2, no traceback, nothing started.

Also the parts that need no cluster: the actor class without Ray, and Ray's account of a death
condensed to what a user needs.
"""
from __future__ import annotations

import logging
import subprocess
import sys
import time
import uuid

import pytest

from controller.config import ConfigError, load
from tests.helpers import wait_until

from .conftest import ROOT, free_port, kill_marked, marked_env, need_ray, processes_with

CLI = [sys.executable, "-m", "controller.cli", "run"]
SMALL = ["workers=4", "agents=2", "model=mlp", "compute=constant", "stop.updates=4", "progress=false"]


def _cli(tmp_path, overrides, prelude: str = "", timeout: float = 120, env: dict[str, str] | None = None):
    code = f"{prelude}\nimport sys\nfrom controller.cli import main\nsys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, "run", *overrides, f"hydra.run.dir={tmp_path / 'run'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def test_launcher_ray_without_ray_installed_names_the_extra_and_exits_2(tmp_path):
    # Ray hidden from this process: find_spec("ray") answers None, `import ray` fails
    p = _cli(tmp_path, ["launcher=ray", *SMALL], prelude="import sys; sys.modules['ray'] = None")
    assert p.returncode == 2, p.stderr
    assert ("launcher=ray needs Ray, which is not installed; accepted: pip install 'lockstep[ray]', or "
            "launcher=local | inprocess | kubernetes.") in p.stderr
    assert "Traceback" not in p.stderr
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_an_unreachable_launcher_address_is_one_sentence_and_exit_2_within_seconds(tmp_path):
    need_ray()
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    p = _cli(tmp_path, ["launcher=ray", f"launcher.address=127.0.0.1:{port}", *SMALL])
    elapsed = time.monotonic() - t0
    assert p.returncode == 2, p.stderr
    assert (f"launcher.address=127.0.0.1:{port} is not reachable (Connection refused); accepted: null (a private "
            "Ray cluster for the run), auto") in p.stderr
    assert "Traceback" not in p.stderr
    assert elapsed < 60, f"{elapsed:.0f} s: Ray itself would retry for minutes"
    assert not (tmp_path / "run" / "config.yaml").exists(), "nothing is written before the launcher is usable"


def test_a_private_cluster_without_the_gpus_asked_for_is_refused_at_once_and_stopped(tmp_path):
    need_ray()
    mark = f"ray-nogpu-{uuid.uuid4().hex[:12]}"
    p = _cli(tmp_path, ["launcher=ray", "launcher.gpus_per_agent=0.5", "launcher.local.num_gpus=0", *SMALL],
             timeout=300, env=marked_env(mark))
    try:
        assert p.returncode == 2, p.stderr
        assert ("launcher.gpus_per_agent=0.5 for 2 agents needs 1 GPU but the private Ray cluster has 0; accepted: "
                "what launcher.local provides (launcher.local.num_gpus), or launcher.address of a cluster that has "
                "it") in p.stderr
        assert "Traceback" not in p.stderr
        wait_until(lambda: not processes_with(mark), timeout=30, what="the private cluster to be stopped",
                   on_timeout=lambda: f"left: {processes_with(mark)}")
    finally:
        kill_marked(mark)


def test_a_negative_gpu_share_is_one_sentence_and_exit_2(tmp_path):
    p = _cli(tmp_path, ["launcher=ray", "launcher.gpus_per_agent=-1", *SMALL])
    assert p.returncode == 2, p.stderr
    assert "launcher.gpus_per_agent=-1 is not valid; accepted: a number >= 0." in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("override, expected", [
    ("launcher.gpus_per_agent=1.5", r"launcher.gpus_per_agent=1.5 is not valid; accepted: a number of GPUs >= 0: a "
                                    r"fraction up to 1 \(0.25 puts four agents on one GPU\) or a whole number\."),
    ("launcher.cpus_per_agent=0", r"launcher.cpus_per_agent=0 is not valid; accepted: a number > 0\."),
    ("launcher.strategy=TIGHT", r"launcher.strategy=TIGHT is not valid; accepted: PACK \| SPREAD \| STRICT_PACK \| "
                                r"STRICT_SPREAD\."),
    ("launcher.strategy=STRICT_SPREAD", r"launcher.strategy=STRICT_SPREAD is not valid; accepted: PACK \| SPREAD "
                                        r"\| STRICT_PACK with launcher.address=null: the private cluster has one node"),
    ("launcher.address=somewhere", r"launcher.address=somewhere is not valid; accepted: null \(a private Ray"),
    ("launcher.resources_per_agent={GPU:1}", r"launcher.resources_per_agent=\{GPU:1\} is not valid; accepted: "
                                             r"null or a mapping from a custom resource name"),
    ("launcher.runtime_env=pip", r"launcher.runtime_env=pip is not valid; accepted: null or a Ray runtime_env"),
    ("launcher.local.object_store_memory=1000", r"launcher.local.object_store_memory=1000 is not valid; accepted: an "
                                                r"integer >= 78643200 or null\."),
    ("launcher.runtime_env={env_vars:{LOCKSTEP_TOKEN:x}}", r"launcher.runtime_env.env_vars must not hold "
                                                           r"LOCKSTEP_TOKEN"),
    ("device=cuda", r"launcher.gpus_per_agent=0.0 is not valid; accepted: a share of a GPU > 0 \(e.g. 0.25\) with "
                    r"device=cuda"),
    ("launcher.controller_address=ray://h:1", r"launcher.controller_address=ray://h:1 is not valid"),
    ("launcher.adress=auto", r"launcher.adress is not a key of launcher; did you mean address\?"),
])
def test_a_bad_ray_launcher_value_names_the_key_and_what_is_accepted(override, expected):
    with pytest.raises(ConfigError, match=expected):
        load(["launcher=ray", "agents=2", override], check_data=False)


def test_the_default_ray_launcher_config_is_valid(monkeypatch):
    need_ray()  # validation itself refuses launcher=ray where Ray is not installed
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    from controller.config.schema import RayLauncherConfig, RayStrategy
    from controller.launchers.ray import bundle

    cfg = load(["launcher=ray", "agents=2"], check_data=False).launcher
    assert isinstance(cfg, RayLauncherConfig)
    assert (cfg.address, cfg.strategy, bundle(cfg)) == (None, RayStrategy.PACK, {"CPU": 1.0})
    assert cfg.local.object_store_memory == 200_000_000


def test_the_default_address_is_ray_address_from_the_environment(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert load(["launcher=ray", "agents=2"], check_data=False).launcher.address == "10.0.0.5:6379"


# --- without a cluster ------------------------------------------------------------------------------
def test_a_hosted_agent_keeps_its_log_lines_until_taken_and_counts_what_it_dropped():
    from agents.hosted import HostedAgent

    root = logging.getLogger()
    before = list(root.handlers), root.level
    try:
        a = HostedAgent(3, "INFO", max_log_lines=3)
        logging.getLogger("lockstep.agent").info("one")
        line = a.take_log()[-1]
        assert line.startswith("[agent-3][") and line.endswith("[lockstep.agent][INFO] one")
        assert a.take_log() == []
        for i in range(5):
            logging.getLogger("agents.core").warning("line %d", i)
        lines = a.take_log()
        assert lines[0] == "... 2 earlier log lines dropped (the launcher did not collect them in time)"
        assert [ln.rsplit("] ", 1)[1] for ln in lines[1:]] == ["line 2", "line 3", "line 4"]
        assert a.where()["pid"] > 0
    finally:
        root.handlers[:], root.level = before[0], before[1]


def test_rays_account_of_a_dead_actor_is_cut_to_the_exit_type_and_detail():
    from controller.launchers.ray import _ray_reason

    class Died(Exception):
        error_msg = ("The actor died unexpectedly before finishing this task.\n\tclass_name: HostedAgent\n\tpid: 42\n"
                     "\tip: 10.1.2.3\nThe actor is dead because its worker process has died. Worker exit type: "
                     "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End "
                     "of file. Some common causes include: (1) the process was killed by the OOM killer")

    assert _ray_reason(Died()) == ("The actor is dead because its worker process has died. Worker exit type: "
                                   "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection "
                                   "error code 2. End of file")


@pytest.mark.parametrize("address, parsed", [
    ("127.0.0.1:6379", ("127.0.0.1", 6379)), ("ray://head.lab:10001", ("head.lab", 10001)),
    ("[::1]:6379", ("::1", 6379)), ("auto", None), ("head:0", None), ("head:70000", None), ("h:1/x", None),
])
def test_addresses_are_host_and_port(address, parsed):
    from controller.launchers.ray import split_address

    assert split_address(address) == parsed

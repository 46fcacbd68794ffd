"""Device profiles (compute.profile): the emulated machine's durations travel with the config."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from controller.config import ConfigError, load
from controller.config.profiles import DeviceProfile, read_profile
from tests.helpers import run

ROOT = Path(__file__).resolve().parents[2]
BASE = ["strategy=ps_sync", "workers=2", "stop.updates=4", "model=mlp", "eval.every=0", "progress=false",
        "launcher=inprocess", "network.bandwidth=1e18", "network.latency=0", "compute=profiled"]


def _signatures(overrides: list[str]) -> list[str]:
    """The signatures a run's ahead-of-time profile asks for, without timing anything."""
    from agents.workloads.training import Training
    from controller.plan import make_plan

    plan = make_plan(load(overrides))

    class Recorder:
        sigs: list[str] = []

        def profile(self, kind, fn, args, make_args=None):
            from agents.sim.compute import signature

            self.sigs.append(signature(kind, fn, args))

    rec = Recorder()
    Training(plan.workload, plan.seed).profile(rec, workers=len(plan.workload.data_holders))
    return rec.sigs


def test_a_named_profile_gives_every_call_its_duration_and_times_nothing_here(tmp_path):
    sigs = _signatures(BASE)
    prof = tmp_path / "lab-gpu.json"
    prof.write_text(DeviceProfile("lab-gpu", {s: 0.001 * (i + 1) for i, s in enumerate(sigs)}).to_json())
    db = tmp_path / "host-db.json"
    res = run(tmp_path / "run", BASE + [f"compute.profile={prof}", f"compute.db={db}"], fast=False)
    grad = next(v for k, v in read_profile(str(prof)).signatures.items() if k.startswith("gradient|"))
    assert res.summary["compute_virtual_s"]["gradient"] == round(grad * 1e9) * 2 * 4 / 1e9
    assert (res.summary["compute_profile"], res.summary["profile_fallbacks"], res.summary["portable"]) == \
        ("lab-gpu", 0, True)
    assert not db.exists()  # nothing was timed on this host


def test_a_call_the_profile_lacks_is_timed_here_and_the_run_says_it_is_not_portable(tmp_path):
    sigs = [s for s in _signatures(BASE) if not s.startswith("update|")]
    prof = tmp_path / "partial.json"
    prof.write_text(DeviceProfile("partial", {s: 0.002 for s in sigs}).to_json())
    res = run(tmp_path / "run", BASE + [f"compute.profile={prof}", f"compute.db={tmp_path / 'db.json'}"],
              fast=False)
    assert res.summary["profile_fallbacks"] == 4 and res.summary["portable"] is False  # 4 updates, host-timed


def test_the_shipped_profile_covers_the_default_experiment():
    shipped = read_profile("epyc-1t").signatures
    assert set(_signatures([])) <= set(shipped)
    assert load([]).compute.profile_name == "epyc-1t"


def test_lockstep_profile_writes_a_profile_a_run_then_uses(tmp_path):
    out = tmp_path / "mine.json"
    p = subprocess.run([sys.executable, "-m", "controller.cli", "profile", "--name", "mine", "--out", str(out),
                        *BASE[:4], "compute.runs=2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    prof = read_profile(str(out))
    assert prof.name == "mine" and prof.host.startswith("cpu:") and sorted(s.split("|")[0] for s in
                                                                          prof.signatures) == \
        ["aggregate", "gradient", "update"]
    res = run(tmp_path / "run", BASE + [f"compute.profile={out}"], fast=False)
    assert res.summary["portable"] is True


@pytest.mark.parametrize("strategy", ["ring_allreduce", "fedavg"])
def test_lockstep_profile_times_the_calls_the_strategy_itself_makes(tmp_path, strategy):
    # a ring's chunk additions and FedAvg's weighted aggregate were missing: a run with the profile timed
    # them on its own host (profile_fallbacks 720 and 20 over 20 updates) and was not portable
    out = tmp_path / "mine.json"
    # (FedAvg's clients train two steps a round, not an epoch: the same calls, 5 s instead of 32 to profile)
    exp = [f"strategy={strategy}", "workers=4", "model=mlp", *(["strategy.local_steps=2"] if strategy == "fedavg"
                                                              else [])]
    p = subprocess.run([sys.executable, "-m", "controller.cli", "profile", "--name", "mine", "--out", str(out), *exp,
                        "compute.runs=2"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    sigs = read_profile(str(out)).signatures
    own = {"ring_allreduce": "aggregate|agents.strategies.collective._add|",
           "fedavg": "aggregate|agents.workloads.training.Training.aggregate|[float32(159010,),float32(159010,),"
                     "float32(159010,),float32(159010,)];[15000.0,15000.0,15000.0,15000.0]"}[strategy]
    assert any(s.startswith(own) for s in sigs), sorted(sigs)
    res = run(tmp_path / "run", [*exp, "stop.updates=4", "eval.every=0", "progress=false", "launcher=inprocess",
                                 "compute=profiled", f"compute.profile={out}", f"compute.db={tmp_path / 'db.json'}"],
              fast=False)
    assert (res.summary["profile_fallbacks"], res.summary["portable"]) == (0, True)
    assert not (tmp_path / "db.json").exists()  # nothing was timed on this host


@pytest.mark.parametrize("value, expected", [
    ("nosuch", r"compute.profile='nosuch' is not valid: no file .*nosuch.json; accepted: epyc-1t"),
    ("{bad}", r"compute.profile="),
])
def test_a_bad_profile_is_one_sentence(tmp_path, value, expected):
    if value == "{bad}":
        value = str(tmp_path / "bad.json")
        Path(value).write_text(json.dumps({"name": "x", "signatures": {"a": -1}}))
        expected = r"is not a device profile; accepted"
    with pytest.raises(ConfigError, match=expected):
        load([f"compute.profile={value}"], check_data=False)

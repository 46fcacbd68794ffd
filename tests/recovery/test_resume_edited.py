"""``lockstep resume`` of a run whose config.yaml was edited since it started: the refusal names what differs.

It said only that plan.json "differs from the plan its config.yaml gives with this version of lockstep" and
blamed the version, though the edit was the user's; `recovery.resume=auto` names the keys, so this does too
(controller.recovery.check_resumable). Real processes: the run and the resume are `lockstep` commands.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from controller.recovery import plan_differences

FAST = ["model=mlp", "compute=constant", "network=ideal", "eval.every=0", "progress=false", "launcher=inprocess"]


def _lockstep(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controller.cli", *args], capture_output=True, text=True,
                          timeout=300)


def test_a_resume_after_config_yaml_was_edited_names_the_plans_entries_that_differ_and_writes_nothing(tmp_path):
    d = tmp_path / "run"
    done = _lockstep("run", *FAST, "workers=2", "stop.updates=4", "seed=3", f"hydra.run.dir={d}")
    assert done.returncode == 0, done.stderr
    (d / "summary.json").unlink()  # as if its controller had died before the end
    config = d / "config.yaml"
    text = config.read_text()
    assert "\nseed: 3\n" in text
    config.write_text(text.replace("\nseed: 3\n", "\nseed: 4\n"))
    before = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}

    res = _lockstep("resume", str(d))
    assert res.returncode == 2, res.stderr
    assert f"lockstep resume: {d / 'plan.json'} differs from the plan its config.yaml gives (compute.seed: 3 in " \
           "plan.json, 4 from config.yaml; seed: 3 in plan.json, 4 from config.yaml): config.yaml was edited since the run started, or this is another version of " \
           "lockstep; resume it with the config.yaml and the version that started it" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr
    after = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file() and p.name != "lockstep.log"}
    assert after == {k: v for k, v in before.items() if k != "lockstep.log"}


def test_plan_differences_are_dotted_paths_with_both_values_in_key_order():
    was = {"seed": 1, "vworkers": [{"name": "w0", "speed": 1.0}, {"name": "w1", "speed": 2.0}], "lr": 0.1}
    now = {"seed": 1, "vworkers": [{"name": "w0", "speed": 1.5}, {"name": "w1", "speed": 2.0}], "lr": 0.2, "x": 1}
    assert plan_differences(was, now) == [("lr", 0.1, 0.2), ("vworkers[0].speed", 1.0, 1.5), ("x", None, 1)]
    assert plan_differences({"a": [1, 2]}, {"a": [1]}) == [("a", [1, 2], [1])]
    assert plan_differences(was, was) == []

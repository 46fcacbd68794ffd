"""plan.json: ``Plan.to_json`` writes the text it always wrote (asdict of every part), without asdict's deep copy.

The text matters beyond the file: a checkpoint keys on its hash, and ``lockstep resume`` refuses a run whose
``plan.json`` differs from the plan its ``config.yaml`` gives (controller.recovery.check_resumable).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace

import pytest

from agents.common.plan import Plan
from agents.strategies.base import VWorkerSpec


def asdict_json(plan: Plan) -> str:
    """``Plan.to_json`` as it was written before 2026-11-30: the vworkers and the workload through asdict (the
    parts the change writes another way; the rest is read back from to_json's own text)."""
    d = json.loads(plan.to_json())
    d["vworkers"] = [asdict(v) for v in plan.vworkers]
    d["workload"] = plan.workload.to_dict()
    return json.dumps(d, sort_keys=True)


def plan_of(overrides: list[str]) -> Plan:
    from controller.config import load
    from controller.plan import make_plan

    return make_plan(load(["model=mlp", "compute=constant", *overrides], check_data=False), run_id="plan-text")


@pytest.mark.parametrize("overrides", [
    [],
    ["strategy=ps_sync", "strategy.shards=2", "agents=2"],
    ["strategy=ssp"],
    ["strategy=ring_allreduce", "network=ideal"],
    ["strategy=hierarchical_allreduce", "workers=8"],
    ["strategy=gossip", "network=wan"],
    ["strategy=local_sgd"],
    ["strategy=fedavg", "workers=50", "strategy.fraction=0.1", "data.placement=end_devices", "data.end_devices=2"],
    ["strategy=fedasync"],
    ["strategy=sgd", "workers=1"],
    ["+experiment=faults_crash10"],
    ["network=ideal", "network.topology=fat_tree", "workers=40"],
    ["compute.stragglers={w1: 3.0}", "compute.start_spread=1ms"],
])
def test_plan_json_is_the_text_asdict_gives(overrides):
    plan = plan_of(overrides)
    text = plan.to_json()
    assert text == asdict_json(plan)
    assert Plan.from_json(text).to_json() == text


@dataclass(frozen=True)
class _Inner:
    a: int
    b: tuple[int, ...]


def test_a_dataclass_inside_a_vworkers_kwargs_is_written_as_asdict_writes_it():
    plan = plan_of(["workers=2"])
    spec = plan.vworkers[0]
    plan.vworkers[0] = replace(spec, kwargs={**spec.kwargs, "inner": _Inner(1, (2, 3)), "more": [_Inner(4, ())]})
    assert plan.to_json() == asdict_json(plan)
    assert json.loads(plan.to_json())["vworkers"][0]["kwargs"]["more"] == [{"a": 4, "b": []}]


def test_a_value_json_cannot_write_is_refused_with_its_type():
    plan = plan_of(["workers=2"])
    plan.vworkers.append(VWorkerSpec("odd", "x.Y", {"v": object()}))
    with pytest.raises(TypeError, match="Object of type object is not JSON serializable"):
        plan.to_json()


def test_a_run_with_agents_makes_the_plans_text_once_and_serves_plan_json(tmp_path, monkeypatch):
    """The controller writes plan.json, hashes it for the checkpoints and serves it to its agents from one
    ``to_json`` (0.5 s a call at 100 000 vworkers); what the agents are handed is the file's text."""
    from controller.config import load
    from controller.server import ControllerServer
    from controller.session import run_session
    from tests.helpers import FAST

    calls, served = [], []
    to_json = Plan.to_json
    monkeypatch.setattr(Plan, "to_json", lambda self: calls.append(1) or to_json(self))
    init = ControllerServer.__init__

    def spy(self, token, run_id, plan_json, *args, **kwargs):
        served.append(plan_json)
        init(self, token, run_id, plan_json, *args, **kwargs)

    monkeypatch.setattr(ControllerServer, "__init__", spy)
    r = run_session(load([*FAST, "agents=2", "launcher=local", "stop.updates=4"]), tmp_path)
    assert r.summary["updates"] == 4
    assert len(calls) == 1
    assert served == [(tmp_path / "plan.json").read_text()]


_COUNT_LAYOUTS = """
import atexit
from agents.strategies.fedavg import FedAvg
layout = FedAvg.layout.__func__
calls = []
FedAvg.layout = classmethod(lambda cls, workers, settings: calls.append(workers) or layout(cls, workers, settings))
atexit.register(lambda: print("layouts:", calls))
"""


def test_lockstep_run_lays_out_its_vworkers_once(tmp_path):
    """The CLI validates the configuration, Hydra's task validates it again and the plan is made: three layouts of
    the same vworkers, 0.33-0.38 s each at 100 000 FedAvg clients. The last one is kept (agents.strategies.base.
    layout_of), so the command makes one, and the plan still holds every client."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = f"{_COUNT_LAYOUTS}\nimport sys\nfrom controller.cli import main\nsys.exit(main(sys.argv[1:]))"
    p = subprocess.run([sys.executable, "-c", code, "run", "strategy=fedavg", "workers=40", "strategy.fraction=0.1",
                        "model=mlp", "compute=constant", "stop.updates=2", "eval.every=0", "progress=false",
                        f"hydra.run.dir={tmp_path}"], cwd=root, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "layouts: [40]" in p.stdout
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert len(plan["vworkers"]) == 41  # 40 clients and the server

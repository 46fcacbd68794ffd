"""The KubeRay path (charts/lockstep/examples/kuberay): lint, render, validate, and check it runs lockstep right.

The chart renders a RayJob (KubeRay's CRD, unknown to kubernetes-validate): a strict schema below checks
the part of ray.io/v1 RayJob it renders (field names and types as in KubeRay's CRD), and every pod
template inside it is validated as a real Kubernetes PodTemplate. No KubeRay operator runs here.
"""
from __future__ import annotations

import base64
import json
import shlex
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from controller.config import load

from .conftest import CHART

K8S_VERSION = "1.29.0"
KUBERAY = CHART / "examples" / "kuberay"
VALUE_SETS = [None, KUBERAY / "gpu-values.yaml"]

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_INT32 = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
RAYJOB_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayJob"},
        "metadata": {"type": "object", "additionalProperties": False, "required": ["name"],
                     "properties": {"name": {"type": "string", "maxLength": 47}, "labels": _STR_MAP}},
        "spec": {
            "type": "object", "additionalProperties": False, "required": ["entrypoint", "rayClusterSpec"],
            "properties": {
                "entrypoint": {"type": "string", "minLength": 1},
                "submissionMode": {"enum": ["K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"]},
                "shutdownAfterJobFinishes": {"type": "boolean"},
                "ttlSecondsAfterFinished": _INT32,
                "activeDeadlineSeconds": _INT32,
                "rayClusterSpec": {
                    "type": "object", "additionalProperties": False, "required": ["headGroupSpec"],
                    "properties": {
                        "rayVersion": {"type": "string"},
                        "headGroupSpec": {
                            "type": "object", "additionalProperties": False, "required": ["template"],
                            "properties": {"rayStartParams": _STR_MAP, "template": {"type": "object"}}},
                        "workerGroupSpecs": {"type": "array", "items": {
                            "type": "object", "additionalProperties": False,
                            "required": ["groupName", "maxReplicas", "minReplicas", "template"],
                            "properties": {"groupName": {"type": "string"}, "replicas": _INT32, "minReplicas": _INT32,
                                           "maxReplicas": _INT32, "rayStartParams": _STR_MAP,
                                           "template": {"type": "object"}}}},
                    }},
            }},
    },
}


def values_args(values: Path | None) -> list[str]:
    return ["-f", str(values)] if values else []


def value_id(values: Path | None) -> str:
    return values.stem if values else "defaults"


def render(helm, *args: str) -> dict[str, dict]:
    out = helm("template", "exp1", str(KUBERAY), "--namespace", "lab", *args).stdout
    return {d["kind"]: d for d in yaml.safe_load_all(out) if d}


def templates(job: dict) -> list[dict]:
    spec = job["spec"]["rayClusterSpec"]
    return [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]


def cpus(quantity: str | int | float) -> float:
    q = str(quantity)
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_id)
def test_helm_lint_strict_passes_on_the_kuberay_chart(helm, values):
    assert "0 chart(s) failed" in helm("lint", "--strict", str(KUBERAY), *values_args(values)).stdout


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_id)
def test_the_rayjob_and_every_pod_in_it_are_valid(helm, values):
    docs = render(helm, *values_args(values))
    assert set(docs) == {"RayJob", "Secret"}
    kubernetes_validate.validate(docs["Secret"], K8S_VERSION, strict=True)
    jsonschema.validate(docs["RayJob"], RAYJOB_SCHEMA)
    for tpl in templates(docs["RayJob"]):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"},
                                      "template": tpl}, K8S_VERSION, strict=True)
        # KubeRay's convention: the Ray container comes first
        assert tpl["spec"]["containers"][0]["name"] in ("ray-head", "ray-worker")


def test_the_rayjob_schema_rejects_a_field_kuberay_does_not_know(helm):
    """Guards the test above: the schema is strict where the CRD is."""
    job = render(helm)["RayJob"]
    job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["replica"] = 3
    with pytest.raises(jsonschema.ValidationError, match="'replica' was unexpected"):
        jsonschema.validate(job, RAYJOB_SCHEMA)


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_id)
def test_the_entrypoint_is_a_lockstep_run_on_ray_that_the_config_accepts(helm, values):
    job = render(helm, *values_args(values))["RayJob"]
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:4] == ["lockstep", "run", "launcher=ray", "launcher.address=auto"]
    overrides = [a for a in argv[2:] if not a.startswith("hydra.")]
    rc = load(overrides, check_data=False)
    v = yaml.safe_load((values or KUBERAY / "values.yaml").read_text())
    want = {**yaml.safe_load((KUBERAY / "values.yaml").read_text())["agents"], **(v.get("agents") or {})}
    assert rc.agents == want["count"]
    assert (rc.launcher.name, rc.launcher.address) == ("ray", "auto")
    assert (rc.launcher.cpus_per_agent, rc.launcher.gpus_per_agent, rc.launcher.strategy.value) == (
        want["cpusPerAgent"], want["gpusPerAgent"], want["strategy"])
    assert rc.controller.host == "0.0.0.0", "the workers dial the head pod's IP"
    assert "hydra.run.dir=/results/exp1" in argv


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_id)
def test_the_worker_pods_hold_every_agent_and_the_head_none(helm, values):
    job = render(helm, *values_args(values))["RayJob"]
    argv = dict(a.split("=", 1) for a in shlex.split(job["spec"]["entrypoint"])[2:] if "=" in a)
    agents, per_cpu, per_gpu = int(argv["agents"]), float(argv["launcher.cpus_per_agent"]), float(
        argv["launcher.gpus_per_agent"])
    spec = job["spec"]["rayClusterSpec"]
    assert spec["headGroupSpec"]["rayStartParams"] == {"num-cpus": "0"}
    have_cpu = have_gpu = 0.0
    for g in spec["workerGroupSpecs"]:
        res = g["template"]["spec"]["containers"][0]["resources"]
        limits = {**res.get("requests", {}), **res.get("limits", {})}
        have_cpu += g["replicas"] * cpus(limits["cpu"])  # Ray counts a worker's CPUs from its container
        have_gpu += g["replicas"] * float(limits.get("nvidia.com/gpu", 0))
    assert agents * per_cpu <= have_cpu and agents * per_gpu <= have_gpu, (agents, per_cpu, per_gpu, have_cpu, have_gpu)


def test_only_the_head_holds_the_token_and_ray_never_shows_it(helm):
    docs = render(helm, "--set", "auth.token=tok-4f1d9c2a7b")
    secret, job = docs["Secret"], docs["RayJob"]
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert token == "tok-4f1d9c2a7b"
    head, *workers = [t["spec"]["containers"][0] for t in templates(job)]
    [env] = [e for e in head["env"] if e["name"] == "LOCKSTEP_TOKEN"]
    assert env["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "token"}
    assert all(e["name"] != "LOCKSTEP_TOKEN" for w in workers for e in w["env"])
    assert token not in json.dumps(job), "the RayJob (entrypoint, runtime_env) is what Ray's dashboard shows"


@pytest.mark.parametrize("setting, message", [
    ('agents.gpusPerAgent=1.5', "agents.gpusPerAgent: Must validate at least one schema"),
    ('agents.strategy="TIGHT"', "agents.strategy: agents.strategy must be one of the following"),
    ('worker.replicas=-1', "worker.replicas: Must be greater than or equal to 0"),
    ('worker.replica=2', "worker: Additional property replica is not allowed"),
    ('experiment.overrides=["seed=\'1\'"]', "experiment.overrides.0: Does not match pattern"),
])
def test_the_kuberay_schema_rejects_a_wrong_value_with_a_clear_message(helm, setting, message):
    proc = helm("template", "exp1", str(KUBERAY), "--set-json", setting, check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr, proc.stderr

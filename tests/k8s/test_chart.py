"""The Helm chart: lint, render, validate every manifest, and install it into a real API server.

The render tests need only ``helm``; the install tests also need the kube-apiserver of conftest.py.
No kubelet runs there: installing creates and stores every object (RBAC, Secret, Job, ...) for
real, but the Job's pod is never created (no job controller runs) and no container starts.
"""
from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from omegaconf import OmegaConf

from controller.config.schema import KubernetesLauncherConfig, typed
from controller.launchers.base import LaunchSpec
from controller.launchers.kubernetes import KubernetesLauncher, build_agent_pod, load_pod_template
from .conftest import CHART, KubeCluster, render, wait_until

K8S_VERSION = "1.29.0"  # the oldest schema set the installed kubernetes-validate ships
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
VALUE_SETS = [None, *CI_VALUES]
DASHBOARD = CHART / "dashboards" / "lockstep.json"

# ServiceMonitor is a Prometheus Operator CRD, unknown to kubernetes-validate: this schema checks
# the part of monitoring.coreos.com/v1 the chart renders, strictly.
SERVICE_MONITOR_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "labels": {"type": "object", "additionalProperties": {"type": "string"}}}},
        "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
                 "properties": {
                     "selector": {"type": "object", "additionalProperties": False, "properties": {
                         "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}},
                     "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                         "matchNames": {"type": "array", "items": {"type": "string"}}}},
                     "endpoints": {"type": "array", "minItems": 1, "items": {
                         "type": "object", "additionalProperties": False, "required": ["port"],
                         "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                                        "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                                        "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                                        "relabelings": {"type": "array", "items": {
                                            "type": "object", "additionalProperties": False,
                                            "required": ["sourceLabels", "targetLabel"],
                                            "properties": {
                                                "sourceLabels": {"type": "array", "items": {
                                                    "type": "string", "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}},
                                                "targetLabel": {"type": "string",
                                                                "pattern": "^[a-zA-Z_][a-zA-Z0-9_]*$"}}}}}}},
                 }},
    },
}


# The part of monitoring.coreos.com/v1 PodMonitor the chart renders, strictly (same selector shape).
POD_MONITOR_SCHEMA = {
    "type": "object", "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": SERVICE_MONITOR_SCHEMA["properties"]["metadata"],
        "spec": {"type": "object", "additionalProperties": False, "required": ["selector", "podMetricsEndpoints"],
                 "properties": {
                     "selector": SERVICE_MONITOR_SCHEMA["properties"]["spec"]["properties"]["selector"],
                     "namespaceSelector":
                         SERVICE_MONITOR_SCHEMA["properties"]["spec"]["properties"]["namespaceSelector"],
                     "podMetricsEndpoints": SERVICE_MONITOR_SCHEMA["properties"]["spec"]["properties"]["endpoints"],
                 }},
    },
}


def values_args(values: Path | None) -> list[str]:
    return ["-f", str(values)] if values else []


def value_id(values: Path | None) -> str:
    return values.stem if values else "defaults"


def by_kind(docs: list[dict]) -> dict[str, list[dict]]:
    kinds: dict[str, list[dict]] = {}
    for doc in docs:
        kinds.setdefault(doc["kind"], []).append(doc)
    return kinds


def agent_template(docs: list[dict], tmp_path: Path) -> dict:
    [cm] = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-agent-pod")]
    path = tmp_path / "agent-pod.yaml"
    path.write_text(cm["data"]["agent-pod.yaml"])
    return load_pod_template(path)


def job_args(docs: list[dict]) -> list[str]:
    [job] = by_kind(docs)["Job"]
    return job["spec"]["template"]["spec"]["containers"][0]["args"]


def arg(args: list[str], key: str) -> str:
    [value] = [a.split("=", 1)[1] for a in args if a.startswith(key + "=")]
    return value


# --- rendering -------------------------------------------------------------------------------
@pytest.mark.parametrize("values", VALUE_SETS, ids=value_id)
def test_helm_lint_strict_passes(helm, values):
    out = helm("lint", "--strict", str(CHART), *values_args(values)).stdout
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_id)
def test_every_rendered_manifest_is_valid_kubernetes(helm, values, tmp_path):
    docs = render(helm, *values_args(values))
    kinds = by_kind(docs)
    assert {"Job", "Service", "Role", "RoleBinding", "ConfigMap"} <= set(kinds)
    for doc in docs:
        if doc["kind"] == "ServiceMonitor":
            jsonschema.validate(doc, SERVICE_MONITOR_SCHEMA)
        elif doc["kind"] == "PodMonitor":
            jsonschema.validate(doc, POD_MONITOR_SCHEMA)
        else:
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    # The agent pods the launcher will build from the rendered template are valid too.
    spec = LaunchSpec(run_id="exp1", n_agents=1, controller_address="exp1-lockstep.lab.svc:50051",
                      token="t", run_dir=Path("/results/exp1"),
                      metrics_port=int(arg(job_args(docs), "metrics.agent_port")))
    pod = build_agent_pod(spec, 0, name="lockstep-exp1-agent-0", namespace="lab", image="lockstep:0.1.0",
                          image_pull_policy="IfNotPresent", instance="exp1", token_secret=("exp1-lockstep", "token"),
                          template=agent_template(docs, tmp_path))
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)


def test_a_manifest_with_an_unknown_field_fails_validation(helm):
    """Guards the test above: strict validation does reject what Kubernetes would silently drop."""
    [job] = by_kind(render(helm))["Job"]
    job["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError, match="imagePullPolcy"):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


@pytest.mark.parametrize("setting, message", [
    ("agents.count=four", "agents.count: Invalid type. Expected: integer, given: string"),
    ("agents.count=0", "agents.count: Must be greater than or equal to 1"),
    ("agents.replicas=4", "agents: Additional property replicas is not allowed"),
    ("image.pullPolicy=Sometimes", "image.pullPolicy: image.pullPolicy must be one of the following"),
    ("serviceMonitor.interval=often", "serviceMonitor.interval: Does not match pattern"),
    ("controller.port=70000", "controller.port: Must be less than or equal to 65535"),
])
def test_the_schema_rejects_a_wrong_value_with_a_clear_message(helm, setting, message):
    proc = helm("template", "exp1", str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert message in proc.stderr


@pytest.mark.parametrize("setting, message", [
    ("metrics.port=50051", "metrics.port and controller.port are both 50051: the controller's Service and container "
                           "cannot have one port twice; give them different ports"),
    ("results.mountPath=/tmp", "results.mountPath=/tmp is the controller's own mount /tmp; accepted: another path, "
                               "e.g. /results"),
    ("results.mountPath=/etc/lockstep/", "results.mountPath=/etc/lockstep/ is the controller's own mount "
                                         "/etc/lockstep; accepted: another path"),
])
def test_values_the_api_server_would_refuse_at_install_fail_the_render(helm, setting, message):
    # the schema passed them, and so did helm lint and kubernetes-validate; the install failed (a Service's
    # duplicate port, a container's duplicate mount path) and left its kept claim behind
    proc = helm("template", "exp1", str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert helm("template", "exp1", str(CHART), "--set", "results.mountPath=/tmp/results", check=False).returncode == 0


def test_the_controller_job_runs_the_experiment_and_dials_back_through_the_service(helm):
    docs = render(helm, "--set", "experiment.overrides={strategy=ps_async,workers=256}",
                  "--set", "agents.count=4", "--set", "controller.port=6000", "--set", "metrics.port=9500")
    kinds = by_kind(docs)
    [job], [svc], [secret] = kinds["Job"], kinds["Service"], kinds["Secret"]
    pod = job["spec"]["template"]["spec"]
    [ctr] = pod["containers"]
    args = ctr["args"]
    assert "command" not in ctr  # the image's entrypoint (tini) runs the args
    assert args[:3] == ["lockstep", "run", "launcher=kubernetes"]
    assert args[-2:] == ["strategy=ps_async", "workers=256"]  # the user's overrides come last and win
    assert arg(args, "agents") == "4"
    assert arg(args, "controller.host") == "0.0.0.0"
    assert arg(args, "controller.port") == "6000"
    assert arg(args, "metrics.port") == "9500"
    assert arg(args, "launcher.controller_address") == f"{svc['metadata']['name']}.lab.svc:6000"
    assert arg(args, "launcher.namespace") == "lab"
    assert arg(args, "launcher.instance") == "exp1"
    assert arg(args, "hydra.run.dir") == "/results/exp1"
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {"grpc": 6000, "metrics": 9500}
    assert {p["name"]: p["containerPort"] for p in ctr["ports"]} == {"grpc": 6000, "metrics": 9500}
    # The Service selects the controller pod and nothing else (agent pods share the name label).
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "controller"
    # One token, from one Secret, for the controller and (through the launcher) the agents.
    env = {e["name"]: e for e in ctr["env"]}
    ref = env["LOCKSTEP_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert (ref["name"], ref["key"]) == (secret["metadata"]["name"], "token")
    assert arg(args, "launcher.token_secret.name") == secret["metadata"]["name"]
    assert len(base64.b64decode(secret["data"]["token"])) >= 32
    assert env["LOCKSTEP_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert pod["serviceAccountName"] == kinds["ServiceAccount"][0]["metadata"]["name"]


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_id)
def test_the_jobs_arguments_are_overrides_the_lockstep_config_accepts(helm, values):
    """Hydra refuses an override of a key that does not exist, so a renamed config key breaks this."""
    from controller.config import compose_config, load

    args = job_args(render(helm, *values_args(values)))
    overrides = [a for a in args[2:] if not a.startswith("hydra.")]
    cfg = compose_config(overrides)
    load(overrides, check_data=False)  # valid as a whole, not only composable
    assert cfg.launcher.name == "kubernetes"
    assert (cfg.controller.host, cfg.metrics.host) == ("0.0.0.0", "0.0.0.0")
    assert cfg.launcher.pod_template_file == "/etc/lockstep/agent-pod.yaml"
    KubernetesLauncher(OmegaConf.to_object(cfg.launcher))  # and the launcher takes the typed node as it is


def test_the_role_allows_managing_pods_and_reading_only_its_own_secret(helm):
    kinds = by_kind(render(helm))
    [role], [binding], [secret] = kinds["Role"], kinds["RoleBinding"], kinds["Secret"]
    rules = {tuple(r["resources"]): r for r in role["rules"]}
    assert set(rules) == {("pods",), ("pods/log",), ("secrets",), ("jobs/status",)}
    assert rules[("jobs/status",)] == {"apiGroups": ["batch"], "resources": ["jobs/status"],
                                       "resourceNames": [kinds["Job"][0]["metadata"]["name"]], "verbs": ["patch"]}
    assert sorted(rules[("pods",)]["verbs"]) == ["create", "delete", "get", "list"]  # no unused watch
    assert rules[("pods/log",)]["verbs"] == ["get"]
    assert rules[("secrets",)] == {"apiGroups": [""], "resources": ["secrets"],
                                   "resourceNames": [secret["metadata"]["name"]], "verbs": ["get"]}
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "namespace": "lab",
                                    "name": kinds["ServiceAccount"][0]["metadata"]["name"]}]


@pytest.mark.parametrize("values", VALUE_SETS, ids=value_id)
def test_every_pod_runs_non_root_on_a_read_only_root_filesystem(helm, values, tmp_path):
    docs = render(helm, *values_args(values))
    [job] = by_kind(docs)["Job"]
    pods = [job["spec"]["template"]["spec"], agent_template(docs, tmp_path)["spec"]]
    pods += [d["spec"] for d in docs if d["kind"] == "Pod"]  # the helm test pod
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for ctr in pod["containers"]:
            sc = ctr["securityContext"]
            assert (sc["readOnlyRootFilesystem"], sc["allowPrivilegeEscalation"]) == (True, False)
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert any(m["mountPath"] == "/tmp" for m in ctr.get("volumeMounts", [])), ctr["name"]


def test_the_network_policies_let_agents_reach_the_controller_and_each_other_and_prometheus_the_metrics(helm):
    by_name = {d["metadata"]["name"]: d["spec"] for d in by_kind(render(helm))["NetworkPolicy"]}
    ctl, agents = by_name["exp1-lockstep-controller"], by_name["exp1-lockstep-agents"]
    agent_pods = {"app.kubernetes.io/name": "lockstep", "app.kubernetes.io/component": "agent",
                  "app.kubernetes.io/instance": "exp1", "app.kubernetes.io/managed-by": "lockstep"}
    prometheus = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}
    assert ctl["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "controller"
    assert ctl["policyTypes"] == agents["policyTypes"] == ["Ingress"]
    grpc, metrics = ctl["ingress"]
    assert grpc == {"from": [{"podSelector": {"matchLabels": agent_pods}}], "ports": [{"port": "grpc", "protocol": "TCP"}]}
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}] and prometheus in metrics["from"]
    assert agents["podSelector"]["matchLabels"] == agent_pods
    peers, scrape = agents["ingress"]  # direct streams use a port each agent picks: any port, agents only
    assert peers == {"from": [{"podSelector": {"matchLabels": agent_pods}}]}
    assert scrape == {"from": [prometheus], "ports": [{"port": 9400, "protocol": "TCP"}]}
    assert "NetworkPolicy" not in by_kind(render(helm, "--set", "networkPolicy.enabled=false"))


def test_tls_mounts_the_secret_in_the_controller_and_every_agent_and_turns_on_mutual_tls(helm, tmp_path):
    docs = render(helm, "-f", str(CHART / "ci" / "tls-values.yaml"))
    args = job_args(docs)
    assert (arg(args, "controller.tls.enabled"), arg(args, "controller.tls.client_auth")) == ("true", "true")
    assert (arg(args, "controller.tls.cert"), arg(args, "controller.tls.key"), arg(args, "controller.tls.ca")) == (
        "/etc/lockstep-tls/tls.crt", "/etc/lockstep-tls/tls.key", "/etc/lockstep-tls/ca.crt")  # cert-manager's keys
    [job] = by_kind(docs)["Job"]
    for pod in (job["spec"]["template"]["spec"], agent_template(docs, tmp_path)["spec"]):
        [vol] = [v for v in pod["volumes"] if v["name"] == "tls"]
        assert vol == {"name": "tls", "secret": {"secretName": "exp1-lockstep-tls"}}
        [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "tls"]
        assert mount == {"name": "tls", "mountPath": "/etc/lockstep-tls", "readOnly": True}
    assert not any(a.startswith("controller.tls") for a in job_args(render(helm)))


def test_gpu_values_reach_the_agent_pod_template(helm, tmp_path):
    docs = render(helm, "-f", str(CHART / "ci" / "gpu-agents-values.yaml"),
                  "--set", "agents.resources.limits.nvidia\\.com/gpu=2")
    spec = agent_template(docs, tmp_path)["spec"]
    [agent] = spec["containers"]
    assert agent["name"] == "agent"
    assert agent["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert spec["priorityClassName"] == "high-priority"
    args = job_args(docs)
    assert arg(args, "launcher.image") == "'lockstep:0.1.0-cuda'"
    assert arg(args, "launcher.unschedulable_grace_s") == "300"
    assert "image" not in agent  # the launcher sets it from launcher.image


def test_persistence_puts_results_on_a_kept_claim_by_default(helm):
    for docs, size in ((render(helm), "2Gi"), (render(helm, "-f", str(CHART / "ci" / "persistence-values.yaml")), "20Gi")):
        [pvc] = by_kind(docs)["PersistentVolumeClaim"]
        assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert pvc["spec"]["resources"]["requests"]["storage"] == size
        [job] = by_kind(docs)["Job"]
        volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
        assert volumes["results"]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    off = by_kind(render(helm, "--set", "results.persistence.enabled=false"))
    assert "PersistentVolumeClaim" not in off
    assert off["Job"][0]["spec"]["template"]["spec"]["volumes"][0] == {"name": "results", "emptyDir": {}}


def test_an_existing_secret_replaces_the_generated_one(helm):
    docs = render(helm, "-f", str(CHART / "ci" / "existing-secret-values.yaml"))
    kinds = by_kind(docs)
    assert "Secret" not in kinds
    args = job_args(docs)
    assert (arg(args, "launcher.token_secret.name"), arg(args, "launcher.token_secret.key")) == (
        "lockstep-token", "shared-token")
    assert kinds["Role"][0]["rules"][2]["resourceNames"] == ["lockstep-token"]


def test_the_service_monitor_is_off_by_default_and_scrapes_the_metrics_port(helm):
    assert "ServiceMonitor" not in by_kind(render(helm))
    docs = render(helm, "-f", str(CHART / "ci" / "servicemonitor-values.yaml"))
    [sm], [svc], [job] = by_kind(docs)["ServiceMonitor"], by_kind(docs)["Service"], by_kind(docs)["Job"]
    assert sm["metadata"]["labels"]["release"] == "prometheus"
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    # the dashboard's release and run_id labels come from the controller pod's labels
    relabel = {r["targetLabel"]: r["sourceLabels"] for r in sm["spec"]["endpoints"][0]["relabelings"]}
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["app.kubernetes.io/instance"] == "exp1" and pod_labels["lockstep.io/run-id"] == "exp1"
    assert relabel == {"release": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
                       "run_id": ["__meta_kubernetes_pod_label_lockstep_io_run_id"],
                       "job": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"]}
    assert arg(job_args(docs), "run_id") == "exp1"


def test_monitoring_switches_the_service_monitor_pod_monitor_and_dashboard_on_together(helm):
    def kinds(*sets: str) -> set[str]:
        docs = render(helm, *[a for s in sets for a in ("--set", s)])
        out = {d["kind"] for d in docs if d["kind"] in ("ServiceMonitor", "PodMonitor")}
        return out | {"dashboard" for d in docs if "lockstep.json" in d.get("data", {})}

    assert kinds() == set()
    assert kinds("monitoring.enabled=true") == {"ServiceMonitor", "PodMonitor", "dashboard"}
    assert kinds("monitoring.enabled=true", "podMonitor.enabled=false") == {"ServiceMonitor", "dashboard"}
    assert kinds("dashboard.enabled=true") == {"dashboard"}
    docs = render(helm, "--set", "monitoring.enabled=true", "--set", "monitoring.release=kube-prom")
    assert [d["metadata"]["labels"]["release"] for d in docs
            if d["kind"] in ("ServiceMonitor", "PodMonitor")] == ["kube-prom", "kube-prom"]


def test_the_pod_monitor_is_off_by_default_and_selects_the_agent_pods_by_their_metrics_port(helm, tmp_path):
    assert "PodMonitor" not in by_kind(render(helm))
    docs = render(helm, "-f", str(CHART / "ci" / "servicemonitor-values.yaml"), "--set", "metrics.agentPort=9411")
    [pm] = by_kind(docs)["PodMonitor"]
    assert pm["metadata"]["labels"]["release"] == "prometheus"
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert arg(job_args(docs), "metrics.agent_port") == "9411"
    # the pod the launcher builds for release exp1 (helm's default name in render) matches and names the port
    spec = LaunchSpec(run_id="exp1", n_agents=1, controller_address="c:1", token="t", run_dir=Path("/r"),
                      metrics_port=9411)
    pod = build_agent_pod(spec, 0, name="a0", namespace="default", image="lockstep:0.1.0", image_pull_policy=None,
                          instance=arg(job_args(docs), "launcher.instance"), token_secret=("s", "token"),
                          template=agent_template(docs, tmp_path))
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    [agent] = [c for c in pod["spec"]["containers"] if c["name"] == "agent"]
    assert {"name": "metrics", "containerPort": 9411, "protocol": "TCP"} in agent["ports"]


def dashboard_of(docs: list[dict]) -> tuple[dict, dict]:
    [cm] = [d for d in docs if d["kind"] == "ConfigMap" and "lockstep.json" in d.get("data", {})]
    return cm, json.loads(cm["data"]["lockstep.json"])


def test_the_dashboard_ships_as_a_configmap_for_the_grafana_sidecar(helm):
    docs = render(helm, "--set", "monitoring.enabled=true", "--set", "dashboard.annotations.grafana_folder=lockstep")
    cm, shipped = dashboard_of(docs)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "lockstep"}
    # the committed dashboard, but for uid, title and where its namespace and release variables start
    committed = json.loads(DASHBOARD.read_text())
    assert (shipped["uid"], shipped["title"]) == ("lockstep-" + hashlib.sha256(b"lab/exp1").hexdigest()[:12],
                                                  "lockstep: lab/exp1")
    start = {v["name"]: v.get("current") for v in shipped["templating"]["list"]}
    assert start["namespace"] == {"text": "lab", "value": ["lab"]}
    assert start["release"] == {"text": "exp1", "value": ["exp1"]}
    for d in (shipped, committed):
        del d["uid"], d["title"]
        for v in d["templating"]["list"]:
            v.pop("current", None)
    assert shipped == committed
    assert not [d for d in render(helm, "--set", "monitoring.enabled=true", "--set", "dashboard.enabled=false")
                if "lockstep.json" in d.get("data", {})]


def test_the_chart_renders_without_the_dashboard_file(helm, tmp_path):
    chart = tmp_path / "lockstep"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("dashboards"))
    out = helm("template", "exp1", str(chart)).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert docs and not [d for d in docs if "lockstep.json" in d.get("data", {})]


# --- installing into a real API server -------------------------------------------------------
@pytest.mark.integration
def test_helm_install_creates_the_release_in_a_real_api_server(helm, kube_cluster: KubeCluster, namespace):
    """No kubelet and no job controller run: the Job is stored, its pod never starts."""
    proc = helm("install", "exp1", str(CHART), "--namespace", namespace, "--kubeconfig", str(kube_cluster.kubeconfig),
                "--set", "agents.count=3", "--set", "experiment.overrides={strategy=ps_async,workers=256}",
                "--set", "results.persistence.enabled=true")
    assert "STATUS: deployed" in proc.stdout
    assert f"kubectl -n {namespace} logs -f job/exp1-lockstep" in proc.stdout  # NOTES.txt
    from kubernetes import client

    api = kube_cluster.api_client()
    core, batch, rbac = client.CoreV1Api(api), client.BatchV1Api(api), client.RbacAuthorizationV1Api(api)
    job = batch.read_namespaced_job("exp1-lockstep", namespace)
    assert "agents=3" in job.spec.template.spec.containers[0].args
    svc = core.read_namespaced_service("exp1-lockstep", namespace)
    assert svc.spec.cluster_ip.startswith("10.96.0.")
    assert rbac.read_namespaced_role("exp1-lockstep", namespace).rules[0].resources == ["pods"]
    rbac.read_namespaced_role_binding("exp1-lockstep", namespace)
    core.read_namespaced_service_account("exp1-lockstep", namespace)
    core.read_namespaced_config_map("exp1-lockstep-agent-pod", namespace)
    assert core.read_namespaced_persistent_volume_claim("exp1-lockstep-results", namespace).status.phase == "Pending"
    assert len(base64.b64decode(core.read_namespaced_secret("exp1-lockstep", namespace).data["token"])) >= 32


@pytest.mark.integration
def test_helm_upgrade_keeps_the_generated_token(helm, kube_cluster: KubeCluster, namespace):
    kc = ["--namespace", namespace, "--kubeconfig", str(kube_cluster.kubeconfig)]
    core = kube_cluster.core()
    helm("install", "exp1", str(CHART), *kc)
    before = core.read_namespaced_secret("exp1-lockstep", namespace).data["token"]
    helm("upgrade", "exp1", str(CHART), *kc, "--set", "serviceMonitor.labels.team=ml")
    assert core.read_namespaced_secret("exp1-lockstep", namespace).data["token"] == before
    helm("install", "exp2", str(CHART), *kc)
    assert core.read_namespaced_secret("exp2-lockstep", namespace).data["token"] != before


@pytest.mark.integration
def test_the_charts_service_account_may_do_everything_the_launcher_does(helm, kube_cluster: KubeCluster,
                                                                        namespace, tmp_path):
    """The launcher runs with the chart's ServiceAccount token, so the Role is tested, not assumed."""
    helm("install", "exp1", str(CHART), "--namespace", namespace, "--kubeconfig", str(kube_cluster.kubeconfig))
    core = kube_cluster.core()
    docs = render(helm, release="exp1", namespace=namespace)
    # Stand-in for the Job's pod (no job controller creates it here) and the agent template it mounts.
    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "exp1-lockstep-abcde"},
        "spec": {"serviceAccountName": "exp1-lockstep", "automountServiceAccountToken": False,
                 "containers": [{"name": "controller", "image": "lockstep:0.1.0"}]}})
    template = tmp_path / "agent-pod.yaml"
    template.write_text(yaml.safe_dump(agent_template(docs, tmp_path)))
    sa_token = core.create_namespaced_service_account_token(
        "exp1-lockstep", namespace, {"spec": {"audiences": [], "expirationSeconds": 3600}}).status.token
    kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "sa.kubeconfig", sa_token, namespace=namespace)
    run_token = base64.b64decode(core.read_namespaced_secret("exp1-lockstep", namespace).data["token"]).decode()
    args = job_args(docs)

    launcher = KubernetesLauncher(typed(KubernetesLauncherConfig, {
        "kubeconfig": str(kubeconfig), "image": "lockstep:0.1.0", "owner_pod": "exp1-lockstep-abcde",
        "controller_address": arg(args, "launcher.controller_address"), "instance": "exp1",
        "pod_template_file": str(template),
        "token_secret": {"name": arg(args, "launcher.token_secret.name"), "key": "token"}}))
    spec = LaunchSpec(run_id="exp1-run", n_agents=2, controller_address="0.0.0.0:50051", token=run_token,
                      run_dir=tmp_path)
    try:
        launcher.start(spec)
        assert launcher.namespace == namespace  # from the kubeconfig's context
        assert len(launcher.pods) == 2
        launcher.check()
    finally:
        launcher.stop()
    wait_until(lambda: not core.list_namespaced_pod(namespace, label_selector="lockstep.io/run-id=exp1-run").items,
               timeout=30, what="agent pods deleted with the chart's ServiceAccount")

    # ...and nothing beyond its namespace.
    from controller.launchers.kubernetes import KubernetesLauncherError

    outside = KubernetesLauncher(typed(KubernetesLauncherConfig, {"kubeconfig": str(kubeconfig), "namespace": "default", "image": "x",
                                  "controller_address": "exp1-lockstep:50051",
                                  "token_secret": {"name": "exp1-lockstep", "key": "token"}}))
    with pytest.raises(KubernetesLauncherError, match="403 Forbidden"):
        outside.start(spec)


def test_a_restarted_controller_pod_resumes_the_run_and_only_lockstep_failures_are_final(helm):
    # docs/recovery.md: the Job starts a new controller pod after one was killed or evicted, and that pod
    # resumes the unfinished run in the results volume; exit status 1 or 2 (lockstep's own) fails the Job
    [job] = by_kind(render(helm, "--kube-version", "1.29.0"))["Job"]
    assert arg(job_args([job]), "recovery.resume") == "auto"
    assert job["spec"]["backoffLimit"] == 3
    fail, ignore = job["spec"]["podFailurePolicy"]["rules"]
    assert fail == {"action": "FailJob", "onExitCodes": {"containerName": "controller", "operator": "In",
                                                         "values": [1, 2]}}
    assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    # clusters before 1.26 know no podFailurePolicy: the Job only retries
    [old] = by_kind(render(helm, "--kube-version", "1.20.0", "--set", "controller.resumeOnRestart=false"))["Job"]
    assert "podFailurePolicy" not in old["spec"]
    assert arg(job_args([old]), "recovery.resume") == "never"

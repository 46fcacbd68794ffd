"""What users extend the chart with (KubeRay's value names), its switches, its dashboards per release
and its ``helm test``: rendered with the real helm, installed into the real API server of conftest.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from agents.observe.metrics import Metrics, serve
from controller.launchers.base import LaunchSpec
from controller.launchers.kubernetes import build_agent_pod
from .conftest import CHART, KubeCluster, render
from .test_chart import agent_template, arg, by_kind, job_args

EXTEND = CHART / "ci" / "extend-values.yaml"


def test_the_agents_settings_reach_the_pods_the_launcher_creates(helm, tmp_path):
    docs = render(helm, "-f", str(EXTEND))
    args = job_args(docs)
    spec = LaunchSpec(run_id=arg(args, "run_id"), n_agents=2, controller_address="c:1", token="t",
                      run_dir=Path("/r"), metrics_port=9400)
    pod = build_agent_pod(spec, 1, name="lockstep-x-agent-1", namespace="lab", image="lockstep:0.1.0",
                          image_pull_policy=None, instance="exp1", token_secret=("s", "token"),
                          template=agent_template(docs, tmp_path))
    ps = pod["spec"]
    [agent] = ps["containers"]
    assert ps["serviceAccountName"] == "lockstep-agent" and ps["automountServiceAccountToken"] is False
    assert ps["runtimeClassName"] == "nvidia"
    assert [c["name"] for c in ps["initContainers"]] == ["check-data"]
    assert ps["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname"
    assert {v["name"] for v in ps["volumes"]} == {"tmp", "data", "dshm"}
    assert {m["mountPath"] for m in agent["volumeMounts"]} == {"/tmp", "/data", "/dev/shm"}
    assert agent["envFrom"] == [{"configMapRef": {"name": "agent-env"}, "prefix": "AGENT_"}]
    labels = pod["metadata"]["labels"]
    assert (labels["team"], labels["cost-center"]) == ("ml", "4711")
    # Kueue admits the agents as one group of agents.count pods, queued where the Job is
    assert labels["kueue.x-k8s.io/queue-name"] == "team-ml"
    assert labels["kueue.x-k8s.io/pod-group-name"] == "exp1-lockstep-agents"
    assert pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
    assert labels["lockstep.io/run-id"] == "lr-0p1-seed1"  # the launcher's own labels still win


def test_the_controller_pod_takes_the_same_settings_and_the_release_its_extras(helm):
    docs = render(helm, "-f", str(EXTEND))
    kinds = by_kind(docs)
    [job] = kinds["Job"]
    ps = job["spec"]["template"]["spec"]
    [ctr] = ps["containers"]
    assert ctr["image"] == ("registry.example.com/ml/lockstep@sha256:"
                            "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
    assert arg(job_args(docs), "launcher.image") == f"'{ctr['image']}'"
    assert ps["serviceAccountName"] == "lockstep-runner"
    assert kinds["RoleBinding"][0]["subjects"][0]["name"] == "lockstep-runner"
    assert ps["runtimeClassName"] == "gvisor" and ps["initContainers"][0]["name"] == "wait-for-data"
    assert ctr["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
    assert {"name": "notes", "mountPath": "/etc/notes", "readOnly": True} in ctr["volumeMounts"]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-ml"
    assert arg(job_args(docs), "outputs.upload") == '"s3://ml-results/lockstep"'
    for doc in docs:  # commonLabels on everything the chart creates (extraObjects are the user's own)
        if doc["metadata"]["name"] not in ("lockstep-notes", "lockstep-agent"):
            assert doc["metadata"]["labels"]["team"] == "ml", (doc["kind"], doc["metadata"]["name"])
    # extraObjects, as objects and as templated strings
    [notes] = [d for d in kinds["ConfigMap"] if d["metadata"]["name"] == "lockstep-notes"]
    assert notes["data"] == {"release": "exp1"}
    assert any(d["metadata"]["name"] == "lockstep-agent" for d in kinds["ServiceAccount"])


def test_enabled_false_renders_nothing_and_a_parent_chart_can_switch_it_by_condition(helm, tmp_path):
    assert render(helm, "--set", "enabled=false") == []
    parent = tmp_path / "parent"
    (parent / "charts").mkdir(parents=True)
    (parent / "Chart.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v2", "name": "parent", "version": "0.1.0",
        "dependencies": [{"name": "lockstep", "version": "0.1.0", "repository": f"file://{CHART}",
                          "condition": "lockstep.enabled"}]}))
    helm("dependency", "update", str(parent))
    on = [d for d in yaml.safe_load_all(helm("template", "p", str(parent), "--set", "lockstep.agents.count=3").stdout) if d]
    assert arg(job_args(on), "agents") == "3"
    for setting in ("lockstep.enabled=false",):
        off = [d for d in yaml.safe_load_all(helm("template", "p", str(parent), "--set", setting).stdout) if d]
        assert off == []


def test_long_release_names_keep_distinct_full_names_of_at_most_40_characters(helm):
    a = by_kind(render(helm, release="learning-rate-sweep-lr-0p1-momentum-0p9-seed1"))["Job"][0]["metadata"]["name"]
    b = by_kind(render(helm, release="learning-rate-sweep-lr-0p1-momentum-0p9-seed2"))["Job"][0]["metadata"]["name"]
    assert a != b and len(a) <= 40 and len(b) <= 40 and a[:31] == b[:31]
    assert by_kind(render(helm, release="exp1"))["Job"][0]["metadata"]["name"] == "exp1-lockstep"


@pytest.mark.parametrize("setting, message", [
    ("controller.extraVolumeMounts[0].name=x", "controller.extraVolumeMounts.0: mountPath is required"),
    ("agents.extraVolumes[0].emptyDir.medium=Memory", "agents.extraVolumes.0: name is required"),
    ("image.digest=latest", "image.digest: Does not match pattern"),
    ("agents.envFrom[0].secret.name=x", "agents.envFrom.0: Additional property secret is not allowed"),
    ("monitoring.enable=true", "monitoring: Additional property enable is not allowed"),
    ("experiment.runId=a.b", "experiment.runId: Does not match pattern"),
    ("results.upload=bucket", "results.upload: Does not match pattern"),
])
def test_the_schema_rejects_mistakes_in_the_new_values(helm, setting, message):
    proc = helm("template", "exp1", str(CHART), "--set", setting, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


# --- helm test ------------------------------------------------------------------------------
def _test_script(helm, tmp_path: Path, *sets: str) -> list[str]:
    docs = render(helm, "--set", f"results.mountPath={tmp_path}", "--set", "tests.timeoutSeconds=1", *sets)
    [pod] = [d for d in docs if d["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    [ctr] = pod["spec"]["containers"]
    return [sys.executable if c == "python" else c for c in ctr["command"]]


def test_helm_test_passes_once_the_run_ended_and_says_when_it_stopped_before_its_end(helm, tmp_path):
    """The test pod's own script, run here: the results volume is a local directory (no kubelet)."""
    run = tmp_path / "exp1"
    run.mkdir()
    cmd = _test_script(helm, tmp_path, "--set", "fullnameOverride=localhost", "--set", "metrics.port=1")
    (run / "summary.json").write_text(json.dumps({"complete": True, "updates": 300, "virtual_time_s": 1.5,
                                                  "test_accuracy": 0.75}))
    ok = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert (ok.returncode, ok.stdout) == (0, f"the run ended: 300 updates in 1.500 virtual s, test accuracy 0.75; "
                                             f"{run / 'summary.json'}\n")
    (run / "summary.json").write_text(json.dumps({"complete": False, "updates": 120, "virtual_time_s": 0.5,
                                                  "test_accuracy": None}))
    stopped = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert stopped.returncode == 1
    assert stopped.stderr == (f"the run stopped before its end: {run / 'summary.json'} is partial (120 updates); "
                              "see kubectl logs job/localhost\n")


def test_helm_test_passes_while_the_run_goes_from_its_metrics(helm, tmp_path):
    reg = CollectorRegistry()
    Metrics(reg, role="controller")
    server, port = serve(reg, "127.0.0.1", 0)
    try:
        cmd = _test_script(helm, tmp_path, "--set", "fullnameOverride=localhost", "--set", f"metrics.port={port}")
        going = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
        server.server_close()
    assert (going.returncode, going.stdout) == (0, f"the run is going: http://localhost:{port}/metrics answers "
                                                   "with lockstep_ metrics\n")


# --- dashboards of two releases -------------------------------------------------------------
@pytest.mark.integration
def test_two_releases_dashboards_coexist_and_uninstalling_one_keeps_the_other(helm, kube_cluster: KubeCluster,
                                                                             namespace):
    kc = ["--namespace", namespace, "--kubeconfig", str(kube_cluster.kubeconfig)]
    for release in ("exp1", "exp2"):  # the API server has no Prometheus Operator CRDs: the dashboard alone
        helm("install", release, str(CHART), *kc, "--set", "dashboard.enabled=true")
    core = kube_cluster.core()

    def dashboards() -> dict[str, dict]:
        cms = core.list_namespaced_config_map(namespace, label_selector="grafana_dashboard=1").items
        return {cm.metadata.name: json.loads(cm.data["lockstep.json"]) for cm in cms}

    both = dashboards()
    assert sorted(both) == ["exp1-lockstep-dashboard", "exp2-lockstep-dashboard"]
    uids = {name: d["uid"] for name, d in both.items()}
    assert len(set(uids.values())) == 2  # Grafana's sidecar keys dashboards by uid
    helm("uninstall", "exp1", *kc)
    left = dashboards()
    assert list(left) == ["exp2-lockstep-dashboard"]
    assert left["exp2-lockstep-dashboard"]["uid"] == uids["exp2-lockstep-dashboard"]
    assert left["exp2-lockstep-dashboard"]["title"] == f"lockstep: {namespace}/exp2"


@pytest.mark.integration
def test_notes_warn_about_the_default_image_and_say_how_to_fetch_results_and_open_the_dashboard(
        helm, kube_cluster: KubeCluster, namespace):
    kc = ["--namespace", namespace, "--kubeconfig", str(kube_cluster.kubeconfig)]
    plain = helm("install", "exp1", str(CHART), *kc).stdout
    assert 'WARNING: image.repository is the default "lockstep"' in plain
    assert f"  lockstep fetch -n {namespace} exp1 ./results" in plain
    assert "--set monitoring.enabled=true --set monitoring.release=<your kube-prometheus-stack release>" in plain
    assert (f"kubectl -n {namespace} get job exp1-lockstep -o jsonpath="
            """'{.status.conditions[?(@.type=="RunFailed")].message}'""") in plain
    shown = helm("install", "exp2", str(CHART), *kc, "--set", "image.repository=registry.example.com/lockstep",
                 "--set", "dashboard.enabled=true", "--set", "monitoring.release=kps").stdout
    assert "WARNING" not in shown
    uid = "lockstep-" + __import__("hashlib").sha256(f"{namespace}/exp2".encode()).hexdigest()[:12]
    assert f"  kubectl -n monitoring port-forward svc/kps-grafana 3000:80" in shown
    assert f"  open http://localhost:3000/d/{uid}" in shown
    cm = kube_cluster.core().read_namespaced_config_map("exp2-lockstep-dashboard", namespace)
    assert json.loads(cm.data["lockstep.json"])["uid"] == uid

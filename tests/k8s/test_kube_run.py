"""``lockstep run launcher=kubernetes`` end to end against the real API server of conftest.py.

No real kubelet runs: a stand-in (fake_kubelet.py) starts each agent pod's command as a local
process with the pod's environment (the token resolved from the Secret), reports its status
through the API, and kills it when the pod is deleted. So the controller, the Kubernetes launcher,
the gRPC registration with the token and the cleanup are all real; images, scheduling and
container isolation are not (``make kind-e2e`` covers those).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from .conftest import REPO, KubeCluster, free_port
from .fake_kubelet import FakeKubelet

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVICE = "exp1-lockstep"  # what the agents dial; the fake kubelet resolves it to 127.0.0.1


@pytest.fixture
def controller_pod(kube_cluster: KubeCluster, namespace: str) -> str:
    """Stand-in for the Job's pod, which owns the agent pods."""
    kube_cluster.core().create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "exp1-lockstep-xyz12"},
        "spec": {"automountServiceAccountToken": False,
                 "containers": [{"name": "controller", "image": "lockstep:test"}]}})
    return "exp1-lockstep-xyz12"


def run_command(kube_cluster: KubeCluster, namespace: str, run_dir, run_id: str, owner: str, *extra: str,
                updates: int = 20) -> list[str]:
    port = free_port()
    return [sys.executable, "-m", "controller.cli", "run", "launcher=kubernetes", f"run_id={run_id}",
            "agents=2", "workers=4", f"stop.updates={updates}", "eval.every=0", "eval.samples=200", "progress=false",
            "controller.host=127.0.0.1", f"controller.port={port}", "controller.startup_timeout_s=120",
            f"launcher.kubeconfig={kube_cluster.kubeconfig}", f"launcher.namespace={namespace}",
            f"launcher.controller_address={SERVICE}.{namespace}.svc:{port}", "launcher.image=lockstep:test",
            f"launcher.owner_pod={owner}", "launcher.check_interval_s=0.2", f"hydra.run.dir={run_dir}", *extra]


def lockstep_run(kube_cluster: KubeCluster, namespace: str, run_dir, run_id: str, owner: str,
                 *extra: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    cmd = run_command(kube_cluster, namespace, run_dir, run_id, owner, *extra)
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def leftovers(core, namespace: str, run_id: str) -> list[str]:
    sel = f"lockstep.io/run-id={run_id}"
    return ([p.metadata.name for p in core.list_namespaced_pod(namespace, label_selector=sel).items]
            + [s.metadata.name for s in core.list_namespaced_secret(namespace, label_selector=sel).items])


def test_a_run_on_kubernetes_agents_finishes_and_deletes_its_pods(kube_cluster, namespace, controller_pod,
                                                                   tmp_path):
    core = kube_cluster.core()
    with FakeKubelet(core, namespace, tmp_path / "kubelet", dns={f"{SERVICE}.{namespace}.svc": "127.0.0.1"}) as kubelet:
        proc = lockstep_run(kube_cluster, namespace, tmp_path / "run", "k8s-e2e", controller_pod)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not kubelet.errors
    assert sorted(kubelet.seen) == ["lockstep-k8s-e2e-agent-0", "lockstep-k8s-e2e-agent-1"]
    for pod in kubelet.seen.values():
        assert pod.metadata.owner_references[0].name == controller_pod
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert (summary["agents"], summary["updates"], summary["run_id"]) == (2, 20, "k8s-e2e")
    assert leftovers(core, namespace, "k8s-e2e") == []  # stop() deleted the pods and the token Secret


def test_a_pod_that_cannot_pull_its_image_stops_the_run_with_its_name_and_reason(kube_cluster, namespace,
                                                                                  controller_pod, tmp_path):
    core = kube_cluster.core()
    pull_error = {"phase": "Pending", "containerStatuses": [{
        "name": "agent", "image": "lockstep:test", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"waiting": {"reason": "ImagePullBackOff",
                              "message": 'Back-off pulling image "lockstep:test"'}}}]}
    with FakeKubelet(core, namespace, tmp_path / "kubelet", dns={f"{SERVICE}.{namespace}.svc": "127.0.0.1"},
                     fail={"lockstep-k8s-bad-agent-1": pull_error}):
        proc = lockstep_run(kube_cluster, namespace, tmp_path / "run", "k8s-bad", controller_pod)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert ("agent lockstep-k8s-bad-agent-1 failed: ImagePullBackOff (container agent): "
            'Back-off pulling image "lockstep:test"') in proc.stderr
    assert leftovers(core, namespace, "k8s-bad") == []


def test_a_pod_stuck_in_image_pull_backoff_fails_the_run_in_one_line_on_the_log_the_job_and_the_pod(
        kube_cluster, namespace, tmp_path):
    """In the chart the controller's pod belongs to a Job: the one-line reason lands on the Job's status
    (condition RunFailed) and in the container's termination message, long before any start-up deadline."""
    from kubernetes import client

    core, batch = kube_cluster.core(), client.BatchV1Api(kube_cluster.api_client())
    job = batch.create_namespaced_job(namespace, {  # stored only: no job controller runs here
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "exp2-lockstep"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                                       "containers": [{"name": "controller", "image": "lockstep:test"}]}}}})
    owner = "exp2-lockstep-abcde"
    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": owner, "labels": {"job-name": "exp2-lockstep"},
        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "exp2-lockstep",
                             "uid": job.metadata.uid, "controller": True}]},
        "spec": {"automountServiceAccountToken": False, "containers": [{"name": "controller", "image": "lockstep:test"}]}})
    pull_error = {"phase": "Pending", "containerStatuses": [{
        "name": "agent", "image": "lockstep:test", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"waiting": {"reason": "ImagePullBackOff",
                              "message": 'Back-off pulling image "lockstep:test"'}}}]}
    termination_log = tmp_path / "termination-log"
    deadline_s = 60
    started = time.monotonic()
    with FakeKubelet(core, namespace, tmp_path / "kubelet", dns={f"{SERVICE}.{namespace}.svc": "127.0.0.1"},
                     fail={"lockstep-k8s-pull-agent-0": pull_error}):
        proc = lockstep_run(kube_cluster, namespace, tmp_path / "run", "k8s-pull", owner,
                            f"launcher.startup_timeout_s={deadline_s}",
                            env={"LOCKSTEP_TERMINATION_LOG": str(termination_log)})
    assert time.monotonic() - started < deadline_s  # the pull error, not the start-up deadline, ended it
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = (f"lockstep: the run stopped because agent lockstep-k8s-pull-agent-0 failed: ImagePullBackOff "
            f'(container agent): Back-off pulling image "lockstep:test". The outputs written so far are in '
            f"{tmp_path / 'run'}.")
    assert line in proc.stderr.splitlines()
    assert termination_log.read_text() == line + "\n"
    conditions = {c.type: c for c in batch.read_namespaced_job_status("exp2-lockstep", namespace).status.conditions}
    assert (conditions["RunFailed"].status, conditions["RunFailed"].reason) == ("True", "ImagePullBackOff")
    assert conditions["RunFailed"].message == line
    assert leftovers(core, namespace, "k8s-pull") == []

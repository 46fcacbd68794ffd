"""The Kubernetes launcher against a real kube-apiserver (see conftest.py).

No kubelet runs: the agent pods are created and stored but never scheduled nor started, so they
stay Pending. Where a test needs a failed pod it patches the pod's status through the API, exactly
as a kubelet reports it; garbage collection is the real kube-controller-manager's.
"""
from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from controller.config.schema import KubernetesLauncherConfig, typed
from controller.launchers.base import AgentFailure, LaunchSpec
from controller.launchers.kubernetes import (
    KubernetesLauncher,
    KubernetesLauncherError,
    LauncherConfigError,
)
from .conftest import KubeCluster, wait_until

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token-of-the-run"


def make_spec(run_id: str = "run-1", n_agents: int = 2, **kw) -> LaunchSpec:
    return LaunchSpec(run_id=run_id, n_agents=n_agents, controller_address="127.0.0.1:50051",
                      token=TOKEN, run_dir=Path("/tmp/unused"), **kw)


@pytest.fixture
def cfg(kube_cluster: KubeCluster, namespace: str) -> dict:
    return {"name": "kubernetes", "kubeconfig": str(kube_cluster.kubeconfig), "namespace": namespace,
            "image": "registry.test/lockstep:1.2.3", "image_pull_policy": "IfNotPresent",
            "controller_address": "ctrl.lab.svc:50051", "owner_pod": None, "check_interval_s": 0,
            "token_secret": {"name": None, "key": "token"}}


@pytest.fixture
def core(kube_cluster: KubeCluster):
    return kube_cluster.core()


@pytest.fixture
def controller_pod(core, namespace: str):
    """A stand-in for the controller's own pod (never runs: there is no kubelet)."""
    return core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "lockstep-controller"},
        "spec": {"automountServiceAccountToken": False,
                 "containers": [{"name": "controller", "image": "registry.test/lockstep:1.2.3"}]},
    })


@pytest.fixture
def launcher(cfg):
    launchers: list[KubernetesLauncher] = []

    def make(**overrides) -> KubernetesLauncher:
        launchers.append(KubernetesLauncher(typed(KubernetesLauncherConfig, {**cfg, **overrides})))
        return launchers[-1]

    yield make
    for launcher in launchers:
        launcher.stop()


def agent_pods(core, namespace: str, run_id: str = "run-1") -> list:
    pods = core.list_namespaced_pod(namespace, label_selector=f"lockstep.io/run-id={run_id}").items
    return sorted(pods, key=lambda p: int(p.metadata.labels["lockstep.io/agent-id"]))


def test_agent_pods_get_the_spec_labels_owner_command_and_token(launcher, core, namespace, controller_pod):
    spec = make_spec(n_agents=3, extra_env={"LOCKSTEP_SEED": "7"})
    lnch = launcher(owner_pod="lockstep-controller", instance="exp1")
    lnch.start(spec)

    pods = agent_pods(core, namespace)
    assert [p.metadata.name for p in pods] == [f"lockstep-run-1-agent-{i}" for i in range(3)]
    assert lnch.pods == [p.metadata.name for p in pods]
    for i, pod in enumerate(pods):
        assert pod.metadata.labels == {
            "app.kubernetes.io/name": "lockstep", "app.kubernetes.io/component": "agent",
            "app.kubernetes.io/instance": "exp1", "app.kubernetes.io/managed-by": "lockstep",
            "lockstep.io/run-id": "run-1", "lockstep.io/agent-id": str(i)}
        [owner] = pod.metadata.owner_references
        assert (owner.kind, owner.name, owner.uid, owner.controller) == (
            "Pod", "lockstep-controller", controller_pod.metadata.uid, True)
        assert pod.spec.restart_policy == "Never"
        assert pod.spec.automount_service_account_token is False
        [agent] = pod.spec.containers
        assert agent.image == "registry.test/lockstep:1.2.3"
        # The configured address, not the controller's loopback listen address, reaches the agents.
        assert agent.command == ["lockstep", "agent", "--controller", "ctrl.lab.svc:50051",
                                 "--agent-id", str(i), "--run-id", "run-1", "--log-level", "INFO"]
        assert TOKEN not in str(pod.to_dict()), "the token must travel in a Secret, never in the pod"
        env = {e.name: e for e in agent.env}
        assert env["LOCKSTEP_RUN_ID"].value == "run-1"
        assert env["LOCKSTEP_SEED"].value == "7"
        assert env["LOCKSTEP_POD_NAME"].value_from.field_ref.field_path == "metadata.name"
        ref = env["LOCKSTEP_TOKEN"].value_from.secret_key_ref
        assert (ref.name, ref.key) == ("lockstep-run-1-token", "token")
        assert agent.security_context.read_only_root_filesystem is True
        assert agent.security_context.allow_privilege_escalation is False
        assert pod.spec.security_context.run_as_non_root is True

    secret = core.read_namespaced_secret("lockstep-run-1-token", namespace)
    assert base64.b64decode(secret.data["token"]).decode() == TOKEN
    assert secret.metadata.owner_references[0].uid == controller_pod.metadata.uid
    lnch.check()  # Pending pods, fresh: nothing to report


def test_the_pod_template_file_sets_resources_scheduling_and_env(launcher, core, namespace, tmp_path):
    template = tmp_path / "agent-pod.yaml"
    template.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"labels": {"team": "ml"}},
        "spec": {
            "priorityClassName": "", "nodeSelector": {"gpu": "h100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "agent", "env": [{"name": "HOME", "value": "/scratch"}],
                            "resources": {"limits": {"nvidia.com/gpu": 1, "memory": "8Gi"}}}],
        }}))
    launcher(pod_template_file=str(template)).start(make_spec(n_agents=1))

    [pod] = agent_pods(core, namespace)
    assert pod.metadata.labels["team"] == "ml"
    assert pod.metadata.labels["app.kubernetes.io/component"] == "agent"
    assert pod.spec.node_selector == {"gpu": "h100"}
    assert pod.spec.tolerations[0].key == "nvidia.com/gpu"
    [agent] = pod.spec.containers
    assert agent.resources.limits == {"nvidia.com/gpu": "1", "memory": "8Gi"}
    env = {e.name: e.value for e in agent.env}
    assert env["HOME"] == "/scratch"  # the template wins over the launcher's defaults
    assert env["LOCKSTEP_PROFILE_DB"] == "/tmp/lockstep-profile.db"


# Statuses as a kubelet (or the scheduler) reports them, and the reason check() must give for each.
def _container(state: dict, restarts: int = 0) -> list[dict]:
    return [{"name": "agent", "image": "registry.test/lockstep:1.2.3", "imageID": "", "ready": False,
             "restartCount": restarts, "state": state}]


_RAN = {"startedAt": "2025-01-01T00:00:00Z", "finishedAt": "2025-01-01T00:01:00Z"}
FAILED_STATUSES = {
    "image-pull": (
        {"phase": "Pending", "containerStatuses": _container({"waiting": {
            "reason": "ImagePullBackOff", "message": 'Back-off pulling image "registry.test/lockstep:1.2.3"'}})},
        'ImagePullBackOff (container agent): Back-off pulling image "registry.test/lockstep:1.2.3"'),
    "oom": (
        {"phase": "Failed", "containerStatuses": _container(
            {"terminated": {"reason": "OOMKilled", "exitCode": 137, **_RAN}})},
        "OOMKilled (container agent, exit code 137)"),
    "unschedulable": (
        {"phase": "Pending", "conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]},
        "Unschedulable: 0/3 nodes are available: 3 Insufficient nvidia.com/gpu."),
    "crash-loop": (
        {"phase": "Running", "containerStatuses": _container({"waiting": {
            "reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}}, restarts=3)},
        "CrashLoopBackOff (container agent): back-off 40s restarting failed container"),
    "exit-code": (
        {"phase": "Failed", "containerStatuses": _container(
            {"terminated": {"reason": "Error", "exitCode": 3, **_RAN}})},
        "Error (container agent, exit code 3)"),
    "evicted": (
        {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."},
        "Evicted: The node was low on resource: memory."),
}


# An agent that ran and is gone is lost (recovery.agents=restart starts a new set, docs/recovery.md); one whose pod
# cannot start is not: a new pod would not start either.
LOST = {"image-pull": False, "oom": True, "unschedulable": False, "crash-loop": False, "exit-code": True,
        "evicted": True}


@pytest.mark.parametrize("case", list(FAILED_STATUSES))
def test_check_names_the_pod_and_the_reason_when_a_kubelet_reports_a_failure(launcher, core, namespace, case):
    status, expected = FAILED_STATUSES[case]
    lnch = launcher()
    lnch.start(make_spec(n_agents=3))
    lnch.check()

    core.patch_namespaced_pod_status("lockstep-run-1-agent-1", namespace, {"status": status})
    with pytest.raises(AgentFailure) as failure:
        lnch.check()
    assert (failure.value.agent, failure.value.reason) == ("lockstep-run-1-agent-1", expected)
    assert str(failure.value).startswith(f"agent lockstep-run-1-agent-1 failed: {expected}")
    assert failure.value.lost is LOST[case]
    with pytest.raises(AgentFailure) as again:  # raised again from memory, the same
        lnch.check()
    assert (again.value.reason, again.value.lost) == (expected, LOST[case])


def test_an_unschedulable_pod_is_tolerated_for_the_grace_period(launcher, core, namespace):
    lnch = launcher(unschedulable_grace_s=3600)
    lnch.start(make_spec(n_agents=1))
    core.patch_namespaced_pod_status("lockstep-run-1-agent-0", namespace,
                                     {"status": FAILED_STATUSES["unschedulable"][0]})
    lnch.check()  # waiting for a cluster autoscaler is fine within the grace period


def test_check_lists_the_pods_at_most_every_check_interval(launcher, core, namespace):
    lnch = launcher(check_interval_s=3600)
    lnch.start(make_spec(n_agents=1))
    lnch.check()
    core.patch_namespaced_pod_status("lockstep-run-1-agent-0", namespace,
                                     {"status": FAILED_STATUSES["oom"][0]})
    lnch.check()  # not listed again within the interval: the controller may poll every few ms
    lnch._last_list -= 3600
    with pytest.raises(AgentFailure, match="OOMKilled"):
        lnch.check()
    with pytest.raises(AgentFailure, match="OOMKilled"):  # and again, without asking the API server
        lnch.check()


def test_a_pod_still_pending_after_the_startup_timeout_fails_the_run(launcher):
    lnch = launcher(startup_timeout_s=1e-6)
    lnch.start(make_spec(n_agents=1))
    with pytest.raises(AgentFailure, match=r"lockstep-run-1-agent-0 failed: still Pending .*not scheduled"):
        lnch.check()


def test_a_pod_deleted_behind_the_launchers_back_fails_the_run(launcher, core, namespace):
    lnch = launcher()
    lnch.start(make_spec(n_agents=2))
    core.delete_namespaced_pod("lockstep-run-1-agent-0", namespace, grace_period_seconds=0)
    with pytest.raises(AgentFailure, match="lockstep-run-1-agent-0 failed: the pod was deleted") as failure:
        lnch.check()
    assert failure.value.lost


def test_stop_deletes_every_pod_and_the_secret_and_can_be_called_again(launcher, core, namespace, controller_pod):
    # Owned by a pod that stays, so only stop() (not the garbage collector) can remove them.
    lnch = launcher(owner_pod="lockstep-controller")
    lnch.start(make_spec(n_agents=3))
    assert len(agent_pods(core, namespace)) == 3

    lnch.stop()
    wait_until(lambda: not agent_pods(core, namespace), timeout=30, what="agent pods deleted")
    wait_until(lambda: not core.list_namespaced_secret(
        namespace, label_selector="lockstep.io/run-id=run-1").items, timeout=30, what="token secret deleted")
    lnch.stop()
    lnch.check()  # nothing left to check, nothing to raise


def test_deleting_the_owner_pod_garbage_collects_the_agents(launcher, core, namespace, controller_pod):
    launcher(owner_pod="lockstep-controller").start(make_spec(n_agents=2))
    assert len(agent_pods(core, namespace)) == 2

    # The controller pod dies without calling stop(): the garbage collector must clean up.
    core.delete_namespaced_pod("lockstep-controller", namespace, grace_period_seconds=0)
    wait_until(lambda: not agent_pods(core, namespace), timeout=90,
               what="agent pods garbage-collected after their owner pod was deleted")
    wait_until(lambda: not core.list_namespaced_secret(
        namespace, label_selector="lockstep.io/run-id=run-1").items, timeout=90,
        what="token secret garbage-collected")


def test_outside_a_cluster_the_run_secret_owns_the_pods(launcher, core, namespace):
    launcher().start(make_spec(n_agents=2))
    secret = core.read_namespaced_secret("lockstep-run-1-token", namespace)
    for pod in agent_pods(core, namespace):
        [owner] = pod.metadata.owner_references
        assert (owner.kind, owner.name, owner.uid) == ("Secret", secret.metadata.name, secret.metadata.uid)
    # After a laptop crash, deleting the Secret removes the whole run.
    core.delete_namespaced_secret(secret.metadata.name, namespace)
    wait_until(lambda: not agent_pods(core, namespace), timeout=90, what="agent pods garbage-collected")


def test_an_existing_token_secret_is_referenced_and_checked(launcher, core, namespace):
    core.create_namespaced_secret(namespace, {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": "exp1-lockstep"},
        "stringData": {"shared": TOKEN}})
    lnch = launcher(token_secret={"name": "exp1-lockstep", "key": "shared"})
    lnch.start(make_spec(n_agents=1))
    [pod] = agent_pods(core, namespace)
    ref = next(e for e in pod.spec.containers[0].env if e.name == "LOCKSTEP_TOKEN").value_from.secret_key_ref
    assert (ref.name, ref.key) == ("exp1-lockstep", "shared")
    lnch.stop()
    core.read_namespaced_secret("exp1-lockstep", namespace)  # not the launcher's to delete

    wrong = make_spec(run_id="run-2", n_agents=1)
    wrong = LaunchSpec(**{**wrong.__dict__, "token": "another token"})
    with pytest.raises(LauncherConfigError, match="exp1-lockstep/shared holds a different token"):
        launcher(token_secret={"name": "exp1-lockstep", "key": "shared"}).start(wrong)
    assert not agent_pods(core, namespace, "run-2")


def test_a_missing_owner_pod_is_a_clear_config_error_and_leaves_nothing(launcher, core, namespace):
    with pytest.raises(LauncherConfigError, match="owner pod 'no-such-pod'.*is not in namespace"):
        launcher(owner_pod="no-such-pod").start(make_spec())
    assert not agent_pods(core, namespace)
    assert not core.list_namespaced_secret(namespace, label_selector="lockstep.io/run-id=run-1").items


def test_a_namespace_that_does_not_exist_or_a_server_that_does_not_answer_is_a_config_error(launcher, tmp_path):
    # both were a traceback from the CLI (exit 1): KubernetesLauncherError, urllib3's MaxRetryError
    with pytest.raises(LauncherConfigError, match=r"^Kubernetes refused to create Secret lockstep-run-1-token in "
                                                  r"namespace no-such-ns: 404 Not Found: namespaces \"no-such-ns\" "
                                                  r"not found$"):
        launcher(namespace="no-such-ns").start(make_spec())
    nowhere = tmp_path / "kubeconfig"
    nowhere.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters: [{name: k, cluster: {server: "
                       "'http://127.0.0.1:1'}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
                       "users: [{name: u, user: {token: x}}]\n")
    with pytest.raises(LauncherConfigError, match=r"^the Kubernetes API server could not be reached to list the "
                                                  r"run's pods: "):
        launcher(kubeconfig=str(nowhere)).start(make_spec())


def test_a_refused_pod_stops_the_start_and_removes_what_was_created(launcher, core, namespace, controller_pod):
    # Someone's pod, not labelled as this run's (whose pods a start steps past), takes agent 1's name.
    core.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "lockstep-run-1-agent-1", "labels": {"team": "x"}},
        "spec": {"automountServiceAccountToken": False, "containers": [{"name": "x", "image": "x"}]}})
    with pytest.raises(KubernetesLauncherError,
                       match="refused to create pod lockstep-run-1-agent-1 .*409 Conflict.*already exists"):
        launcher(owner_pod="lockstep-controller").start(make_spec(n_agents=3))
    wait_until(lambda: not agent_pods(core, namespace), timeout=30, what="agent 0 removed again")
    core.read_namespaced_pod("lockstep-run-1-agent-1", namespace)  # the other pod left alone
    assert not core.list_namespaced_secret(namespace, label_selector="lockstep.io/run-id=run-1").items


def test_a_pod_the_api_server_refuses_is_reported_with_its_reason(launcher, core, namespace, tmp_path):
    template = tmp_path / "bad.yaml"
    template.write_text("spec:\n  containers:\n    - name: agent\n      resources: {limits: {cpu: lots}}\n")
    with pytest.raises(KubernetesLauncherError, match="refused to create pod lockstep-run-1-agent-0"):
        launcher(pod_template_file=str(template)).start(make_spec())
    assert not agent_pods(core, namespace)


# --- restarts (recovery.agents=restart, docs/recovery.md) ------------------------------------------------------
def _token_of(core, namespace: str, pod) -> str:
    ref = next(e for e in pod.spec.containers[0].env if e.name == "LOCKSTEP_TOKEN").value_from.secret_key_ref
    return base64.b64decode(core.read_namespaced_secret(ref.name, namespace).data[ref.key]).decode()


def test_after_a_lost_pod_stop_and_start_again_create_a_new_set_of_pods_with_new_names_and_token(
        launcher, core, namespace, controller_pod):
    """What the controller does when an agent pod is lost: stop() and start() with a new token. The pods never
    run (no kubelet here): the loss is reported through the status subresource, as a kubelet would."""
    lnch = launcher(owner_pod="lockstep-controller", instance="exp1")
    lnch.start(make_spec(n_agents=2))
    first = {p.metadata.name: p for p in agent_pods(core, namespace)}
    core.patch_namespaced_pod_status("lockstep-run-1-agent-1", namespace, {"status": FAILED_STATUSES["oom"][0]})
    with pytest.raises(AgentFailure) as lost:
        lnch.check()
    assert lost.value.lost

    for n, token in ((1, "the token of restart 1"), (2, "the token of restart 2")):
        lnch.stop(restart=True)
        wait_until(lambda: not agent_pods(core, namespace), timeout=30, what="the lost set of pods deleted")
        lnch.start(LaunchSpec(**{**make_spec(n_agents=2).__dict__, "token": token}))
        pods = agent_pods(core, namespace)
        assert [p.metadata.name for p in pods] == [f"lockstep-run-1-r{n}-agent-{i}" for i in range(2)]
        assert lnch.pods == [p.metadata.name for p in pods]
        for i, pod in enumerate(pods):
            old = first[f"lockstep-run-1-agent-{i}"]
            assert pod.metadata.labels == old.metadata.labels  # the same run, agent and instance
            assert pod.metadata.owner_references[0].uid == controller_pod.metadata.uid
            [agent], [was] = pod.spec.containers, old.spec.containers
            assert agent.command == was.command  # the token is in no argument, as before
            assert token not in str(pod.to_dict())
            env = {e.name: e for e in agent.env}
            assert env["LOCKSTEP_TOKEN"].value_from.secret_key_ref.name == f"lockstep-run-1-r{n}-token"
            assert _token_of(core, namespace, pod) == token
            assert {k: e.value for k, e in env.items()} == {e.name: e.value for e in was.env}
        lnch.check()  # the loss of the set before is forgotten; the new pods are fresh
    lnch.stop()
    wait_until(lambda: not agent_pods(core, namespace), timeout=30, what="agent pods deleted")
    assert not core.list_namespaced_secret(namespace, label_selector="lockstep.io/run-id=run-1").items


def test_pods_a_dead_controller_left_terminating_do_not_block_a_new_controllers_agents(launcher, core, namespace):
    """The chart's Job restarts a dead controller, which resumes the run with the same run id: its agents' pods
    must not wait for (nor collide with) the old ones, still terminating for their grace period."""
    held = []
    for i in range(2):  # the old controller's agents, kept terminating by a finalizer (as a kubelet would)
        held.append(core.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {
                "name": f"lockstep-run-1-agent-{i}", "finalizers": ["lockstep.test/hold"],
                "labels": {"lockstep.io/run-id": "run-1", "lockstep.io/agent-id": str(i)}},
            "spec": {"automountServiceAccountToken": False, "containers": [{"name": "agent", "image": "x"}]}}))
        core.delete_namespaced_pod(f"lockstep-run-1-agent-{i}", namespace)
    try:
        assert all(p.metadata.deletion_timestamp for p in agent_pods(core, namespace))
        lnch = launcher()
        lnch.start(make_spec(n_agents=2))
        assert lnch.pods == ["lockstep-run-1-r1-agent-0", "lockstep-run-1-r1-agent-1"]
        lnch.check()  # the old pods, terminating, are not this launcher's: nothing to report
    finally:
        for pod in held:
            core.patch_namespaced_pod(pod.metadata.name, namespace, {"metadata": {"finalizers": None}})

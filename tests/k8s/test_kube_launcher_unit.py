"""The Kubernetes launcher's pure parts (config, names, pod manifests, failure reasons): no cluster needed."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from controller.config import ConfigError, load
from controller.config.schema import KubernetesLauncherConfig, typed
from controller.launchers.base import LaunchSpec
from controller.launchers.kubernetes import (
    DEFAULT_POD_SECURITY_CONTEXT,
    INSTALL_HINT,
    KubernetesLauncher,
    KubernetesLauncherConfig,
    LauncherConfigError,
    build_agent_pod,
    dns_name,
    label_value,
    load_pod_template,
    pod_failure,
)

SPEC = LaunchSpec(run_id="2025-01-01_12-00-00_ab12", n_agents=2, controller_address="ctrl:50051",
                  token="t", run_dir=Path("/tmp/run"))


def pod(name: str = "p", **kw) -> dict:
    return build_agent_pod(SPEC, 0, name=name, namespace="ns", image=kw.pop("image", "img:1"),
                           image_pull_policy=None, instance="exp1", token_secret=("s", "token"), **kw)


def test_the_shipped_config_file_gives_the_schemas_defaults():
    rc = load(["launcher=kubernetes"], check_data=False)
    assert rc.launcher == KubernetesLauncherConfig()
    assert (rc.launcher.image, rc.launcher.token_secret.name, rc.launcher.token_secret.key) == \
        ("lockstep:0.1.0", None, "token")


def test_launcher_settings_from_the_command_line_are_typed():
    rc = load(["launcher=kubernetes", "launcher.namespace=lab", "launcher.token_secret.name=exp1-lockstep",
               "launcher.token_secret.key=k"], check_data=False)
    assert (rc.launcher.namespace, rc.launcher.token_secret.name, rc.launcher.token_secret.key) == \
        ("lab", "exp1-lockstep", "k")


def test_an_unknown_config_key_is_named_with_a_suggestion():
    with pytest.raises(ConfigError, match=r"launcher.namespce is not a key of launcher; did you mean namespace\?"):
        load(["launcher=kubernetes", "launcher.namespce=lab"], check_data=False)


def test_a_wrong_pull_policy_is_refused_with_the_accepted_values():
    with pytest.raises(ConfigError, match=r"launcher.image_pull_policy=Sometimes is not valid; accepted: Always \| "
                                          r"IfNotPresent \| Never or null"):
        load(["launcher=kubernetes", "launcher.image_pull_policy=Sometimes"], check_data=False)


def test_without_the_kubernetes_package_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # makes `import kubernetes` fail
    with pytest.raises(ImportError, match=r"pip install 'lockstep\[kubernetes\]'") as e:
        KubernetesLauncher()
    assert str(e.value) == INSTALL_HINT


def test_a_loopback_controller_address_is_refused_before_anything_is_created():
    launcher = KubernetesLauncher(typed(KubernetesLauncherConfig, {"kubeconfig": "/nonexistent"}))
    with pytest.raises(LauncherConfigError, match="agents would dial 127.0.0.1:50051, which a pod cannot reach"):
        launcher.start(LaunchSpec(run_id="r", n_agents=1, controller_address="127.0.0.1:50051", token="t",
                                  run_dir=Path("/tmp")))
    launcher.stop()  # nothing started: a no-op


def test_names_are_valid_dns_labels_and_long_run_ids_stay_distinct():
    assert dns_name("lockstep", "2025-01-01-12-00-00-ab") == "lockstep-2025-01-01-12-00-00-ab"
    # a run id the label had to change keeps a hash: exp_1 and exp-1 (or Exp1 and exp1) shared their pods' and
    # Secret's names, and the second run's start failed with 409 Conflict
    assert dns_name("lockstep", "2025-01-01_12:00:00.Ab") == "lockstep-2025-01-01-12-00-00-ab-8430ad90"
    assert len({dns_name("lockstep", r) for r in ("exp_1", "exp-1", "Exp-1", "exp.1")}) == 4
    a, b = dns_name("lockstep", "x" * 80 + "1"), dns_name("lockstep", "x" * 80 + "2")
    assert a != b and len(a) <= 48 and len(a + "-agent-9999") <= 63
    assert label_value("run/with spaces") == "run-with-spaces"
    assert len(label_value("y" * 100)) <= 63


def test_the_launcher_owns_command_labels_and_restart_policy_over_the_template():
    template = {"metadata": {"name": "ignored", "labels": {"app.kubernetes.io/component": "x", "team": "ml"}},
                "spec": {"restartPolicy": "Always",
                         "containers": [{"name": "agent", "image": "template:1", "args": ["--oops"],
                                         "env": [{"name": "LOCKSTEP_RUN_ID", "value": "forged"}]},
                                        {"name": "sidecar", "image": "side:1"}]}}
    p = pod(template=template, image=None)
    assert p["metadata"]["name"] == "p"
    assert p["metadata"]["labels"]["app.kubernetes.io/component"] == "agent"
    assert p["metadata"]["labels"]["team"] == "ml"
    assert p["metadata"]["labels"]["lockstep.io/run-id"] == SPEC.run_id
    assert p["spec"]["restartPolicy"] == "Never"
    agent, sidecar = p["spec"]["containers"]
    assert agent["image"] == "template:1"  # no launcher.image: the template's
    assert agent["command"] == SPEC.agent_argv(0) and "args" not in agent
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["LOCKSTEP_RUN_ID"] == SPEC.run_id
    assert sidecar == {"name": "sidecar", "image": "side:1"}


def test_a_template_with_its_own_security_context_keeps_the_safe_defaults_it_does_not_override():
    # finding 8 of the security review (docs/security.md): any securityContext used to drop every default
    template = {"spec": {"securityContext": {"runAsUser": 20000},
                         "containers": [{"name": "agent", "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}}}]}}
    p = pod(template=template)
    assert p["spec"]["securityContext"] == {**DEFAULT_POD_SECURITY_CONTEXT, "runAsUser": 20000}
    sc = p["spec"]["containers"][0]["securityContext"]
    assert (sc["readOnlyRootFilesystem"], sc["allowPrivilegeEscalation"]) == (True, False)
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}  # what it asked for, on top of the rest


def test_no_image_anywhere_is_a_clear_config_error():
    with pytest.raises(LauncherConfigError, match="no agent image: set launcher.image"):
        pod(image=None)


def test_a_bare_pod_spec_is_accepted_as_a_template(tmp_path):
    f = tmp_path / "spec.yaml"
    f.write_text("nodeSelector: {gpu: a100}\n")
    assert load_pod_template(f) == {"spec": {"nodeSelector": {"gpu": "a100"}}}
    f.write_text("kind: Deployment\nspec: {}\n")
    with pytest.raises(LauncherConfigError, match="kind is 'Deployment'; only a Pod"):
        load_pod_template(f)
    with pytest.raises(LauncherConfigError, match="cannot read it"):
        load_pod_template(tmp_path / "missing.yaml")


@pytest.mark.parametrize("status", [
    {},
    {"phase": "Pending"},
    {"phase": "Running", "containerStatuses": [{"name": "agent", "state": {"running": {}}}]},
    {"phase": "Pending", "containerStatuses": [{"name": "agent", "state": {"waiting": {"reason": "ContainerCreating"}}}]},
    {"phase": "Succeeded", "containerStatuses": [{"name": "agent", "state": {"terminated": {"exitCode": 0}}}]},
    {"phase": "Running", "initContainerStatuses": [{"name": "init", "state": {"terminated": {"exitCode": 0}}}]},
    {"conditions": [{"type": "PodScheduled", "status": "True"}]},
])
def test_a_healthy_or_starting_pod_is_no_failure(status):
    assert pod_failure({"status": status}) is None


def test_a_failed_init_container_and_an_earlier_oom_are_failures():
    assert pod_failure({"status": {"initContainerStatuses": [
        {"name": "fetch", "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": "no data"}}}]}}
    ) == "Error (container fetch, exit code 1): no data"
    assert pod_failure({"status": {"containerStatuses": [
        {"name": "agent", "state": {"running": {}}, "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}}
    ) == "OOMKilled (container agent, exit code 137)"


@pytest.mark.parametrize("extra, expected", [
    (["launcher.kubeconfig=/nonexistent/kubeconfig", "launcher.controller_address=controller.invalid:50051"],
     "cannot load Kubernetes credentials"),  # (the credentials fail first: nothing dials that address)
    (["launcher.kubeconfig=/nonexistent/kubeconfig"], "which a pod cannot reach"),
])
def test_a_cli_run_with_an_unusable_cluster_exits_2_with_one_sentence(tmp_path, extra, expected):
    import os
    import subprocess

    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-m", "controller.cli", "run", "launcher=kubernetes", "workers=2",
                        "model=mlp", "stop.updates=2", "progress=false", *extra, f"hydra.run.dir={tmp_path}"],
                       cwd=root, capture_output=True, text=True, timeout=180, env={**os.environ, "HYDRA_FULL_ERROR": "0"})
    assert p.returncode == 2, p.stderr
    assert "lockstep: invalid configuration:" in p.stderr and expected in p.stderr
    assert "Traceback" not in p.stderr


def test_an_unreachable_api_server_is_given_up_on_after_the_grace_counted_from_the_first_failed_listing(monkeypatch):
    # the grace started when the first listing had failed (each took 40 s: 3 tries of 10 s), and was checked at
    # the start of the next: launcher.api_error_grace_s=3 gave up after about 80 s
    import controller.launchers.kubernetes as kl
    from controller.launchers.base import AgentFailure

    clock = [1000.0]
    monkeypatch.setattr(kl.time, "monotonic", lambda: clock[0])
    timeouts = []

    class Hanging:
        def list_namespaced_pod(self, namespace, label_selector, _request_timeout):
            timeouts.append(_request_timeout)
            clock[0] += 3 * _request_timeout  # the client's three tries, each timing out
            raise OSError("timed out")

    launcher = KubernetesLauncher(typed(KubernetesLauncherConfig, {"kubeconfig": "/nonexistent",
                                                                   "api_error_grace_s": 3, "check_interval_s": 0}))
    launcher._core, launcher.pods, launcher.namespace, launcher._run_label = Hanging(), ["p0"], "lab", "r"
    with pytest.raises(AgentFailure, match=r"the Kubernetes API server has failed for 3s: timed out"):
        launcher.check()
    assert timeouts == [1.0]  # a third of the grace: a hanging request cannot outlast it by much

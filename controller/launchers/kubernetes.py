"""``launcher=kubernetes``: every agent is a pod created through the Kubernetes API (DESIGN §10).

The only module of lockstep that imports ``kubernetes``, and only when a launcher is built, so the
package works without it. In a cluster (the Helm chart's Job) the agent pods are owned by the
controller's pod, so Kubernetes garbage-collects them even if the controller dies; from a laptop
they are owned by the run's token Secret, so ``kubectl delete secret -l lockstep.io/run-id=RUN``
cleans up after a crash. ``check()`` turns what a kubelet or the scheduler reports (image pull
errors, OOM kills, crashes, unschedulable pods) into an ``AgentFailure`` naming the pod and why.

A lost agent pod (deleted, evicted, OOM-killed, its container terminated) is ``lost``: with
``recovery.agents=restart`` the controller stops the run's pods and starts a new set
(docs/recovery.md). Each set has names of its own (:func:`agent_pod_base`), so a pod still
terminating, or one a dead controller left behind, never blocks the next.
"""
from __future__ import annotations

import base64
import copy
import dataclasses
import hashlib
import logging
import os
import re
import time
from pathlib import Path
from typing import Any, Mapping

from controller.config.schema import KubernetesLauncherConfig
from controller.launchers.base import AgentFailure, LaunchSpec, LauncherConfigError, first_line

log = logging.getLogger(__name__)

INSTALL_HINT = "launcher=kubernetes needs the Kubernetes client: pip install 'lockstep[kubernetes]'"
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
AGENT_CONTAINER = "agent"

# Container "waiting" reasons that never clear without a human (a kubelet keeps retrying forever).
FATAL_WAITING_REASONS = frozenset({
    "ImagePullBackOff", "ErrImagePull", "ErrImageNeverPull", "InvalidImageName",
    "CrashLoopBackOff", "CreateContainerConfigError", "CreateContainerError", "RunContainerError",
})

# Restrictive defaults, merged under the pod template's own settings (a template that sets one field keeps
# the others: deep_merge, not setdefault). They meet Pod Security "restricted" (docs/kubernetes.md).
DEFAULT_POD_SECURITY_CONTEXT = {
    "runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001,
    "seccompProfile": {"type": "RuntimeDefault"},
}
DEFAULT_CONTAINER_SECURITY_CONTEXT = {
    "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
# With a read-only root filesystem everything lockstep, torch and matplotlib write goes to /tmp.
DEFAULT_ENV = {
    "HOME": "/tmp",
    "XDG_CACHE_HOME": "/tmp/.cache",
    "MPLCONFIGDIR": "/tmp/.cache/matplotlib",
    "LOCKSTEP_PROFILE_DB": "/tmp/lockstep-profile.db",
    "PYTHONDONTWRITEBYTECODE": "1",
}


class KubernetesLauncherError(RuntimeError):
    """The Kubernetes API refused or failed a request the launcher needs."""


class KubernetesStartRefused(KubernetesLauncherError, LauncherConfigError):
    """The API refused, or could not be reached for, what a start needs, before any agent ran (a namespace that
    does not exist, missing rights, the kubeconfig's server): the user's to fix, one sentence and exit 2."""


def _import_kubernetes():
    try:
        import kubernetes  # noqa: PLC0415 - the one place lockstep imports it, on purpose lazily
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return kubernetes


def dns_name(prefix: str, run_id: str, max_len: int = 48) -> str:
    """A DNS-1123 label ``prefix-<run_id>`` short enough to take a ``-agent-NNNN`` suffix.

    Characters Kubernetes refuses become ``-`` and capitals small ones; a run id that changed so (``exp_1``
    and ``exp-1``, ``Exp1`` and ``exp1`` would share a name) or that must be cut keeps a hash of itself, so
    two run ids always give different names.
    """
    clean = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-") or "run"
    name = f"{prefix}-{clean}"
    if len(name) > max_len or clean != run_id:
        digest = hashlib.sha1(run_id.encode()).hexdigest()[:8]
        name = name[: max_len - 9].rstrip("-") + "-" + digest
    return name


def agent_pod_base(run_id: str, incarnation: int = 0) -> str:
    """The name prefix of a run's agent pods and token Secret: ``lockstep-<run id>`` for the first set of
    agents, ``lockstep-<run id>-r<k>`` for the k-th set after it (a restart, or a resumed controller's),
    short enough for the ``-agent-NNNN`` suffix."""
    if not incarnation:
        return dns_name("lockstep", run_id)
    suffix = f"-r{incarnation}"
    return dns_name("lockstep", run_id, max_len=48 - len(suffix)) + suffix


def label_value(value: str) -> str:
    """``value`` made a valid label value: at most 63 of ``[A-Za-z0-9_.-]``, alphanumeric at both ends."""
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)
    if len(clean) > 63:
        clean = clean[:54] + "-" + hashlib.sha1(value.encode()).hexdigest()[:8]
    return clean.strip("-_.")


def load_pod_template(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a pod template: a Pod manifest, or just its ``spec``. Returns a Pod-shaped dict."""
    import yaml  # noqa: PLC0415 - only needed when a template is used

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise LauncherConfigError(f"launcher.pod_template_file {p}: cannot read it ({e})") from e
    except yaml.YAMLError as e:
        raise LauncherConfigError(f"launcher.pod_template_file {p}: not valid YAML ({e})") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise LauncherConfigError(
            f"launcher.pod_template_file {p}: expected a Pod manifest or a pod spec (a mapping), "
            f"got {type(data).__name__}")
    if data.get("kind", "Pod") != "Pod":
        raise LauncherConfigError(
            f"launcher.pod_template_file {p}: kind is {data['kind']!r}; only a Pod (or a bare pod spec) is accepted")
    if "spec" in data or "metadata" in data or "kind" in data:
        return data
    return {"spec": data}


def deep_merge(defaults: Mapping[str, Any], override: Mapping[str, Any] | None) -> dict[str, Any]:
    """``defaults`` with ``override`` on top, key by key down nested mappings (the override wins a leaf)."""
    out = copy.deepcopy(dict(defaults))
    for k, v in (override or {}).items():
        out[k] = deep_merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) \
            else copy.deepcopy(v)
    return out


def _merge_env(*layers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Env var lists merged by name; a later layer wins, first-seen order is kept."""
    merged: dict[str, dict[str, Any]] = {}
    for layer in layers:
        for var in layer:
            merged[var["name"]] = var
    return list(merged.values())


def build_agent_pod(
    spec: LaunchSpec,
    agent_id: int,
    *,
    name: str,
    namespace: str,
    image: str | None,
    image_pull_policy: str | None,
    instance: str,
    token_secret: tuple[str, str],
    owner_references: list[dict[str, Any]] | None = None,
    template: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Pod manifest of agent ``agent_id``: the template's settings plus what the launcher owns.

    The launcher owns the name, the lockstep labels, ownership, ``restartPolicy: Never`` and, on the
    container named ``agent``, the command and the LOCKSTEP_* environment. Everything else
    (resources, nodeSelector, tolerations, affinity, priorityClassName, securityContext, ...) comes
    from the template, with restrictive defaults where it is silent.
    """
    pod: dict[str, Any] = copy.deepcopy(dict(template or {}))
    pod["apiVersion"], pod["kind"] = "v1", "Pod"
    meta = {k: v for k, v in (pod.get("metadata") or {}).items()
            if k in ("labels", "annotations")}
    meta["name"], meta["namespace"] = name, namespace
    meta["labels"] = {
        **(meta.get("labels") or {}),
        "app.kubernetes.io/name": "lockstep",
        "app.kubernetes.io/component": "agent",
        "app.kubernetes.io/instance": label_value(instance),
        "app.kubernetes.io/managed-by": "lockstep",
        "lockstep.io/run-id": label_value(spec.run_id),
        "lockstep.io/agent-id": str(agent_id),
    }
    if owner_references:
        meta["ownerReferences"] = copy.deepcopy(owner_references)
    pod["metadata"] = meta
    pod.pop("status", None)

    pspec = pod.setdefault("spec", {}) or {}
    pod["spec"] = pspec
    pspec["restartPolicy"] = "Never"
    pspec.setdefault("automountServiceAccountToken", False)  # agents never call the API
    pspec.setdefault("enableServiceLinks", False)
    pspec["securityContext"] = deep_merge(DEFAULT_POD_SECURITY_CONTEXT, pspec.get("securityContext"))
    pspec.setdefault("terminationGracePeriodSeconds", 10)

    containers = pspec.setdefault("containers", [])
    agent = next((c for c in containers if c.get("name") == AGENT_CONTAINER), None)
    if agent is None:
        agent = {"name": AGENT_CONTAINER}
        containers.insert(0, agent)
    agent["image"] = image or agent.get("image")
    if not agent["image"]:
        raise LauncherConfigError(
            "no agent image: set launcher.image (e.g. launcher.image=registry/lockstep:0.1.0) "
            "or give the 'agent' container an image in launcher.pod_template_file")
    if image_pull_policy:
        agent["imagePullPolicy"] = image_pull_policy
    agent["command"] = spec.agent_argv(agent_id)
    agent.pop("args", None)
    agent["securityContext"] = deep_merge(DEFAULT_CONTAINER_SECURITY_CONTEXT, agent.get("securityContext"))
    if spec.metrics_port:  # metrics.agent_port: a named port a PodMonitor can scrape
        ports = [p for p in agent.get("ports") or [] if p.get("name") != "metrics"
                 and p.get("containerPort") != spec.metrics_port]
        agent["ports"] = [*ports, {"name": "metrics", "containerPort": spec.metrics_port, "protocol": "TCP"}]
    secret_name, secret_key = token_secret
    owned = [
        {"name": "LOCKSTEP_TOKEN",
         "valueFrom": {"secretKeyRef": {"name": secret_name, "key": secret_key}}},
        {"name": "LOCKSTEP_RUN_ID", "value": spec.run_id},
        {"name": "LOCKSTEP_POD_NAME",
         "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
    ]
    agent["env"] = _merge_env(
        [{"name": k, "value": v} for k, v in DEFAULT_ENV.items()],
        agent.get("env") or [],
        [{"name": k, "value": str(v)} for k, v in spec.extra_env.items()],
        owned,
    )
    # A writable /tmp for the read-only root filesystem, unless the template mounts one.
    mounts = agent.setdefault("volumeMounts", [])
    if not any(m.get("mountPath") == "/tmp" for m in mounts):
        mounts.append({"name": "lockstep-tmp", "mountPath": "/tmp"})
        pspec.setdefault("volumes", []).append({"name": "lockstep-tmp", "emptyDir": {}})
    return pod


def pod_failure(pod: Mapping[str, Any]) -> str | None:
    """Why a pod (API JSON, camelCase) can no longer run its agent, or None while it is healthy.

    Unschedulable is reported here too; the caller decides how long to tolerate it.
    """
    status = pod.get("status") or {}
    for cond in status.get("conditions") or []:
        if (cond.get("type") == "PodScheduled" and cond.get("status") == "False"
                and cond.get("reason") == "Unschedulable"):
            return _with_message("Unschedulable", cond.get("message"))
    statuses = (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
    for cs in statuses:
        container = cs.get("name", "?")
        state = cs.get("state") or {}
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in FATAL_WAITING_REASONS:
            return _with_message(f"{waiting['reason']} (container {container})", waiting.get("message"))
        for term in (state.get("terminated"), (cs.get("lastState") or {}).get("terminated")):
            if term and (term.get("reason") == "OOMKilled" or (term.get("exitCode") or 0) != 0):
                what = term.get("reason") or "Error"
                return _with_message(
                    f"{what} (container {container}, exit code {term.get('exitCode')})",
                    term.get("message"))
    if status.get("phase") == "Failed":
        return _with_message(status.get("reason") or "Failed", status.get("message"))
    return None


def pod_lost(pod: Mapping[str, Any]) -> bool:
    """Whether a failed pod lost an agent that was running — phase ``Failed`` (evicted, OOM-killed, an exit
    status) or its container terminated — rather than one that cannot start (its image, its config, no
    node): a new pod recovers the first (docs/recovery.md), not the second."""
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        return True
    return any((cs.get("state") or {}).get("terminated") for cs in status.get("containerStatuses") or [])


def _with_message(reason: str, message: str | None) -> str:
    return f"{reason}: {message.strip()}" if message and message.strip() else reason


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "0.0.0.0", "::", "::1") or host.startswith("127.")


class KubernetesLauncher:
    """Runs each agent as a pod; see the module docstring. ``cfg`` is the ``launcher`` config node.

    ``start`` may be called again after ``stop`` (a restart, docs/recovery.md): the new pods take the
    first set of names (:func:`agent_pod_base`) that no pod of the run holds, at least this launcher's
    own next one.
    """

    restartable = True

    def __init__(self, cfg: KubernetesLauncherConfig | None = None):
        self.cfg = cfg if cfg is not None else KubernetesLauncherConfig()
        self._k8s = _import_kubernetes()
        self._core = None  # CoreV1Api, made at start()
        self.namespace: str | None = None
        self.pods: list[str] = []  # names of the pods this launcher created (or tried to)
        self._secret: str | None = None  # the token Secret this launcher created, if any
        self._run_label: str | None = None
        self._started_at = 0.0
        self._api_error_since: float | None = None
        self._unschedulable_since: dict[str, float] = {}
        self._last_list = -float("inf")
        self._failure: AgentFailure | None = None
        self.job: str | None = None  # the Job owning the controller's pod (in the chart), told about a failure
        self.incarnation = -1  # the set of agents started last: 0 the first, k the k-th restart's (pod names)

    @property
    def loss_grace_s(self) -> float:
        """How long recovery waits for a kubelet to report a pod lost after a peer reported its broken stream."""
        return 5.0 + self.cfg.check_interval_s

    # --- the Launcher protocol -------------------------------------------------------------
    def start(self, spec: LaunchSpec) -> None:
        """Create the token Secret (unless one is configured) and ``spec.n_agents`` agent pods."""
        if self.pods or self._secret:
            raise KubernetesLauncherError("start() called twice; call stop() first")
        cfg = self.cfg
        address = cfg.controller_address or spec.controller_address
        if _is_loopback(address):
            raise LauncherConfigError(
                f"agents would dial {address}, which a pod cannot reach; set "
                "launcher.controller_address=HOST:PORT to an address of the controller that the "
                "cluster reaches (and controller.host=0.0.0.0 so it listens there)")
        spec = dataclasses.replace(spec, controller_address=address)
        template = load_pod_template(cfg.pod_template_file) if cfg.pod_template_file else None

        if self._core is None:
            self._connect()
        ns = self.namespace
        self._run_label = label_value(spec.run_id)
        instance = cfg.instance or spec.run_id
        self._failure, self._unschedulable_since, self._last_list = None, {}, -float("inf")
        try:
            self.incarnation = self._free_incarnation(spec)
            base = agent_pod_base(spec.run_id, self.incarnation)
            owners = self._owner_references()
            if cfg.token_secret.name:
                self._verify_token_secret(spec.token)
                secret = (cfg.token_secret.name, cfg.token_secret.key)
            else:
                created = self._create_token_secret(f"{base}-token", spec, instance, owners)
                secret = (created["metadata"]["name"], "token")
                if not owners:  # outside a cluster: the Secret owns the pods
                    owners = [{"apiVersion": "v1", "kind": "Secret", "name": created["metadata"]["name"],
                               "uid": created["metadata"]["uid"]}]
            self._started_at = time.monotonic()
            for i in range(spec.n_agents):
                body = build_agent_pod(
                    spec, i, name=f"{base}-agent-{i}", namespace=ns, image=cfg.image,
                    image_pull_policy=cfg.image_pull_policy and cfg.image_pull_policy.value, instance=instance,
                    token_secret=secret, owner_references=owners, template=template)
                name = body["metadata"]["name"]
                # Recorded before the call: a create that times out may still have happened.
                self.pods.append(name)
                try:
                    self._call(f"create pod {name}", self._core.create_namespaced_pod, ns, body)
                except KubernetesLauncherError as e:
                    if getattr(e.__cause__, "status", None) == 409:
                        self.pods.remove(name)  # someone else's pod of that name: never delete it
                    raise
        except BaseException as e:
            try:
                self.stop()
            except KubernetesLauncherError as cleanup:  # what was left; the cause is e, raised below
                log.warning("%s", cleanup)
            if isinstance(e, KubernetesLauncherError):  # refused or unreachable before any agent ran: the user's
                raise KubernetesStartRefused(str(e)) from e  # to fix (a namespace, rights, the kubeconfig's server)
            raise
        log.info("created %d agent pods %s-agent-N in namespace %s (run %s)", len(self.pods), base, ns, spec.run_id)

    def _free_incarnation(self, spec: LaunchSpec) -> int:
        """The first set of names, from this launcher's next, that no pod of the run in the namespace holds:
        pods of the previous set, or of a dead controller (terminating, or not yet garbage-collected)."""
        listed = self._call("list the run's pods", self._core.list_namespaced_pod, self.namespace,
                            label_selector=f"lockstep.io/run-id={self._run_label}")
        taken = {p.metadata.name for p in listed.items}
        k = self.incarnation + 1
        while any(f"{agent_pod_base(spec.run_id, k)}-agent-{i}" in taken for i in range(spec.n_agents)):
            k += 1
        return k

    def check(self) -> None:
        """Raise AgentFailure for the first agent pod that failed, vanished or never started.

        Cheap to call in a tight loop: the pods are listed at most every ``check_interval_s``, and a
        failure, once seen, is raised again on every later call.
        """
        if not self.pods:
            return
        if self._failure is not None:
            f = self._failure
            raise AgentFailure(f.agent, f.reason, f.log_tail, lost=f.lost)
        now = time.monotonic()
        if now - self._last_list < self.cfg.check_interval_s:
            return
        self._last_list = now
        try:
            self._check_pods(now)
        except AgentFailure as failure:
            self._failure = failure
            raise

    def log_tail(self, agent_id: int, lines: int = 20) -> str:
        """The last log lines of agent ``agent_id``'s pod ("" when it has none)."""
        if 0 <= agent_id < len(self.pods):
            return self._log_tail(self.pods[agent_id], lines)
        return ""

    def _check_pods(self, now: float) -> None:
        ApiException = self._k8s.client.exceptions.ApiException
        grace = self.cfg.api_error_grace_s
        try:  # a request that hangs (the client tries 3 times) counts against the grace, hence its timeout
            listed = self._core.list_namespaced_pod(
                self.namespace, label_selector=f"lockstep.io/run-id={self._run_label}",
                _request_timeout=min(10.0, max(1.0, grace / 3)))
        except (ApiException, OSError, self._urllib3_error()) as e:
            # A restarting API server must not kill a long run; a gone one must not hang it.
            if self._api_error_since is None:
                self._api_error_since = now  # when the first failed listing began, not when it gave up
            down = time.monotonic() - self._api_error_since
            log.warning("listing agent pods failed (%.0fs so far): %s", down, e)
            if down >= grace:
                raise AgentFailure(
                    "all", f"the Kubernetes API server has failed for {down:.0f}s: {e}") from e
            return
        self._api_error_since = None
        to_json = self._core.api_client.sanitize_for_serialization
        by_name = {p.metadata.name: to_json(p) for p in listed.items}
        for name in self.pods:
            pod = by_name.get(name)
            if pod is None or (pod.get("metadata") or {}).get("deletionTimestamp"):
                raise AgentFailure(name, "the pod was deleted before the run finished", lost=True)
            reason = pod_failure(pod)
            if reason and reason.startswith("Unschedulable"):
                since = self._unschedulable_since.setdefault(name, now)
                if now - since < self.cfg.unschedulable_grace_s:
                    continue
            if reason:
                raise AgentFailure(name, reason, self._log_tail(name), lost=pod_lost(pod))
            self._unschedulable_since.pop(name, None)
            phase = (pod.get("status") or {}).get("phase") or "Pending"
            if phase == "Pending" and now - self._started_at > self.cfg.startup_timeout_s:
                raise AgentFailure(
                    name, f"still Pending after {self.cfg.startup_timeout_s:.0f}s "
                          f"(launcher.startup_timeout_s){_pending_detail(pod)}")

    def stop(self, restart: bool = False) -> None:
        """Delete every agent pod of the run and the Secret it created; idempotent. (``restart``: the next
        pods take new names, so nothing waits for these to be gone.)"""
        if self._core is None:
            return
        ApiException = self._k8s.client.exceptions.ApiException
        errors = []
        grace = self.cfg.delete_grace_period_s
        for name in self.pods:
            try:
                self._core.delete_namespaced_pod(
                    name, self.namespace, grace_period_seconds=grace,
                    propagation_policy="Background", _request_timeout=10)
            except ApiException as e:
                if e.status != 404:
                    errors.append(f"pod {name}: {e.status} {e.reason}")
            except (OSError, self._urllib3_error()) as e:
                errors.append(f"pod {name}: {e}")
        if self._secret:
            try:
                self._core.delete_namespaced_secret(self._secret, self.namespace, _request_timeout=10)
            except ApiException as e:
                if e.status != 404:
                    errors.append(f"secret {self._secret}: {e.status} {e.reason}")
            except (OSError, self._urllib3_error()) as e:
                errors.append(f"secret {self._secret}: {e}")
        self.pods, self._secret, self._failure = [], None, None
        if errors:
            raise KubernetesLauncherError(
                f"could not delete everything in namespace {self.namespace} "
                f"(left for garbage collection through the owner): {'; '.join(errors)}")

    # --- helpers ---------------------------------------------------------------------------
    def _urllib3_error(self):
        import urllib3  # noqa: PLC0415 - a dependency of kubernetes

        return urllib3.exceptions.HTTPError

    def _connect(self) -> None:
        k8s, cfg = self._k8s, self.cfg
        in_cluster = (cfg.kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ
                      and (SERVICE_ACCOUNT_DIR / "token").exists())
        try:
            if in_cluster:
                conf = k8s.client.Configuration()
                k8s.config.load_incluster_config(client_configuration=conf)
                api = k8s.client.ApiClient(conf)
            else:
                api = k8s.config.new_client_from_config(config_file=cfg.kubeconfig, context=cfg.context)
        except (k8s.config.ConfigException, OSError) as e:
            where = cfg.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
            raise LauncherConfigError(
                f"cannot load Kubernetes credentials (launcher.kubeconfig={where}, "
                f"context={cfg.context or 'current'}): {e}") from e
        self._core = k8s.client.CoreV1Api(api)
        self.namespace = cfg.namespace or self._default_namespace(in_cluster)

    def _default_namespace(self, in_cluster: bool) -> str:
        ns_file = SERVICE_ACCOUNT_DIR / "namespace"
        if in_cluster and ns_file.exists():
            return ns_file.read_text().strip()
        try:
            contexts, active = self._k8s.config.list_kube_config_contexts(config_file=self.cfg.kubeconfig)
        except (self._k8s.config.ConfigException, OSError):
            return "default"
        ctx = next((c for c in contexts if c["name"] == self.cfg.context), active) if self.cfg.context else active
        return ((ctx or {}).get("context") or {}).get("namespace") or "default"

    def _call(self, what: str, fn, *args, **kwargs):
        ApiException = self._k8s.client.exceptions.ApiException
        try:
            return fn(*args, _request_timeout=30, **kwargs)
        except ApiException as e:
            raise KubernetesLauncherError(
                f"Kubernetes refused to {what} in namespace {self.namespace}: "
                f"{e.status} {e.reason}: {_api_message(e)}") from e
        except (OSError, self._urllib3_error()) as e:
            raise KubernetesLauncherError(
                f"the Kubernetes API server could not be reached to {what}: {first_line(e)}") from e

    def _owner_references(self) -> list[dict[str, Any]]:
        owner = self.cfg.owner_pod or os.environ.get("LOCKSTEP_POD_NAME") or os.environ.get("POD_NAME")
        if not owner:
            return []
        ApiException = self._k8s.client.exceptions.ApiException
        try:
            pod = self._core.read_namespaced_pod(owner, self.namespace, _request_timeout=30)
        except ApiException as e:
            if e.status == 404:
                raise LauncherConfigError(
                    f"owner pod {owner!r} (launcher.owner_pod or $LOCKSTEP_POD_NAME) is not in namespace "
                    f"{self.namespace}; agent pods can only be owned by a pod of their own namespace") from e
            raise KubernetesLauncherError(
                f"cannot read owner pod {owner} in {self.namespace}: {e.status} {e.reason}") from e
        self.job = next((r.name for r in pod.metadata.owner_references or []
                         if r.kind == "Job" and (r.api_version or "").startswith("batch/")), None)
        return [{"apiVersion": "v1", "kind": "Pod", "name": owner, "uid": pod.metadata.uid,
                 "controller": True}]

    def report_failure(self, reason: str, message: str) -> None:
        """Put the run's one-line failure on the controller's Job: condition ``RunFailed`` (``kubectl get job
        -o jsonpath='{.status.conditions[?(@.type=="RunFailed")].message}'``). Best effort: the log has it too."""
        if self._core is None or not self.job:
            return
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {"status": {"conditions": [{
            "type": "RunFailed", "status": "True", "reason": reason, "message": message,
            "lastProbeTime": now, "lastTransitionTime": now}]}}
        try:
            batch = self._k8s.client.BatchV1Api(self._core.api_client)
            batch.patch_namespaced_job_status(self.job, self.namespace, body, _request_timeout=10,
                                              _content_type="application/strategic-merge-patch+json")
        except Exception as e:  # noqa: BLE001 - reporting must never hide the failure itself
            log.warning("could not set condition RunFailed on Job %s: %s", self.job, e)

    def _verify_token_secret(self, token: str) -> None:
        """Fail early when the configured Secret is missing or holds a different token than the controller's."""
        name, key = self.cfg.token_secret.name, self.cfg.token_secret.key
        ApiException = self._k8s.client.exceptions.ApiException
        try:
            secret = self._core.read_namespaced_secret(name, self.namespace, _request_timeout=30)
        except ApiException as e:
            if e.status == 404:
                raise LauncherConfigError(
                    f"launcher.token_secret.name={name}: no such Secret in namespace {self.namespace}") from e
            if e.status == 403:
                log.warning("may not read Secret %s to check the token; trusting it", name)
                return
            raise KubernetesLauncherError(f"cannot read Secret {name}: {e.status} {e.reason}") from e
        stored = (secret.data or {}).get(key)
        if stored is None:
            raise LauncherConfigError(
                f"Secret {name} in namespace {self.namespace} has no key {key!r} "
                f"(launcher.token_secret.key); keys: {sorted(secret.data or {})}")
        if base64.b64decode(stored).decode() != token:
            raise LauncherConfigError(
                f"Secret {name}/{key} holds a different token than the controller's; the controller "
                "must take its token from the same Secret (env LOCKSTEP_TOKEN)")

    def _create_token_secret(self, name: str, spec: LaunchSpec, instance: str,
                             owners: list[dict[str, Any]]) -> dict[str, Any]:
        body = {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {
                "name": name, "namespace": self.namespace,
                "labels": {"app.kubernetes.io/name": "lockstep",
                           "app.kubernetes.io/component": "agent-token",
                           "app.kubernetes.io/instance": label_value(instance),
                           "app.kubernetes.io/managed-by": "lockstep",
                           "lockstep.io/run-id": label_value(spec.run_id)},
                **({"ownerReferences": owners} if owners else {}),
            },
            "stringData": {"token": spec.token},
        }
        created = self._call(f"create Secret {name}", self._core.create_namespaced_secret,
                             self.namespace, body)
        self._secret = name
        return self._core.api_client.sanitize_for_serialization(created)

    def _log_tail(self, name: str, lines: int = 20) -> str:
        """The agent container's last log lines, or "" when there are none (it never started)."""
        try:
            return self._core.read_namespaced_pod_log(
                name, self.namespace, container=AGENT_CONTAINER, tail_lines=lines,
                _request_timeout=5) or ""
        except Exception as e:  # noqa: BLE001 - logs are a courtesy; the failure itself is reported
            log.debug("no log for pod %s: %s", name, e)
            return ""


def _pending_detail(pod: Mapping[str, Any]) -> str:
    status = pod.get("status") or {}
    for cs in status.get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            return f"; container {cs.get('name')} waiting: " + _with_message(waiting["reason"], waiting.get("message"))
    if not (pod.get("spec") or {}).get("nodeName"):
        return "; not scheduled to a node"
    return ""


def _api_message(e: Exception) -> str:
    import json  # noqa: PLC0415

    body = getattr(e, "body", None)
    try:
        return json.loads(body).get("message", body)
    except (TypeError, ValueError, AttributeError):
        return str(body)


# --- for lockstep sweep and fetch (controller/cluster.py), which reach the API only through here ---
def api_errors() -> tuple[type[BaseException], ...]:
    """What the kubernetes client raises for a refused request or an API server it cannot reach."""
    try:
        import urllib3  # noqa: PLC0415 - a dependency of kubernetes
        from kubernetes.client.exceptions import ApiException  # noqa: PLC0415
    except ImportError:
        return ()
    return ApiException, urllib3.exceptions.HTTPError


def api_sentence(e: BaseException) -> str:
    """One sentence for a request the API refused (403 Forbidden: pods is forbidden ...) or never answered."""
    if getattr(e, "status", None) is not None:
        return f"the Kubernetes API refused a request: {e.status} {e.reason}: {_api_message(e)}"  # type: ignore
    return f"the Kubernetes API server cannot be reached: {first_line(e)}"


def connect(kubeconfig: str | None = None, context: str | None = None,
            namespace: str | None = None) -> tuple[Any, Any, str]:
    """(CoreV1Api, BatchV1Api, namespace) from a kubeconfig; the namespace defaults to the context's."""
    k8s = _import_kubernetes()
    try:
        api = k8s.config.new_client_from_config(config_file=kubeconfig, context=context)
        contexts, active = k8s.config.list_kube_config_contexts(config_file=kubeconfig)
    except (k8s.config.ConfigException, OSError) as e:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise LauncherConfigError(f"cannot load Kubernetes credentials (kubeconfig {where}, "
                                  f"context {context or 'current'}): {e}") from e
    ctx = next((c for c in contexts if c["name"] == context), active) if context else active
    ns = namespace or ((ctx or {}).get("context") or {}).get("namespace") or "default"
    return k8s.client.CoreV1Api(api), k8s.client.BatchV1Api(api), ns


def exec_in_pod(core: Any, pod: str, namespace: str, container: str, command: list[str]) -> tuple[str, str, int]:
    """Run ``command`` in a running pod through the API (what ``kubectl exec`` does): stdout, stderr, exit code."""
    from kubernetes.stream import stream  # noqa: PLC0415

    resp = stream(core.connect_get_namespaced_pod_exec, pod, namespace, container=container, command=command,
                  stdout=True, stderr=True, stdin=False, tty=False, _preload_content=False)
    out, err = [], []
    while resp.is_open():
        resp.update(timeout=5)
        if resp.peek_stdout():
            out.append(resp.read_stdout())
        if resp.peek_stderr():
            err.append(resp.read_stderr())
    resp.close()
    return "".join(out), "".join(err), resp.returncode or 0

"""Fixtures for the Kubernetes tests: a real ``helm`` and a real kube-apiserver + etcd on 127.0.0.1.

The cluster is an API server, its etcd and a kube-controller-manager running only the garbage
collector, service-account and namespace controllers. **No kubelet and no scheduler run**: objects
are created, validated, stored, authorized by RBAC and garbage-collected for real, but no container
ever starts and no pod is ever scheduled. A test that needs a pod to fail patches the pod's status
through the API, as a kubelet would.

The binaries come from ``scripts/build-k8s.sh`` and ``scripts/install-helm.sh`` (``make test`` runs
both). Without them the tests skip with the reason, except under CI (``CI=true``), where a missing
binary is a failure: CI builds them.
"""
from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

import pytest
import yaml

from tests import helpers

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "lockstep"
CACHE = Path(os.environ.get("LOCKSTEP_CACHE", Path.home() / ".cache" / "lockstep"))
K8S_BIN = Path(os.environ.get("LOCKSTEP_K8S_CACHE", CACHE / "k8s")) / "bin"
HELM_BIN_DIR = Path(os.environ.get("LOCKSTEP_BIN_CACHE", CACHE / "bin"))

T = TypeVar("T")


def _missing(reason: str) -> None:
    """Skip on a developer's machine; fail under CI, which builds the binaries before the tests."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(reason + " (CI builds it in scripts/test-deps.sh; that step must have failed)")
    pytest.skip(reason)


def wait_until(predicate: Callable[[], T], **kw) -> T:
    """tests.helpers.wait_until, counting any error as "not yet": servers refuse connections until they are up."""
    return helpers.wait_until(predicate, tolerate=(Exception,), **kw)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- helm ------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def helm_bin() -> Path:
    for candidate in (os.environ.get("LOCKSTEP_HELM"), HELM_BIN_DIR / "helm", shutil.which("helm")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    _missing(f"helm not found in {HELM_BIN_DIR} or PATH: run scripts/install-helm.sh")


@pytest.fixture(scope="session")
def helm(helm_bin: Path, tmp_path_factory: pytest.TempPathFactory):
    """``helm(*args)`` → CompletedProcess, with helm's own config and cache in a temp dir."""
    home = tmp_path_factory.mktemp("helm-home")
    env = {**os.environ, "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_CACHE_HOME": str(home / "cache"), "HELM_DATA_HOME": str(home / "data")}
    env.pop("KUBECONFIG", None)

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([str(helm_bin), *args], env=env, capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
        return proc

    return run


def render(helm, *args: str, release: str = "exp1", namespace: str = "lab") -> list[dict]:
    """``helm template`` the chart; the manifests as dicts (empty documents dropped)."""
    out = helm("template", release, str(CHART), "--namespace", namespace, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


# --- a real API server -----------------------------------------------------------------------
class Server:
    """A server process whose output goes to a log file, so a failure can show its tail."""

    def __init__(self, name: str, argv: list[str], log: Path):
        self.name, self.log = name, log
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(argv, stdout=self._log_file, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)

    def tail(self, lines: int = 25) -> str:
        text = self.log.read_text(errors="replace").splitlines()
        return f"--- last lines of {self.log} ---\n" + "\n".join(text[-lines:])

    def assert_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited with code {self.proc.returncode}\n{self.tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log_file.close()


@dataclass
class KubeCluster:
    server: str
    token: str
    ca_file: Path
    kubeconfig: Path
    workdir: Path
    controller_manager: Server | None = None

    def api_client(self, token: str | None = None):
        from kubernetes import client

        conf = client.Configuration()
        conf.host = self.server
        conf.ssl_ca_cert = str(self.ca_file)
        conf.api_key = {"authorization": f"Bearer {token or self.token}"}
        return client.ApiClient(conf)

    def core(self):
        from kubernetes import client

        return client.CoreV1Api(self.api_client())

    def write_kubeconfig(self, path: Path, token: str, namespace: str | None = None) -> Path:
        context = {"cluster": "lockstep-test", "user": "tester"}
        if namespace:
            context["namespace"] = namespace
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "lockstep-test",
            "clusters": [{"name": "lockstep-test", "cluster": {
                "server": self.server, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "tester", "user": {"token": token}}],
            "contexts": [{"name": "lockstep-test", "context": context}],
        }))
        return path


def _readyz(server: str, token: str, ca_file: Path) -> bool:
    if not ca_file.exists():  # the API server writes its self-signed certificate at start
        return False
    ctx = ssl.create_default_context(cafile=str(ca_file))
    req = urllib.request.Request(server + "/readyz", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory):
    """etcd + kube-apiserver (RBAC, token auth) + kube-controller-manager (GC), all on 127.0.0.1."""
    apiserver, kcm = K8S_BIN / "kube-apiserver", K8S_BIN / "kube-controller-manager"
    etcd = shutil.which("etcd")
    for path, hint in ((apiserver, "scripts/build-k8s.sh"), (kcm, "scripts/build-k8s.sh")):
        if not path.is_file():
            _missing(f"{path} is not built: run {hint} (about 10 minutes once, then cached)")
    if not etcd:
        _missing("etcd not found: install Debian's etcd-server (scripts/build-k8s.sh does)")
    if not shutil.which("openssl"):
        _missing("openssl not found: it makes the service-account keys")

    work = tmp_path_factory.mktemp("kube")
    token = uuid.uuid4().hex
    (work / "tokens.csv").write_text(f'{token},admin,admin-uid,"system:masters"\n')
    subprocess.run(["openssl", "genrsa", "-out", str(work / "sa.key"), "2048"], check=True, capture_output=True)
    subprocess.run(["openssl", "rsa", "-in", str(work / "sa.key"), "-pubout", "-out", str(work / "sa.pub")],
                   check=True, capture_output=True)

    servers: list[Server] = []
    try:
        client_port, peer_port = free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        servers.append(Server("etcd", [
            etcd, "--name", "lockstep-test", "--data-dir", str(work / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"lockstep-test={peer_url}",
        ], work / "etcd.log"))

        def etcd_healthy() -> bool:
            servers[0].assert_alive()
            with urllib.request.urlopen(etcd_url + "/health", timeout=2) as resp:
                return b'"true"' in resp.read()

        wait_until(etcd_healthy, timeout=30, what="etcd /health", on_timeout=servers[0].tail)

        port = free_port()
        server = f"https://127.0.0.1:{port}"
        ca_file = work / "certs" / "apiserver.crt"
        servers.append(Server("kube-apiserver", [
            str(apiserver), "--etcd-servers", etcd_url,
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
            f"--cert-dir={work / 'certs'}", f"--token-auth-file={work / 'tokens.csv'}",
            "--authorization-mode=RBAC",
            f"--service-account-key-file={work / 'sa.pub'}",
            f"--service-account-signing-key-file={work / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc",
            "--service-cluster-ip-range=10.96.0.0/24",
            "--enable-priority-and-fairness=false", "--profiling=false",
        ], work / "kube-apiserver.log"))

        def api_ready() -> bool:
            servers[1].assert_alive()
            return _readyz(server, token, ca_file)

        wait_until(api_ready, timeout=90, what="kube-apiserver /readyz", interval=0.2,
                   on_timeout=servers[1].tail)

        cluster = KubeCluster(server=server, token=token, ca_file=ca_file,
                              kubeconfig=work / "admin.kubeconfig", workdir=work)
        cluster.write_kubeconfig(cluster.kubeconfig, token)
        servers.append(Server("kube-controller-manager", [
            str(kcm), f"--kubeconfig={cluster.kubeconfig}",
            "--controllers=garbagecollector,serviceaccount,namespace",
            "--leader-elect=false", "--port=0", "--secure-port=0",
            "--use-service-account-credentials=false",
        ], work / "kube-controller-manager.log"))
        cluster.controller_manager = servers[2]
        yield cluster
    finally:
        # Controllers first, then the API server, then its storage.
        for srv in reversed(servers):
            srv.stop()


@pytest.fixture
def namespace(kube_cluster: KubeCluster, request: pytest.FixtureRequest):
    """A fresh namespace, once the service-account controller has made its default ServiceAccount."""
    core = kube_cluster.core()
    name = "t-" + uuid.uuid4().hex[:10]
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def default_sa() -> bool:
        kube_cluster.controller_manager.assert_alive()
        return bool(core.list_namespaced_service_account(name, field_selector="metadata.name=default").items)

    wait_until(default_sa, timeout=60, what=f"ServiceAccount default in namespace {name}",
               on_timeout=kube_cluster.controller_manager.tail)
    yield name
    core.delete_namespace(name)

"""``lockstep sweep --kubernetes`` and ``lockstep fetch`` against the real API server and the real helm.

No kubelet and no job controller run (conftest.py): Jobs are stored but never start pods, so where
a test needs a point to end or its controller pod to fail, it patches the status through the API as
the job controller or a kubelet would. ``fetch`` reads a volume through the API's exec, which the
kubelet serves: here a stand-in copies from a local directory that plays the claim's contents.
"""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import kubernetes_validate
import pytest

from controller import cluster as cl
from .conftest import CHART, REPO, KubeCluster, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def lockstep(helm_bin: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{helm_bin.parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("KUBECONFIG", None)
    return subprocess.run([sys.executable, "-m", "controller.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def kube_args(kube_cluster: KubeCluster, namespace: str) -> list[str]:
    return ["--namespace", namespace, "--kubeconfig", str(kube_cluster.kubeconfig)]


def sweep_jobs(kube_cluster: KubeCluster, namespace: str, sweep: str) -> list:
    from kubernetes import client

    jobs = client.BatchV1Api(kube_cluster.api_client()).list_namespaced_job(
        namespace, label_selector=f"lockstep.io/sweep={sweep}").items
    return sorted(jobs, key=lambda j: int(j.metadata.labels["lockstep.io/point"]))


def job_arg(job, key: str) -> str:
    [value] = [a.split("=", 1)[1] for a in job.spec.template.spec.containers[0].args if a.startswith(key + "=")]
    return value


def test_a_three_point_sweep_creates_three_jobs_with_distinct_names_and_one_sweep_directory(
        helm_bin, kube_cluster, namespace):
    proc = lockstep(helm_bin, "sweep", "--kubernetes", "--name", "lr-sweep", "--no-wait",
                    *kube_args(kube_cluster, namespace), "lr=0.1,0.01,0.001", "workers=8")
    assert proc.returncode == 0, proc.stderr
    jobs = sweep_jobs(kube_cluster, namespace, "lr-sweep")
    names = [j.metadata.name for j in jobs]
    assert len(names) == 3 and len(set(names)) == 3 and all(len(n) <= 63 for n in names)
    releases = [j.metadata.labels["app.kubernetes.io/instance"] for j in jobs]
    assert [job_arg(j, "lr") for j in jobs] == ["0.1", "0.01", "0.001"]
    assert {job_arg(j, "workers") for j in jobs} == {"8"}
    run_dirs = [job_arg(j, "hydra.run.dir") for j in jobs]
    assert run_dirs == [f"/results/lr-sweep/{r}" for r in releases]  # one sweep directory, a run each
    assert [job_arg(j, "run_id") for j in jobs] == releases
    for j, r in zip(jobs, releases):
        assert f"point {j.metadata.labels['lockstep.io/point']} -> release {r}" in proc.stdout


def test_a_values_files_experiment_overrides_go_first_in_every_point_and_a_set_of_them_is_refused(
        helm_bin, kube_cluster, namespace, tmp_path):
    # helm replaces a list: each point's values file (after the user's -f) dropped the user's overrides, and a
    # --set of them (after it) replaced every point's own, so every release ran the same experiment
    values = tmp_path / "mine.yaml"
    values.write_text("experiment:\n  overrides: [workers=8, model=mlp]\n")
    proc = lockstep(helm_bin, "sweep", "--kubernetes", "--name", "mine", "--no-wait", "-f", str(values),
                    *kube_args(kube_cluster, namespace), "lr=0.1,0.01")
    assert proc.returncode == 0, proc.stderr
    jobs = sweep_jobs(kube_cluster, namespace, "mine")
    assert [job_arg(j, "lr") for j in jobs] == ["0.1", "0.01"]
    assert [(job_arg(j, "workers"), job_arg(j, "model")) for j in jobs] == [("8", "mlp")] * 2
    assert "point 0 -> release" in proc.stdout and "workers=8 model=mlp lr=0.1" in proc.stdout
    proc = lockstep(helm_bin, "sweep", "--kubernetes", "--name", "mine2", *kube_args(kube_cluster, namespace),
                    "--set", "experiment.overrides={workers=64}", "lr=0.1,0.01")
    assert proc.returncode == 2 and proc.stderr.startswith(
        "lockstep sweep: --set experiment.overrides={workers=64}: every point sets experiment.overrides, so this "
        "would replace the point's own overrides in every release; accepted: "), proc.stderr
    assert sweep_jobs(kube_cluster, namespace, "mine2") == []


def test_the_sweep_reports_each_point_and_a_controller_that_cannot_pull_its_image(helm_bin, kube_cluster, namespace):
    assert lockstep(helm_bin, "sweep", "--kubernetes", "--name", "seeds", "--no-wait",
                    *kube_args(kube_cluster, namespace), "seed=1,2,3").returncode == 0
    jobs = sweep_jobs(kube_cluster, namespace, "seeds")
    from kubernetes import client

    batch, core = client.BatchV1Api(kube_cluster.api_client()), kube_cluster.core()
    for job in jobs[:2]:  # what the job controller writes when the controller pod succeeded
        batch.patch_namespaced_job_status(job.metadata.name, namespace, {"status": {
            "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}})
    # the third point's controller pod (a stand-in: no job controller creates it) cannot pull its image
    bad = jobs[2].metadata.name
    core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": f"{bad}-x7k2p", "labels": {"job-name": bad}}, "spec": {"automountServiceAccountToken": False, "containers": [
            {"name": "controller", "image": "lockstep:0.1.0"}]}})
    core.patch_namespaced_pod_status(f"{bad}-x7k2p", namespace, {"status": {"phase": "Pending", "containerStatuses": [{
        "name": "controller", "image": "lockstep:0.1.0", "imageID": "", "ready": False, "restartCount": 0,
        "state": {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "lockstep:0.1.0"'}}}]}})

    proc = lockstep(helm_bin, "sweep", "--kubernetes", "--name", "seeds", "--watch", "--timeout", "60",
                    *kube_args(kube_cluster, namespace))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    release = jobs[2].metadata.labels["app.kubernetes.io/instance"]
    assert (f"lockstep sweep seeds: point 2 ({bad}) failed: controller pod {bad}-x7k2p cannot run: ImagePullBackOff "
            f'(container controller): Back-off pulling image "lockstep:0.1.0"; remove it with: helm uninstall '
            f"{release}") in lines
    assert lines[-1] == "lockstep sweep seeds: 3/3 points: 2 done, 1 failed, 0 running, 0 pending"


def test_a_sweep_name_in_use_is_refused_before_installing_anything(helm_bin, kube_cluster, namespace):
    # point 0 was installed beside the old sweep's releases, then helm refused point 1: a half sweep
    assert lockstep(helm_bin, "sweep", "--kubernetes", "--name", "lr", "--no-wait",
                    *kube_args(kube_cluster, namespace), "lr=0.1,0.01").returncode == 0
    releases = sorted(j.metadata.labels["app.kubernetes.io/instance"] for j in sweep_jobs(kube_cluster, namespace, "lr"))
    proc = lockstep(helm_bin, "sweep", "--kubernetes", "--name", "lr", "--no-wait",
                    *kube_args(kube_cluster, namespace), "lr=0.5,0.01", "model=mlp")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"lockstep sweep: --name lr: a sweep of that name has 2 release(s) in namespace "
                           f"{namespace} ({', '.join(releases)}); accepted: another --name, or remove them first "
                           f"(helm uninstall -n {namespace} {' '.join(releases)})\n")
    assert sorted(j.metadata.labels["app.kubernetes.io/instance"]
                  for j in sweep_jobs(kube_cluster, namespace, "lr")) == releases


def test_the_sweep_refuses_a_bad_point_before_installing_anything(helm_bin, kube_cluster, namespace):
    proc = lockstep(helm_bin, "sweep", "--kubernetes", "--name", "bad", *kube_args(kube_cluster, namespace),
                    "lr=0.1,-1")
    assert proc.returncode == 2
    assert proc.stderr == "lockstep sweep: point 1 (lr=-1): lr=-1 is not valid; accepted: a number > 0.\n"
    assert sweep_jobs(kube_cluster, namespace, "bad") == []


def test_an_api_server_that_does_not_answer_is_one_sentence_for_fetch_and_sweep(tmp_path):
    # a traceback (urllib3's MaxRetryError, or the client's ForbiddenException) with exit 1 before
    nowhere = tmp_path / "kubeconfig"
    nowhere.write_text("apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters: [{name: k, cluster: {server: "
                       "'http://127.0.0.1:1'}}]\ncontexts: [{name: c, context: {cluster: k, user: u}}]\n"
                       "users: [{name: u, user: {token: x}}]\n")
    for args, prefix in ((["fetch", "-n", "lab", "--kubeconfig", str(nowhere), "exp1", str(tmp_path / "out")],
                          "lockstep fetch: "),
                         (["sweep", "--kubernetes", "--name", "s", "--watch", "-n", "lab", "--kubeconfig", str(nowhere)],
                          "lockstep sweep: ")):
        p = subprocess.run([sys.executable, "-m", "controller.cli", *args], cwd=REPO, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 2, p.stderr
        assert p.stderr.startswith(prefix + "the Kubernetes API server cannot be reached: ") and \
            p.stderr.count("\n") == 1, p.stderr


def test_watch_ends_when_a_points_job_is_deleted_before_it_ended():
    # it waited for the deleted point until --timeout (a day by default)
    def job(name: str, point: int, complete: bool) -> dict:
        conds = [{"type": "Complete", "status": "True"}] if complete else []
        return {"metadata": {"name": name, "labels": {"lockstep.io/point": str(point)}}, "status": {"conditions": conds}}

    class Listing:  # the API as the watch sees it: the second point's Job is uninstalled while it is pending
        def __init__(self):
            self.calls = 0

        def jobs(self, selector):
            self.calls += 1
            return [job("a", 0, self.calls > 1)] + ([job("b", 1, False)] if self.calls == 1 else [])

        def pods(self, selector):
            return []

    lines: list[str] = []
    code = cl.watch(Listing(), "s", 2, timeout_s=30, interval_s=0, out=lines.append)
    assert code == 1
    assert lines == ["lockstep sweep s: 2/2 points: 0 done, 0 failed, 0 running, 2 pending",
                     "lockstep sweep s: point 1 (b) gone: its Job was deleted before it ended (helm uninstall?)",
                     "lockstep sweep s: point 0 (a) done",
                     "lockstep sweep s: 2/2 points: 1 done, 0 failed, 0 running, 0 pending, 1 gone"]


def test_sweep_names_are_hashed_dns_labels_that_stay_unique_when_cut():
    long = "a-very-long-sweep-name-for-learning-rates"
    a, b = cl.release_name(long, ["lr=0.1", "seed=1"]), cl.release_name(long, ["lr=0.1", "seed=2"])
    assert a != b and a[:-9] == b[:-9] and len(a) <= 40 and cl.DNS_LABEL.match(a)
    assert cl.expand(["lr=0.1,0.01", "seed=range(1,3)", "workers=8"]) == [
        ["lr=0.1", "seed=1", "workers=8"], ["lr=0.1", "seed=2", "workers=8"],
        ["lr=0.01", "seed=1", "workers=8"], ["lr=0.01", "seed=2", "workers=8"]]
    assert cl.expand(["+experiment=a,b", "x='1,2'"]) == [["+experiment=a", "x='1,2'"], ["+experiment=b", "x='1,2'"]]
    with pytest.raises(cl.SweepError, match="hydra settings are the chart's"):
        cl.expand(["hydra.run.dir=/x"])


# --- fetch -------------------------------------------------------------------------------
def _volume(tmp_path: Path, run_dir: str, updates: int) -> Path:
    """The claim's contents as the controller left them: <mountPath>/... -> a local directory."""
    root = tmp_path / "volume"
    d = root / run_dir.lstrip("/").split("/", 1)[1]
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({"complete": True, "updates": updates}))
    (d / "metrics.csv").write_text("virtual_time_ns,loss\n1,2.0\n")
    return root


class StandInKubelet:
    """Marks the fetch reader pods Running and serves their exec as a tar of the local volume."""

    def __init__(self, core, namespace: str, volume: Path, mount_path: str = "/results"):
        self.core, self.namespace, self.volume, self.mount = core, namespace, volume, mount_path
        self.pods: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self):
        while not self._stop.is_set():
            for pod in self.core.list_namespaced_pod(self.namespace,
                                                     label_selector="app.kubernetes.io/component=fetch").items:
                if pod.status.phase != "Running" and not pod.metadata.deletion_timestamp:
                    self.pods.append(self.core.api_client.sanitize_for_serialization(pod))
                    self.core.patch_namespaced_pod_status(pod.metadata.name, self.namespace,
                                                          {"status": {"phase": "Running"}})
            self._stop.wait(0.1)

    def copy(self, cluster, pod: str, container: str, path: str, arcname: str) -> bytes:
        assert (pod, container) == (self.pods[-1]["metadata"]["name"], "fetch")
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as t:
            t.add(self.volume / Path(path).relative_to(self.mount), arcname=arcname)
        return buf.getvalue()


def test_fetch_copies_a_releases_run_directory_through_a_reader_pod_that_mounts_its_claim(
        helm, kube_cluster, namespace, tmp_path, capsys):
    helm("install", "exp1", str(CHART), "--namespace", namespace, "--kubeconfig", str(kube_cluster.kubeconfig))
    core = kube_cluster.core()
    volume = _volume(tmp_path, "/results/exp1", 300)
    with StandInKubelet(core, namespace, volume) as kubelet:
        code = cl.fetch_main(["exp1", str(tmp_path / "out"), *kube_args(kube_cluster, namespace)], copy=kubelet.copy)
    assert code == 0, capsys.readouterr().err
    assert json.loads((tmp_path / "out" / "exp1" / "summary.json").read_text())["updates"] == 300
    assert capsys.readouterr().out == f"lockstep fetch: exp1 -> {tmp_path / 'out' / 'exp1'} (300 updates, complete)\n"
    [reader] = kubelet.pods
    from kubernetes import client

    job = client.BatchV1Api(kube_cluster.api_client()).read_namespaced_job("exp1-lockstep", namespace)
    [loc] = cl.find_runs([core.api_client.sanitize_for_serialization(job)])
    kubernetes_validate.validate(cl.reader_pod(loc, reader["metadata"]["name"], namespace), "1.29.0", strict=True)
    spec = reader["spec"]
    assert spec["volumes"] == [{"name": "results", "persistentVolumeClaim": {
        "claimName": "exp1-lockstep-results", "readOnly": True}}]
    assert spec["containers"][0]["volumeMounts"] == [{"name": "results", "mountPath": "/results", "readOnly": True}]
    assert spec["securityContext"]["runAsNonRoot"] is True
    wait_until(lambda: not core.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/component=fetch").items,
               timeout=30, what="the reader pod deleted")


def test_ctrl_c_while_fetch_waits_for_its_reader_pod_deletes_the_pod(helm, kube_cluster, namespace, tmp_path):
    # the CLI's handler exited at once outside a run ("nothing was started"), leaving the pod for an hour
    helm("install", "exp1", str(CHART), "--namespace", namespace, "--kubeconfig", str(kube_cluster.kubeconfig))
    core = kube_cluster.core()

    def readers() -> list:
        return core.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/component=fetch").items

    proc = subprocess.Popen([sys.executable, "-m", "controller.cli", "fetch", "exp1", str(tmp_path / "out"),
                             "--timeout", "120", *kube_args(kube_cluster, namespace)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(readers, timeout=60, what="the reader pod created (it stays Pending: no kubelet)")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert err.strip() == "lockstep fetch: interrupted by SIGINT; the reader pod was deleted."
    wait_until(lambda: not readers(), timeout=30, what="the reader pod deleted")


def test_fetch_reads_a_kept_claim_after_helm_uninstall(helm, kube_cluster, namespace, tmp_path, capsys):
    # "no lockstep controller Job of release exp1": the claim, kept for that, could not be read by fetch
    helm("install", "exp1", str(CHART), "--namespace", namespace, "--kubeconfig", str(kube_cluster.kubeconfig))
    helm("uninstall", "exp1", "--namespace", namespace, "--kubeconfig", str(kube_cluster.kubeconfig))
    core = kube_cluster.core()
    from kubernetes import client

    wait_until(lambda: not client.BatchV1Api(kube_cluster.api_client()).list_namespaced_job(namespace).items,
               timeout=60, what="the release's Job gone")
    volume = _volume(tmp_path, "/results/exp1", 42)
    with StandInKubelet(core, namespace, volume) as kubelet:
        code = cl.fetch_main(["exp1", str(tmp_path / "out"), *kube_args(kube_cluster, namespace)], copy=kubelet.copy)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.err == "lockstep fetch: exp1: its Job is gone; reading its kept claim exp1-lockstep-results\n"
    assert json.loads((tmp_path / "out" / "exp1" / "summary.json").read_text())["updates"] == 42
    [reader] = kubelet.pods
    assert reader["spec"]["volumes"] == [{"name": "results", "persistentVolumeClaim": {
        "claimName": "exp1-lockstep-results", "readOnly": True}}]
    assert reader["spec"]["containers"][0]["image"] == "lockstep:0.1.0"  # the chart's, as the Job had it


def test_fetch_of_a_sweep_makes_one_local_sweep_directory(helm_bin, kube_cluster, namespace, tmp_path, capsys):
    assert lockstep(helm_bin, "sweep", "--kubernetes", "--name", "two", "--no-wait",
                    *kube_args(kube_cluster, namespace), "seed=1,2").returncode == 0
    releases = [j.metadata.labels["app.kubernetes.io/instance"] for j in sweep_jobs(kube_cluster, namespace, "two")]
    volume = tmp_path / "volume"
    for i, r in enumerate(releases):
        src = _volume(tmp_path / f"v{i}", f"/results/two/{r}", 10 + i)
        (volume / "two").mkdir(parents=True, exist_ok=True)
        (src / "two" / r).rename(volume / "two" / r)
    with StandInKubelet(kube_cluster.core(), namespace, volume) as kubelet:
        code = cl.fetch_main(["--sweep", "two", str(tmp_path / "out"), *kube_args(kube_cluster, namespace)],
                             copy=kubelet.copy)
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "out" / "two").iterdir()) == sorted(releases)
    assert capsys.readouterr().out.splitlines()[-1] == f"lockstep fetch: plot the sweep with: lockstep plot {tmp_path / 'out' / 'two'}"


def test_fetch_says_so_when_the_results_went_with_an_emptydir(helm, kube_cluster, namespace, capsys):
    helm("install", "tmp1", str(CHART), "--namespace", namespace, "--kubeconfig", str(kube_cluster.kubeconfig),
         "--set", "results.persistence.enabled=false")
    assert cl.fetch_main(["tmp1", *kube_args(kube_cluster, namespace)]) == 2
    assert capsys.readouterr().err == ("lockstep fetch: release tmp1 kept its results on an emptyDir "
                                       "(results.persistence.enabled=false) and its controller pod is not running: "
                                       "they are gone\n")


def test_extracting_a_tar_never_writes_outside_the_destination(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 1
        t.addfile(info, io.BytesIO(b"x"))
    with pytest.raises(tarfile.OutsideDestinationError):
        cl.extract_tar(buf.getvalue(), tmp_path / "dest")
    assert not (tmp_path / "escape.txt").exists()

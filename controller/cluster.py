"""``lockstep sweep --kubernetes`` and ``lockstep fetch``: sweeps and results on a cluster (docs/kubernetes.md).

A sweep is one Helm release of ``charts/lockstep`` per point, installed with the real ``helm``: the
points come from Hydra's own override parser (``lr=0.1,0.01 seed=range(3)``, ``+experiment=a,b``),
so a sweep means what ``lockstep run --multirun`` means. Every release is named ``<sweep>-<hash>``
(the hash of the point's overrides: unique, a valid DNS label, at most 40 characters, so every
object name stays within 63), labelled ``lockstep.io/sweep``, and writes its run directory under
one sweep directory, ``<results.mountPath>/<sweep>/<release>``. Then the sweep reports progress
from the Jobs and their pods, one line whenever a point starts, ends or cannot start (the
controller pod's ImagePullBackOff, Unschedulable, ...), until every point has ended.

``lockstep fetch`` copies a release's run directory (or a whole sweep's) out of the results volume:
a short-lived reader pod mounts the claim read-only and streams a tar archive through the API's
exec; with an emptyDir it reads from the controller's pod while that still runs.

The API is reached only through ``controller.launchers.kubernetes`` (``connect``, ``exec_in_pod``), the one
module that imports ``kubernetes``.
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from controller import signals
from controller.launchers.base import first_line
from controller.launchers.kubernetes import (LauncherConfigError, api_errors, api_sentence, connect, exec_in_pod,
                                            pod_failure)

__all__ = ["Point", "expand", "release_name", "sweep_main", "fetch_main", "JobState", "job_state",
           "reader_pod", "find_runs", "Cluster", "extract_tar"]

SWEEP_LABEL = "lockstep.io/sweep"
POINT_LABEL = "lockstep.io/point"
MAX_RELEASE = 40  # the chart's full name keeps 40 characters; the release is the full name's start
SOURCE_CHART = Path(__file__).resolve().parent.parent / "charts" / "lockstep"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class SweepError(ValueError):
    """Bad input to ``lockstep sweep`` or ``fetch``: one sentence, exit status 2."""


# --- the points --------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    index: int
    overrides: tuple[str, ...]  # the full override list of this point, sweep values resolved
    release: str = ""


def expand(overrides: list[str]) -> list[list[str]]:
    """The points of a Hydra sweep, as ``lockstep run --multirun`` would run them (Hydra's basic sweeper,
    an experiment's ``hydra.sweeper.params`` included)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from controller.config import sweep_jobs

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as e:
        raise SweepError(f"cannot parse the overrides {' '.join(overrides)}: {e}") from e
    for o in parsed:
        key = o.get_key_element()
        if key.startswith("hydra.") or key.startswith("hydra/"):
            raise SweepError(f"{o.input_line}: hydra settings are the chart's (the run directory is "
                             "<results.mountPath>/<sweep>/<release>); pass only experiment overrides")
    return sweep_jobs(overrides)


def values_overrides(values: list[str], sets: list[str]) -> list[str]:
    """The ``experiment.overrides`` the user's ``-f`` files set (the last one's: helm replaces a list): each
    point's values file sets the list too, so they go first in every point's. A ``--set`` of the list, which
    would replace every point's own, is refused."""
    for s in sets:
        if s.split("=", 1)[0].strip().split("[", 1)[0] in ("experiment.overrides", "experiment"):
            raise SweepError(f"--set {s}: every point sets experiment.overrides, so this would replace the point's "
                             "own overrides in every release; accepted: the overrides on the sweep's command line "
                             "(or in a -f values file, where they go first in every point's)")
    base: list[str] = []
    for f in values:
        try:
            data = yaml.safe_load(Path(f).read_text())
        except (OSError, yaml.YAMLError) as e:
            raise SweepError(f"-f {f}: cannot be read as YAML ({first_line(e)})") from e
        experiment = data.get("experiment") if isinstance(data, dict) else None
        overrides = experiment.get("overrides") if isinstance(experiment, dict) else None
        if overrides is None:
            continue
        if not (isinstance(overrides, list) and all(isinstance(o, str) for o in overrides)):
            raise SweepError(f"-f {f}: experiment.overrides={overrides!r} is not valid; accepted: a list of Hydra "
                             "overrides such as [workers=64, strategy=ps_sync]")
        base = list(overrides)
    return base


def release_name(sweep: str, overrides: list[str]) -> str:
    """``<sweep>-<8 hex of the overrides>``: a DNS label of at most 40 characters, unique per point."""
    digest = hashlib.sha256("\n".join(overrides).encode()).hexdigest()[:8]
    return f"{sweep[: MAX_RELEASE - 9].rstrip('-')}-{digest}"


def validate_points(points: list[list[str]]) -> None:
    """Validate every point as the controller will (bar the data set, which is the cluster's)."""
    from controller.config import ConfigError, load

    problems = []
    for i, overrides in enumerate(points):
        try:
            load(["launcher=kubernetes", *overrides], check_data=False)
        except ConfigError as e:
            problems += [f"point {i} ({' '.join(overrides)}): {p}" for p in e.problems]
    if problems:
        raise SweepError("\n".join(problems))


# --- the cluster -------------------------------------------------------------------------
class Cluster:
    """The API (kubernetes client) and helm, for one kubeconfig, context and namespace."""

    def __init__(self, namespace: str | None, kubeconfig: str | None = None, context: str | None = None,
                 helm: str | None = None):
        try:
            self.core, self.batch, self.namespace = connect(kubeconfig, context, namespace)
        except (ImportError, LauncherConfigError) as e:
            raise SweepError(str(e)) from e
        self.to_json = self.core.api_client.sanitize_for_serialization
        self.kubeconfig, self.context = kubeconfig, context
        self.helm_bin = helm or shutil.which("helm")

    def helm(self, *args: str) -> subprocess.CompletedProcess[str]:
        if not self.helm_bin:
            raise SweepError("helm is not on PATH (https://helm.sh/docs/intro/install/); "
                             "lockstep sweep --kubernetes installs one release per point with it")
        argv = [self.helm_bin, *args, "--namespace", self.namespace]
        if self.kubeconfig:
            argv += ["--kubeconfig", self.kubeconfig]
        if self.context:
            argv += ["--kube-context", self.context]
        return subprocess.run(argv, capture_output=True, text=True, timeout=300)

    def jobs(self, selector: str) -> list[dict[str, Any]]:
        return [self.to_json(j) for j in self.batch.list_namespaced_job(
            self.namespace, label_selector=selector, _request_timeout=30).items]

    def claims(self, selector: str) -> list[dict[str, Any]]:
        return [self.to_json(c) for c in self.core.list_namespaced_persistent_volume_claim(
            self.namespace, label_selector=selector, _request_timeout=30).items]

    def pods(self, selector: str) -> list[dict[str, Any]]:
        return [self.to_json(p) for p in self.core.list_namespaced_pod(
            self.namespace, label_selector=selector, _request_timeout=30).items]


# --- progress ----------------------------------------------------------------------------
@dataclass
class JobState:
    state: str  # pending | running | done | failed
    reason: str = ""


def job_state(job: dict[str, Any], pods: list[dict[str, Any]]) -> JobState:
    """Where one point stands: its Job's conditions, else its controller pod (which may never start)."""
    conds = {c["type"]: c for c in (job.get("status") or {}).get("conditions") or [] if c.get("status") == "True"}
    if "RunFailed" in conds:  # the controller's own one-line reason (controller/session.py)
        return JobState("failed", conds["RunFailed"].get("message", ""))
    if "Failed" in conds:
        c = conds["Failed"]
        why = "; ".join(filter(None, (c.get("reason"), c.get("message"))))
        return JobState("failed", f"Job {job['metadata']['name']} failed: {why}")
    if "Complete" in conds:
        return JobState("done")
    waiting = ""
    for pod in pods:
        reason = pod_failure(pod)
        name = pod["metadata"]["name"]
        if reason and reason.startswith("Unschedulable"):  # an autoscaler may still add a node
            waiting = f"controller pod {name} waits: {reason}"
        elif reason:
            return JobState("failed", f"controller pod {name} cannot run: {reason}")
    if any((p.get("status") or {}).get("phase") == "Running" for p in pods):
        return JobState("running")
    return JobState("pending", waiting)


def watch(cluster: Cluster, sweep: str, n_points: int, *, timeout_s: float, interval_s: float = 2.0,
          out: Callable[[str], None] = print) -> int:
    """Report the sweep's progress, a line per change, until every point has ended; the exit status."""
    seen: dict[str, JobState] = {}
    deadline = time.monotonic() + timeout_s
    last = ""
    points: dict[str, str] = {}  # Job name -> point
    while True:
        jobs = cluster.jobs(f"{SWEEP_LABEL}={sweep}")
        listed = {job["metadata"]["name"] for job in jobs}
        for name, state in list(seen.items()):  # helm uninstall, or the Job's ttlSecondsAfterFinished
            if name not in listed and state.state not in ("done", "failed", "gone"):
                seen[name] = JobState("gone", "its Job was deleted before it ended (helm uninstall?)")
                out(f"lockstep sweep {sweep}: point {points.get(name, '?')} ({name}) gone: {seen[name].reason}")
        for job in jobs:
            name = job["metadata"]["name"]
            points[name] = job["metadata"].get("labels", {}).get(POINT_LABEL, "?")
            state = job_state(job, cluster.pods(f"job-name={name}"))
            if seen.get(name) != state:
                seen[name] = state
                if state.state in ("done", "failed") or state.reason:
                    point = job["metadata"]["labels"].get(POINT_LABEL, "?")
                    line = f"lockstep sweep {sweep}: point {point} ({name}) {state.state}"
                    if state.state == "failed" and "controller pod" in state.reason:
                        state.reason += f"; remove it with: helm uninstall {job['metadata']['labels'].get('app.kubernetes.io/instance')}"
                    out(line + (f": {state.reason}" if state.reason else ""))
        counts = {s: sum(1 for v in seen.values() if v.state == s)
                  for s in ("done", "failed", "running", "pending", "gone")}
        summary = (f"lockstep sweep {sweep}: {len(seen)}/{n_points} points: {counts['done']} done, "
                   f"{counts['failed']} failed, {counts['running']} running, {counts['pending']} pending"
                   + (f", {counts['gone']} gone" if counts["gone"] else ""))
        if summary != last:
            out(summary)
            last = summary
        if len(seen) >= n_points and counts["done"] + counts["failed"] + counts["gone"] == len(seen):
            return 1 if counts["failed"] or counts["gone"] else 0
        if time.monotonic() > deadline:
            out(f"lockstep sweep {sweep}: still going after {timeout_s:.0f}s (--timeout); "
                f"follow it with: lockstep sweep --kubernetes --name {sweep} --watch")
            return 1
        time.sleep(interval_s)


# --- lockstep sweep ----------------------------------------------------------------------
def _sweep_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="lockstep sweep",
        description="Run a Hydra sweep: locally (as lockstep run --multirun), or with --kubernetes one Helm "
                    "release of charts/lockstep per point, every point under one sweep directory.")
    p.add_argument("overrides", nargs="*", help="Hydra overrides; a,b / range() / choice() values are swept")
    p.add_argument("--kubernetes", action="store_true", help="one release (a controller Job and its agent pods) per point")
    p.add_argument("--name", help="the sweep's name: release prefix, label lockstep.io/sweep and results directory "
                                  "(default: sweep-<UTC time>)")
    p.add_argument("--chart", type=Path, default=None, help=f"the chart (default: {SOURCE_CHART})")
    p.add_argument("-f", "--values", action="append", default=[], help="a values file for every release (helm -f)")
    p.add_argument("--set", action="append", default=[], dest="sets", help="a value for every release (helm --set)")
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--kube-context", help="kubeconfig context (default: the current one)")
    p.add_argument("--no-wait", action="store_true", help="install the releases and return")
    p.add_argument("--watch", action="store_true", help="only follow the sweep --name (installed before)")
    p.add_argument("--timeout", type=float, default=86400, help="seconds to follow the sweep (default 86400)")
    p.add_argument("--dry-run", action="store_true", help="print the points and their releases, install nothing")
    return p


def sweep_main(argv: list[str]) -> int:
    a = _sweep_parser().parse_args(argv)
    if not a.kubernetes:
        from controller.cli import main as cli_main

        return cli_main(["run", "--multirun", *a.overrides])
    try:
        return _sweep_kubernetes(a)
    except SweepError as e:
        print(f"lockstep sweep: {e}", file=sys.stderr)
        return 2
    except api_errors() as e:
        print(f"lockstep sweep: {api_sentence(e)}", file=sys.stderr)
        return 2


def _sweep_kubernetes(a: argparse.Namespace) -> int:
    name = a.name or time.strftime("sweep-%Y%m%d-%H%M%S", time.gmtime())
    if not DNS_LABEL.match(name) or len(name) > 31:
        raise SweepError(f"--name {name!r} is not valid; accepted: at most 31 of a-z, 0-9 and '-', "
                         "a letter or digit at both ends")
    if a.watch:
        cluster = Cluster(a.namespace, a.kubeconfig, a.kube_context)
        n = len(cluster.jobs(f"{SWEEP_LABEL}={name}"))
        if not n:
            raise SweepError(f"no Job labelled {SWEEP_LABEL}={name} in namespace {cluster.namespace}")
        return watch(cluster, name, n, timeout_s=a.timeout)
    if not a.overrides:
        raise SweepError("no overrides: give the sweep as Hydra overrides, e.g. lr=0.1,0.01 seed=1,2")
    chart = a.chart or SOURCE_CHART
    if not (chart / "Chart.yaml").is_file():
        raise SweepError(f"--chart {chart}: no Chart.yaml there; pass the path of charts/lockstep")
    base = values_overrides(a.values, a.sets)
    points = [Point(i, tuple(o), release_name(name, o)) for i, o in enumerate(expand(base + a.overrides))]
    if len({p.release for p in points}) != len(points):
        raise SweepError("two points have the same overrides; each point of a sweep must differ")
    validate_points([list(p.overrides) for p in points])
    for p in points:
        print(f"lockstep sweep {name}: point {p.index} -> release {p.release}: {' '.join(p.overrides)}")
    if a.dry_run:
        return 0
    cluster = Cluster(a.namespace, a.kubeconfig, a.kube_context)
    earlier = cluster.jobs(f"{SWEEP_LABEL}={name}")
    if earlier:  # its releases would share the label and the results directory, and helm would refuse some
        releases = sorted({j["metadata"].get("labels", {}).get("app.kubernetes.io/instance", "?") for j in earlier})
        raise SweepError(f"--name {name}: a sweep of that name has {len(releases)} release(s) in namespace "
                         f"{cluster.namespace} ({', '.join(releases[:3])}{', ...' if len(releases) > 3 else ''}); "
                         f"accepted: another --name, or remove them first (helm uninstall -n {cluster.namespace} "
                         f"{' '.join(releases[:3])}{' ...' if len(releases) > 3 else ''})")
    with tempfile.TemporaryDirectory(prefix="lockstep-sweep-") as tmp:
        for p in points:
            # a values file, not --set: an override holding a comma or braces needs no escaping
            values = Path(tmp) / f"{p.release}.yaml"
            values.write_text(yaml.safe_dump({
                "experiment": {"overrides": list(p.overrides), "sweep": name},
                "commonLabels": {SWEEP_LABEL: name, POINT_LABEL: str(p.index)}}))
            args = ["install", p.release, str(chart), *[x for f in a.values for x in ("-f", f)], "-f", str(values),
                    *[x for s in a.sets for x in ("--set", s)]]
            proc = cluster.helm(*args)
            if proc.returncode != 0:
                print(f"lockstep sweep {name}: helm install {p.release} failed (point {p.index}): "
                      f"{proc.stderr.strip()}", file=sys.stderr)
                return 1
    print(f"lockstep sweep {name}: {len(points)} releases installed in namespace {cluster.namespace}; results "
          f"under <results.mountPath>/{name}/; copy them with: lockstep fetch --sweep {name} DIR")
    if a.no_wait:
        print(f"lockstep sweep {name}: follow it with: lockstep sweep --kubernetes --name {name} --watch")
        return 0
    return watch(cluster, name, len(points), timeout_s=a.timeout)


# --- lockstep fetch ----------------------------------------------------------------------
@dataclass
class RunLocation:
    """Where a release's run directory is: a claim (or the controller pod's emptyDir) and a path."""

    release: str
    job: str
    run_dir: str  # absolute path in the controller container
    mount_path: str
    claim: str | None  # None: an emptyDir, readable only while the controller pod lives
    image: str
    pod_spec: dict[str, Any] = field(default_factory=dict)


def find_runs(jobs: list[dict[str, Any]]) -> list[RunLocation]:
    """The run directories of the chart's controller Jobs (API JSON), from their pod templates."""
    out = []
    for job in jobs:
        spec = job["spec"]["template"]["spec"]
        ctr = next(c for c in spec["containers"] if c["name"] == "controller")
        args = dict(a.split("=", 1) for a in ctr.get("args") or [] if "=" in a and a.startswith("hydra.run.dir="))
        mounts = {m["name"]: m["mountPath"] for m in ctr.get("volumeMounts") or []}
        vols = {v["name"]: v for v in spec.get("volumes") or []}
        if "hydra.run.dir" not in args or "results" not in mounts:
            raise SweepError(f"Job {job['metadata']['name']} is not a lockstep controller Job of the chart "
                             "(no hydra.run.dir argument or results volume)")
        claim = (vols.get("results", {}).get("persistentVolumeClaim") or {}).get("claimName")
        out.append(RunLocation(
            release=job["metadata"]["labels"].get("app.kubernetes.io/instance", job["metadata"]["name"]),
            job=job["metadata"]["name"], run_dir=args["hydra.run.dir"], mount_path=mounts["results"],
            claim=claim, image=ctr["image"], pod_spec=spec))
    return out


def kept_runs(claims: list[dict[str, Any]]) -> list[RunLocation]:
    """The run directories of releases whose Job is gone (``helm uninstall``, the Job's TTL) but whose claim
    was kept: the chart annotates the claim with the run directory, its mount path and the image."""
    out = []
    for c in claims:
        ann = c["metadata"].get("annotations") or {}
        if not all(k in ann for k in ("lockstep.io/run-dir", "lockstep.io/mount-path", "lockstep.io/image")):
            continue
        release = c["metadata"].get("labels", {}).get("app.kubernetes.io/instance", c["metadata"]["name"])
        out.append(RunLocation(release=release, job=f"{release}-lockstep", run_dir=ann["lockstep.io/run-dir"],
                               mount_path=ann["lockstep.io/mount-path"], claim=c["metadata"]["name"],
                               image=ann["lockstep.io/image"]))
    return out


def reader_pod(loc: RunLocation, name: str, namespace: str) -> dict[str, Any]:
    """A pod that mounts the run's claim read-only and waits to be read (``kubectl exec``-style)."""
    spec = loc.pod_spec
    keep = {k: spec[k] for k in ("imagePullSecrets", "securityContext", "nodeSelector", "tolerations")
            if spec.get(k)}
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {
            "app.kubernetes.io/name": "lockstep", "app.kubernetes.io/component": "fetch",
            "app.kubernetes.io/instance": loc.release, "app.kubernetes.io/managed-by": "lockstep"}},
        "spec": {
            **keep,
            "restartPolicy": "Never", "automountServiceAccountToken": False, "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 1, "activeDeadlineSeconds": 3600,
            # next to the controller if it still runs: a ReadWriteOnce claim mounts on one node only
            "affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {
                    "matchLabels": {"job-name": loc.job}}}}]}},
            "containers": [{
                "name": "fetch", "image": loc.image, "command": ["sleep", "3600"],
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "results", "mountPath": loc.mount_path, "readOnly": True}]}],
            "volumes": [{"name": "results", "persistentVolumeClaim": {"claimName": loc.claim, "readOnly": True}}],
        },
    }


# The reader's side of a copy: a gzipped tar of one directory, base64 on stdout (the API's exec stream is text).
TAR_SCRIPT = (
    "import base64,sys,tarfile\n"
    "class W:\n"
    "    def __init__(s): s.b=b''\n"
    "    def write(s,d):\n"
    "        s.b+=d; n=len(s.b)//57*57\n"
    "        if n: sys.stdout.write(base64.b64encode(s.b[:n]).decode()+'\\n'); s.b=s.b[n:]\n"
    "        return len(d)\n"
    "    def flush(s): sys.stdout.write(base64.b64encode(s.b).decode()+'\\n'); s.b=b''\n"
    "w=W()\n"
    "with tarfile.open(fileobj=w,mode='w|gz') as t: t.add(sys.argv[1],arcname=sys.argv[2])\n"
    "w.flush()\n")


def extract_tar(data: bytes, dest: Path) -> list[str]:
    """Unpack a run's tar into ``dest`` (no path may leave it); returns the member names."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as t:
        members = t.getmembers()
        t.extractall(dest, filter="data")
    return [m.name for m in members]


def exec_copy(cluster: Cluster, pod: str, container: str, path: str, arcname: str) -> bytes:
    """The tar of ``path`` in a running pod, through the API's exec (what ``kubectl cp`` does)."""
    out, err, code = exec_in_pod(cluster.core, pod, cluster.namespace, container,
                                 ["python", "-c", TAR_SCRIPT, path, arcname])
    if code:
        raise SweepError(f"reading {path} in pod {pod} failed (exit {code}): {err.strip()}")
    return base64.b64decode(out)


def _wait_running(cluster: Cluster, name: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        pod = cluster.to_json(cluster.core.read_namespaced_pod(name, cluster.namespace, _request_timeout=30))
        phase = (pod.get("status") or {}).get("phase")
        if phase == "Running":
            return
        reason = pod_failure(pod)
        if reason or phase in ("Failed", "Succeeded"):
            raise SweepError(f"the reader pod {name} cannot run: {reason or phase}")
        if time.monotonic() > deadline:
            raise SweepError(f"the reader pod {name} is still {phase} after {timeout_s:.0f}s (--timeout)")
        if signals.wait(0.5):
            signals.check()


def fetch(cluster: Cluster, loc: RunLocation, dest: Path, *, timeout_s: float = 300,
          copy: Callable[[Cluster, str, str, str, str], bytes] = exec_copy) -> Path:
    """Copy ``loc``'s run directory to ``dest/<release>``; returns that directory."""
    arcname = Path(loc.run_dir).name
    if loc.claim is None:
        pods = [p for p in cluster.pods(f"job-name={loc.job}")
                if (p.get("status") or {}).get("phase") == "Running"]
        if not pods:
            raise SweepError(f"release {loc.release} kept its results on an emptyDir "
                             "(results.persistence.enabled=false) and its controller pod is not running: they are gone")
        data = copy(cluster, pods[0]["metadata"]["name"], "controller", loc.run_dir, arcname)
    else:
        name = f"lockstep-fetch-{hashlib.sha256(f'{loc.job}{time.time_ns()}'.encode()).hexdigest()[:8]}"
        signals.defer()  # from here Ctrl-C is a request (signals.Stopped at a check): the pod is deleted first
        cluster.core.create_namespaced_pod(cluster.namespace, reader_pod(loc, name, cluster.namespace),
                                           _request_timeout=30)
        try:
            _wait_running(cluster, name, timeout_s)
            data = copy(cluster, name, "fetch", loc.run_dir, arcname)
            signals.check()
        finally:
            cluster.core.delete_namespaced_pod(name, cluster.namespace, grace_period_seconds=0, _request_timeout=30)
    extract_tar(data, dest)
    return dest / arcname


def _fetch_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="lockstep fetch",
                                description="Copy a release's run directory (or a sweep's) out of the cluster.")
    p.add_argument("release", nargs="?", help="the Helm release")
    p.add_argument("dir", nargs="?", type=Path, default=Path("."), help="where to put it (default: .)")
    p.add_argument("--sweep", help="every release of this sweep, into DIR/<sweep>/")
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--kube-context", help="kubeconfig context (default: the current one)")
    p.add_argument("--timeout", type=float, default=300, help="seconds the reader pod may take to start")
    return p


def fetch_main(argv: list[str], copy: Callable[..., bytes] = exec_copy) -> int:
    a = _fetch_parser().parse_args(argv)
    try:
        if bool(a.release) == bool(a.sweep):
            if a.sweep and a.release:  # `fetch --sweep NAME DIR`: the positional is the directory
                a.dir, a.release = Path(a.release), None
            else:
                raise SweepError("give a release (lockstep fetch RELEASE [DIR]) or a sweep (--sweep NAME [DIR])")
        cluster = Cluster(a.namespace, a.kubeconfig, a.kube_context)
        selector = (f"{SWEEP_LABEL}={a.sweep}" if a.sweep else f"app.kubernetes.io/instance={a.release}")
        jobs = [j for j in cluster.jobs(selector + ",app.kubernetes.io/component=controller")]
        locs = find_runs(jobs)
        gone = [k for k in kept_runs(cluster.claims(selector)) if k.release not in {loc.release for loc in locs}]
        for k in gone:
            print(f"lockstep fetch: {k.release}: its Job is gone; reading its kept claim {k.claim}", file=sys.stderr)
        locs += gone
        if not locs:
            what = f"sweep {a.sweep}" if a.sweep else f"release {a.release}"
            raise SweepError(f"no lockstep controller Job or kept results claim of {what} in namespace "
                             f"{cluster.namespace}")
        dest = a.dir / a.sweep if a.sweep else a.dir
        for loc in locs:
            got = fetch(cluster, loc, dest, timeout_s=a.timeout, copy=copy)
            summary = got / "summary.json"
            state = "no summary.json"
            if summary.exists():
                s = json.loads(summary.read_text())
                state = f"{s.get('updates')} updates, {'complete' if s.get('complete') else 'partial'}"
            print(f"lockstep fetch: {loc.release} -> {got} ({state})")
        if a.sweep:
            print(f"lockstep fetch: plot the sweep with: lockstep plot {dest}")
        return 0
    except SweepError as e:
        print(f"lockstep fetch: {e}", file=sys.stderr)
        return 2
    except api_errors() as e:
        print(f"lockstep fetch: {api_sentence(e)}", file=sys.stderr)
        return 2
    except signals.Stopped as e:
        print(f"lockstep fetch: interrupted by {e.name}; the reader pod was deleted.", file=sys.stderr)
        return e.exit_status

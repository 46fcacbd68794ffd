"""Agent recovery with ``launcher=kubernetes``, end to end against the real API server of conftest.py.

No real kubelet runs here: the stand-in of fake_kubelet.py starts each agent pod's command as a local
process and reports its status through the API as a kubelet does. Killing that process is what a
container killed on its node looks like to the controller: the kubelet reports the pod ``Failed``
with the exit status, and the agent's gRPC session breaks. Everything else is real: the controller,
the launcher deleting the lost set of pods and creating a new one, the new token Secret, the replay.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import assert_one_agent_recovered
from tests.recovery.test_recovery import assert_identical

from .conftest import REPO, KubeCluster, wait_until
from .fake_kubelet import FakeKubelet
from .test_kube_run import SERVICE, controller_pod, leftovers, run_command  # noqa: F401 - controller_pod: a fixture

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FAST = ("model=mlp", "compute=constant", "network.latency=1ms", "controller.heartbeat_s=0.5")
UPDATES = 600  # about 10 s of windows on the 2-core VM: time to kill an agent in the middle


def _rows(run_dir: Path) -> int:
    try:
        return max(0, len((run_dir / "metrics.csv").read_text().splitlines()) - 1)
    except FileNotFoundError:
        return 0


REPLAY = "recovery.checkpoint_every_s=0"  # a lost agent: the run replays from virtual time 0
CHECKPOINTS = "recovery.checkpoint_every_s=0.5"  # from the latest checkpoint (docs/recovery.md)


def _lockstep(kube_cluster: KubeCluster, namespace: str, run_dir: Path, owner: str, *extra: str) -> subprocess.Popen:
    """``lockstep run launcher=kubernetes`` (run id k8s-rec); its log and stderr as one stream."""
    cmd = run_command(kube_cluster, namespace, run_dir, "k8s-rec", owner, *FAST, *extra, updates=UPDATES)
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _kubelet(kube_cluster: KubeCluster, namespace: str, logs: Path) -> FakeKubelet:
    return FakeKubelet(kube_cluster.core(), namespace, logs, dns={f"{SERVICE}.{namespace}.svc": "127.0.0.1"})


def _kill_agent_mid_run(kubelet: FakeKubelet, proc: subprocess.Popen, run_dir: Path, pod: str,
                        checkpoints: bool = False) -> str:
    """SIGKILL the process of ``pod`` once 200 rows (and, with ``checkpoints``, a checkpoint) are written; the
    run's output once it ended."""
    try:
        wait_until(lambda: (_rows(run_dir) > 200 and (not checkpoints or (run_dir / "checkpoints" / "latest").exists()))
                   or proc.poll() is not None, timeout=180, what="200 rows of metrics.csv (and a checkpoint)")
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        kubelet.procs[pod].kill()
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    return out


@pytest.mark.parametrize("checkpoints", [False, True], ids=["replay from 0", "from a checkpoint"])
def test_an_agent_pod_killed_mid_run_is_replaced_and_the_run_ends_as_if_nothing_happened(
        kube_cluster, namespace, controller_pod, tmp_path, checkpoints):  # noqa: F811
    core = kube_cluster.core()
    whole = tmp_path / "undisturbed"
    with _kubelet(kube_cluster, namespace, tmp_path / "kubelet-0") as kubelet:
        proc = _lockstep(kube_cluster, namespace, whole, controller_pod, REPLAY)
        out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]

    d = tmp_path / "run"
    with _kubelet(kube_cluster, namespace, tmp_path / "kubelet-1") as kubelet:
        proc = _lockstep(kube_cluster, namespace, d, controller_pod, CHECKPOINTS if checkpoints else REPLAY)
        out = _kill_agent_mid_run(kubelet, proc, d, "lockstep-k8s-rec-agent-1", checkpoints)
    assert proc.returncode == 0, out[-3000:]
    assert not kubelet.errors
    # the lost pod is named by the launcher (its exit status) or by its broken session, whichever came first
    assert re.search(r"agent (1|lockstep-k8s-rec-agent-1) was lost \(", out), out[-3000:]
    assert "the replay caught up with the" in out or checkpoints, out[-3000:]
    # a new set of pods, with names of their own; each got the new token from its Secret
    assert sorted(kubelet.seen) == ["lockstep-k8s-rec-agent-0", "lockstep-k8s-rec-agent-1",
                                    "lockstep-k8s-rec-r1-agent-0", "lockstep-k8s-rec-r1-agent-1"]
    for pod in kubelet.seen.values():
        assert pod.metadata.owner_references[0].name == controller_pod
    assert_identical(whole, d, same_config=False)  # each run has a port of its own (controller.port)
    assert_one_agent_recovered(d, checkpoints)  # the new pods: from the latest checkpoint, or a replay
    assert leftovers(core, namespace, "k8s-rec") == []  # every pod of both sets, and both Secrets


def test_with_recovery_agents_fail_a_killed_agent_pod_stops_the_run_with_its_error(
        kube_cluster, namespace, controller_pod, tmp_path):  # noqa: F811
    d = tmp_path / "run"
    with _kubelet(kube_cluster, namespace, tmp_path / "kubelet") as kubelet:
        proc = _lockstep(kube_cluster, namespace, d, controller_pod, REPLAY, "recovery.agents=fail")
        out = _kill_agent_mid_run(kubelet, proc, d, "lockstep-k8s-rec-agent-1")
    assert proc.returncode == 1, out[-3000:]
    assert re.search(r"the run stopped because agent (1|lockstep-k8s-rec-agent-1) failed: ", out), out[-3000:]
    assert "Traceback" not in out and "restarting" not in out, out[-3000:]
    assert sorted(kubelet.seen) == ["lockstep-k8s-rec-agent-0", "lockstep-k8s-rec-agent-1"]
    assert not (d / "recovery.jsonl").exists()
    assert leftovers(kube_cluster.core(), namespace, "k8s-rec") == []

"""A stand-in kubelet for the end-to-end tests: runs agent pods as local processes.

It watches (by listing) the pods of one namespace, starts each new pod's ``agent`` container
command as a subprocess with the pod's environment (``value``, ``secretKeyRef`` and
``fieldRef: metadata.name`` resolved through the API, as a kubelet does), reports Running and then
the exit code through the pod's status, and kills the process when the pod is deleted. ``dns``
maps Service names in the command to 127.0.0.1, as cluster DNS would. ``fail`` makes it report a
status instead of starting a pod (e.g. ImagePullBackOff), as a kubelet on a broken node would.
"""
from __future__ import annotations

import base64
import os
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Any


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class FakeKubelet:
    def __init__(self, core, namespace: str, logs: Path, *, dns: dict[str, str] | None = None,
                 fail: dict[str, dict[str, Any]] | None = None):
        self.core, self.namespace, self.logs = core, namespace, logs
        self.dns, self.fail = dict(dns or {}), dict(fail or {})
        self.procs: dict[str, subprocess.Popen] = {}
        self.seen: dict[str, Any] = {}  # every pod it was given, as first seen
        self.errors: list[str] = []
        self._reported: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-kubelet", daemon=True)

    def __enter__(self) -> "FakeKubelet":
        self.logs.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)

    # ---------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sync()
            except Exception as e:  # noqa: BLE001 - reported by the test, not swallowed
                self.errors.append(repr(e))
            self._stop.wait(0.2)

    def _sync(self) -> None:
        pods = {p.metadata.name: p for p in self.core.list_namespaced_pod(self.namespace).items}
        for name, proc in list(self.procs.items()):
            pod = pods.get(name)
            if pod is None or pod.metadata.deletion_timestamp:
                if proc.poll() is None:
                    proc.terminate()
                continue
            if proc.poll() is not None and name not in self._reported:
                self._reported.add(name)
                code = proc.returncode
                self._patch(name, "Succeeded" if code == 0 else "Failed", {"terminated": {
                    "exitCode": code, "reason": "Completed" if code == 0 else "Error",
                    "startedAt": _now(), "finishedAt": _now()}})
        for name, pod in pods.items():
            if name in self.seen or pod.metadata.deletion_timestamp:
                continue
            if not any(c.name == "agent" for c in pod.spec.containers):
                continue  # not an agent pod (a stand-in controller pod, say)
            self.seen[name] = pod
            if name in self.fail:
                self._reported.add(name)
                self.core.patch_namespaced_pod_status(name, self.namespace, {"status": self.fail[name]})
                continue
            self._start(pod)

    def _start(self, pod) -> None:
        [ctr] = [c for c in pod.spec.containers if c.name == "agent"]
        argv = list(ctr.command or []) + list(ctr.args or [])
        if argv[:2] != ["lockstep", "agent"]:
            raise ValueError(f"pod {pod.metadata.name}: unexpected command {argv}")
        for i, a in enumerate(argv):
            host, sep, port = a.rpartition(":")
            if sep and host in self.dns:
                argv[i] = f"{self.dns[host]}:{port}"
        env = dict(os.environ)
        for var in ctr.env or []:
            env[var.name] = self._value(pod, var)
        env["HOME"] = env["XDG_CACHE_HOME"] = str(self.logs)  # this machine's /tmp is not the pod's
        env.pop("LOCKSTEP_PROFILE_DB", None)
        log = (self.logs / f"{pod.metadata.name}.log").open("wb")
        self.procs[pod.metadata.name] = subprocess.Popen(
            [sys.executable, "-m", "agents", *argv[2:]], env=env, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL)
        self._patch(pod.metadata.name, "Running", {"running": {"startedAt": _now()}})

    def _value(self, pod, var) -> str:
        if var.value_from is None:
            return var.value or ""
        if var.value_from.secret_key_ref is not None:
            ref = var.value_from.secret_key_ref
            secret = self.core.read_namespaced_secret(ref.name, self.namespace)
            return base64.b64decode(secret.data[ref.key]).decode()
        if var.value_from.field_ref is not None and var.value_from.field_ref.field_path == "metadata.name":
            return pod.metadata.name
        raise ValueError(f"pod {pod.metadata.name}: env {var.name} has a source this fake does not know")

    def _patch(self, name: str, phase: str, state: dict) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.patch_namespaced_pod_status(name, self.namespace, {"status": {
                "phase": phase, "containerStatuses": [{
                    "name": "agent", "image": "lockstep:test", "imageID": "", "ready": phase == "Running",
                    "restartCount": 0, "state": state}]}})
        except ApiException as e:
            if e.status != 404:  # deleted meanwhile: nothing left to report on
                raise

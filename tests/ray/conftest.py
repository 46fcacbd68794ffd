"""Fixtures for the Ray tests: a real Ray cluster of one node on 127.0.0.1, and a way to see its processes.

``ray_cluster`` is ``ray start --head`` run by the test session, with every Ray server on 127.0.0.1
(``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``: Ray's single-machine mode), a 200 MB object store, no
dashboard, no usage reporting, Ray's token authentication, and its own temp directory (so ``launcher.address=auto`` elsewhere on
the machine never finds it). It declares one GPU and a custom resource: Ray only counts them, so the
tests can check fractional GPU and custom-resource placement on this machine, which has no GPU (the
agents compute on the CPU).

Every process a test starts carries a marker in its environment, inherited by everything Ray spawns
for it; :func:`processes_with` finds them, so a test can show that none survives.

Without Ray installed (``pip install 'lockstep[ray]'``, which ``make test`` does) the tests that need
it skip, except under CI (``CI=true``), where that is a failure.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
MARK = "LOCKSTEP_TEST_MARK"
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
# Ray's token authentication, on for the cluster; a driver that names an address turns it on itself
# (Ray's rule: only `auto` finds the token on its own). The token is Ray's: ~/.ray/auth_token.
AUTH_ENV = {"RAY_AUTH_MODE": "token"}
FAKE_GPUS = 1
SLOTS = 2  # of the custom resource "lockstep_slot"


def need_ray() -> None:
    from controller.launchers.ray import available

    if available():
        return
    reason = "needs Ray: pip install 'lockstep[ray]' (make test installs it)"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(reason)
    pytest.skip(reason)


def marked_env(mark: str, **extra: str) -> dict[str, str]:
    """This environment, with the marker, the repository on PYTHONPATH (test strategies) and ``extra``."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, MARK: mark, "PYTHONPATH": path, "HYDRA_FULL_ERROR": "0", **extra}


def processes_with(mark: str) -> list[int]:
    """Live processes whose environment carries ``MARK=mark`` (zombies excluded)."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{entry.name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def kill_marked(mark: str) -> None:
    """Stop every process carrying the marker: SIGTERM, then SIGKILL what is left after 15 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in processes_with(mark):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        try:
            wait_until(lambda: not processes_with(mark), timeout=15, what="marked processes to end")
            return
        except AssertionError:
            continue


def listening(pids: list[int]) -> set[tuple[str, int]]:
    """The (address, port) of every TCP socket the processes ``pids`` listen on (from /proc/net/tcp{,6})."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.scandir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(fd.path)
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    out = set()
    for table, size in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A" or f[9] not in inodes:  # 0A: LISTEN
                continue
            hexaddr, port = f[1].split(":")
            raw = bytes.fromhex(hexaddr)
            # /proc prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            out.add((socket.inet_ntop(socket.AF_INET if size == 4 else socket.AF_INET6, raw), int(port, 16)))
    return out


def is_loopback(address: str) -> bool:
    return address.startswith("127.") or address in ("::1", "::ffff:127.0.0.1")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def ray_cluster():
    """``HOST:PORT`` of a Ray head started for the session (see the module docstring); stopped at the end."""
    need_ray()
    mark = f"ray-cluster-{uuid.uuid4().hex[:12]}"
    temp = tempfile.mkdtemp(prefix="lsray-", dir="/tmp")  # short: Ray's socket paths live under it
    port = free_port()
    ray_cli = Path(sys.executable).with_name("ray")
    cmd = [str(ray_cli), "start", "--head", f"--port={port}", "--num-cpus=4", f"--num-gpus={FAKE_GPUS}",
           f'--resources={{"lockstep_slot": {SLOTS}}}', "--include-dashboard=false", "--disable-usage-stats",
           "--object-store-memory=200000000", f"--temp-dir={temp}"]
    env = marked_env(mark, **LOOPBACK_ENV, **AUTH_ENV)
    saved = {k: os.environ.get(k) for k in AUTH_ENV}
    os.environ.update(AUTH_ENV)  # for the drivers the tests start in this process
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
        if p.returncode != 0:
            pytest.fail(f"ray start failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        yield f"127.0.0.1:{port}"
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        kill_marked(mark)
        shutil.rmtree(temp, ignore_errors=True)

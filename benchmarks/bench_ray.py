"""launcher=ray vs launcher=local: start-up with 2 and 4 agents, and the whole default experiment (3 000 updates).

Start-up is the time of ``RemoteAgents.start_agents``: from the launcher's first step (for ray: joining or
starting the cluster) until every agent has registered and built its vworkers (Ready). It is measured for
``launcher=local`` (subprocesses), ``launcher=ray`` with a private cluster started for the run
(``launcher.address=null``, the default) and ``launcher=ray`` on a cluster that is already running (one
``ray start --head`` on 127.0.0.1 for the whole benchmark, as a user with a cluster has).

The overhead runs the default experiment (64 workers, ps_async, cnn) for UPDATES updates with agents=2
on the running cluster vs local subprocesses: whole run (plan to summary.json, start-up and shutdown
included) and the window loop alone. Every run is a fresh Python process; the sides are interleaved and
each is repeated REPEATS times, the best kept (the machine is shared).

usage: python benchmarks/bench_ray.py [UPDATES] [REPEATS]
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _common import ROOT

MARK = "LOCKSTEP_BENCH_MARK"


def one(name: str, agents: int, updates: int, run_dir: str, address: str) -> None:
    from controller.config import load
    from controller.remote import RemoteAgents, launcher_for
    from controller.run import execute

    over = ["progress=false", f"agents={agents}", f"stop.updates={updates}"]
    if name == "local":
        over.append("launcher=local")
    else:
        over += ["launcher=ray", f"launcher.address={address if name == 'ray-running' else 'null'}"]
    rc = load(over)
    pool: RemoteAgents = launcher_for(rc)
    startup = {}
    start_agents = pool.start_agents

    def timed(plan, d):
        t0 = time.perf_counter()
        handles = start_agents(plan, d)
        startup["s"] = time.perf_counter() - t0
        return handles

    pool.start_agents = timed
    s = execute(rc, Path(run_dir), launcher=pool).summary
    print(json.dumps({"startup_s": startup["s"], "wall_time_s": s["wall_time_s"], "loop_s": s["wall_barrier_s"],
                      "updates": s["updates"]}))


def _run(name: str, agents: int, updates: int, run_dir: str, address: str, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--one", name, str(agents), str(updates), run_dir, address],
                         check=True, capture_output=True, text=True, env=env, cwd=ROOT).stdout
    return json.loads(out.strip().splitlines()[-1])


def _marked(mark: str) -> list[int]:
    needle = f"{MARK}={mark}".encode()
    pids = []
    for e in os.scandir("/proc"):
        if e.name.isdigit():
            try:
                if needle in Path(f"/proc/{e.name}/environ").read_bytes().split(b"\0"):
                    pids.append(int(e.name))
            except OSError:
                pass
    return pids


def _start_cluster(env: dict[str, str], temp: str) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    subprocess.run([str(Path(sys.executable).with_name("ray")), "start", "--head", f"--port={port}",
                    "--num-cpus=8", "--include-dashboard=false", "--disable-usage-stats",
                    "--object-store-memory=200000000", f"--temp-dir={temp}"], check=True, capture_output=True,
                   env={**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"})
    return f"127.0.0.1:{port}"


def _stop_cluster(mark: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in _marked(mark):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        while _marked(mark) and time.monotonic() < deadline:
            time.sleep(0.2)


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        return one(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6])
    from controller.launchers.ray import INSTALL_HINT, available

    if not available():
        print(f"bench_ray: skipped, Ray is not installed ({INSTALL_HINT})")
        return
    updates = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    mark = uuid.uuid4().hex
    env = {**os.environ, MARK: mark, "RAY_AUTH_MODE": "token",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    temp = tempfile.mkdtemp(prefix="lsbench-", dir="/tmp")
    address = _start_cluster(env, temp)
    best: dict[tuple[str, int], dict] = {}

    def keep(key: tuple[str, int], r: dict, by: str) -> None:
        if key not in best or r[by] < best[key][by]:
            best[key] = r

    try:
        with tempfile.TemporaryDirectory() as d:
            for i in range(repeats):
                for agents in (2, 4):
                    for name in ("local", "ray-private", "ray-running"):
                        keep((name, agents), _run(name, agents, 8, f"{d}/s-{name}-{agents}-{i}", address, env),
                             "startup_s")
            full: dict[str, dict] = {}
            for i in range(repeats):
                for name in ("local", "ray-running"):
                    r = _run(name, 2, updates, f"{d}/u-{name}-{i}", address, env)
                    if name not in full or r["wall_time_s"] < full[name]["wall_time_s"]:
                        full[name] = r
    finally:
        _stop_cluster(mark)
    print(f"bench_ray: start-up to every agent Ready (64 workers ps_async cnn), best of {repeats}, load "
          f"{open('/proc/loadavg').read().split()[0]} at the end:")
    for agents in (2, 4):
        lo = best[("local", agents)]["startup_s"]
        pr, ru = best[("ray-private", agents)]["startup_s"], best[("ray-running", agents)]["startup_s"]
        print(f"  agents={agents}: local {lo:.2f} s; ray on a running cluster {ru:.2f} s (ratio {ru / lo:.2f}); "
              f"ray with a private cluster {pr:.2f} s (ratio {pr / lo:.2f})")
    lo, ru = full["local"], full["ray-running"]
    print(f"  the default experiment, {updates} updates, agents=2: local {lo['wall_time_s']:.2f} s (loop "
          f"{lo['loop_s']:.2f} s), ray on a running cluster {ru['wall_time_s']:.2f} s (loop {ru['loop_s']:.2f} s): "
          f"ratio whole run {ru['wall_time_s'] / lo['wall_time_s']:.2f}, window loop {ru['loop_s'] / lo['loop_s']:.2f}")


if __name__ == "__main__":
    main()

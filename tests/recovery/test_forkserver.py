"""A killed forkserver (launcher=local, start_method=forkserver, docs/recovery.md): the agents it forked still run,
but multiprocessing reports the status 255 for each of them. The launcher says what happened — the server died —
and still stops those agents (they are no longer its children) before the run restarts them.

Real processes, real SIGKILL; the forkserver that is killed is never the one of this pytest process.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.distributed.conftest import ROOT
from tests.helpers import agent_pids, alive

# the launcher's forked agents, forked by a bare forkserver of a process of their own: each sleeps, the server
# is killed, then the launcher is asked what it sees and told to stop them
_SCRIPT = textwrap.dedent("""
    import json, multiprocessing, multiprocessing.forkserver, os, signal, time
    from controller.config.schema import LocalLauncherConfig
    from controller.launchers.base import AgentFailure
    from controller.launchers.local import LocalLauncher, _Forked

    ctx = multiprocessing.get_context("forkserver")
    launcher = LocalLauncher(LocalLauncherConfig(start_method="spawn", stop_grace_s=0.5))
    procs = [ctx.Process(target=time.sleep, args=(120,), daemon=True) for _ in range(2)]
    for p in procs:
        p.start()
    server = multiprocessing.forkserver._forkserver._forkserver_pid
    launcher.procs = [_Forked(p, server) for p in procs]
    os.kill(server, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while any(p.proc.exitcode is None for p in launcher.procs) and time.monotonic() < deadline:
        time.sleep(0.02)  # the server's death reaches each agent's sentinel
    try:
        launcher.check()
        failure = None
    except AgentFailure as e:
        failure = [e.agent, e.reason, e.lost]
    with open(os.environ["OUT"], "w") as f:  # the pids first: the test ends any agent left running
        json.dump({"server": server, "pids": [p.pid for p in procs], "failure": failure}, f)
    launcher.stop()
""")


def test_a_killed_forkserver_is_reported_as_such_and_the_agents_it_forked_are_stopped_all_the_same(tmp_path):
    out = tmp_path / "out.json"
    # no pipes: an agent left running would hold them open
    res = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=open(tmp_path / "stderr", "w"), env={**os.environ, "OUT": str(out)}, timeout=60)
    got = json.loads(out.read_text())
    server, pids = got["server"], got["pids"]
    left = [p for p in pids if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert res.returncode == 0, (tmp_path / "stderr").read_text()
    assert got["failure"] == ["0", f"the forkserver that started the agents (pid {server}) died; the agent's "
                              f"process (pid {pids[0]}) was still running and is stopped with the others", True]
    # stop() returned: the agents are gone, not left running under init (they were 255 = "exited" before)
    assert not left, f"agents left running: {left}"


def _forkserver_of(pid: int) -> int:
    """The pid of the forkserver process that process ``pid`` started."""
    for d in Path("/proc").iterdir():
        try:
            stat = (d / "stat").read_text()
            if d.name.isdigit() and int(stat[stat.rfind(")") + 2:].split()[1]) == pid and \
                    b"forkserver" in (d / "cmdline").read_bytes():
                return int(d.name)
        except (OSError, ValueError):
            continue
    raise AssertionError(f"process {pid} has no forkserver")


def test_a_run_whose_forkserver_is_killed_restarts_its_agents_and_says_why(tmp_path):
    d = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "controller.cli", "run", "workers=8", "agents=2", "model=mlp",
                             "compute=constant", "stop.updates=600", "progress=false", "launcher=local",
                             "controller.heartbeat_s=0.5", "recovery.checkpoint_every_s=0", f"hydra.run.dir={d}"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        pids = agent_pids(d, 2, timeout=120)
        server = _forkserver_of(proc.pid)
        os.kill(server, signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, out
    assert (f"agent 0 was lost (the forkserver that started the agents (pid {server}) died; the agent's process "
            f"(pid {pids[0]}) was still running and is stopped with the others); restarting every agent") in out, out
    assert "exited with status 255" not in out, out
    assert not any(alive(p) for p in pids)
    assert json.loads((d / "summary.json").read_text())["recovery"]["agent_restarts"] == 1

"""``launcher.start_method``: agents forked from a warm forkserver behave like agents started afresh.

Forked agents must give the same outputs, run in their own session (Ctrl-C in the terminal reaches only the
controller), show their command line, never inherit the controller's signal mask, and leave nothing behind.
"""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from controller.config import ConfigError, load
from tests.distributed.conftest import assert_same_outputs, run
from tests.distributed.test_failures import LONG, _cli
from tests.helpers import agent_pids, alive, wait_until


def test_forked_and_spawned_agents_give_byte_identical_outputs(tmp_path):
    over = ["workers=8", "agents=2", "strategy=ps_async", "model=mlp", "stop.updates=60", "launcher=local"]
    forked = run(tmp_path / "forked", over, local=True, start_method="forkserver")
    spawned = run(tmp_path / "spawned", over, local=True, start_method="spawn")
    assert forked.summary["updates"] == spawned.summary["updates"] == 60
    assert forked.summary["virtual_time_ns"] == spawned.summary["virtual_time_ns"]
    assert_same_outputs(tmp_path / "forked", tmp_path / "spawned")


def _status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def test_a_forked_agent_has_its_own_session_its_command_line_and_no_blocked_signals_and_exits_with_the_run(
        tmp_path):
    d = tmp_path / "run"
    proc = _cli(d, LONG + ["run_id=forked-agents", "launcher.start_method=forkserver"])
    try:
        pids = agent_pids(d, 2, timeout=90, first_rows=True)
        server = int(_status(pids[0])["PPid"])
        for i, pid in enumerate(pids):
            assert os.getsid(pid) == pid  # a session of its own, like Popen(start_new_session=True)
            title = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").decode()
            assert title.startswith(f"lockstep agent --controller 127.0.0.1:") and f"--agent-id {i} " in title
            assert "--run-id forked-agents" in title
            assert int(_status(pid)["SigBlk"], 16) == 0
            assert not int(_status(pid)["SigIgn"], 16) & (1 << (signal.SIGINT - 1))  # the forkserver ignores it
            assert int(_status(pid)["PPid"]) == server
        assert b"multiprocessing.forkserver" in Path(f"/proc/{server}/cmdline").read_bytes()
        assert int(_status(server)["PPid"]) == proc.pid
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err, err
    wait_until(lambda: not any(alive(p) for p in (*pids, server)), timeout=20,
               what="the agents and their forkserver to exit with the controller")


def test_ctrl_c_in_the_terminal_while_the_forkserver_imports_stops_the_run_without_a_traceback(tmp_path):
    d = tmp_path / "run"
    proc = _cli(d, LONG + ["run_id=forkserver-ctrl-c", "launcher.start_method=forkserver"], new_session=True)

    def importing() -> int | None:
        """The forkserver once it is importing torch (its preload), before it serves."""
        for child in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split():
            if (b"multiprocessing.forkserver" in Path(f"/proc/{child}/cmdline").read_bytes()
                    and "libtorch" in Path(f"/proc/{child}/maps").read_text()):
                return int(child)
        return None

    try:
        pid = wait_until(importing, timeout=90, interval=0.01, what="the forkserver to import torch")
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground process group
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    wait_until(lambda: not alive(pid), timeout=20, what="the forkserver to exit with the controller")


def test_an_unknown_start_method_is_refused_naming_the_key_the_value_and_the_choices():
    with pytest.raises(ConfigError) as e:
        load(["launcher=local", "agents=2", "launcher.start_method=fork"])
    text = str(e.value)
    assert "launcher.start_method=fork " in text and "forkserver" in text and "spawn" in text


def test_an_agent_reads_its_data_builds_its_vworkers_and_runs_windows_without_torchs_compiler():
    """The agent's start once imported torch._dynamo beside reading the data: about a second before Ready,
    in every agent, for a compiler no run uses (docs/benchmarks.md, "The agents' start without the compiler")."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys
        from agents.agent import _prepare
        from agents.common.plan import Plan
        from agents.core import AgentCore
        from controller.config import load
        from controller.plan import make_plan

        plan = Plan.from_json(make_plan(load(["agents=2", "launcher=local", "stop.updates=20", "progress=false",
                                              "compute=constant", "eval.every=0"])).to_json())
        core = AgentCore(plan, 0, data=_prepare(plan), metrics=None, own_process=True)
        core.advance(core.next_time() + 1_000_000)
        print(len(core.local), "torch._dynamo" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "33 False", out.stderr


@pytest.mark.parametrize("args, early", [
    (["agents=2", "stop.updates=3"], True),
    (["+experiment=x", "agents=4", "launcher=local", "launcher.start_method=forkserver"], True),
    (["stop.updates=3"], False),                        # one agent: the controller's own process
    (["agents=1"], False),
    (["agents=2", "launcher=inprocess"], False),
    (["agents=2", "launcher=kubernetes"], False),
    (["agents=2", "launcher.start_method=spawn"], False),
    (["agents=2", "--multirun"], False),                 # a sweep: Hydra's launcher decides
    (["agents=many"], False),                            # invalid: the validation names it, nothing starts
])
def test_the_cli_starts_the_forkserver_before_it_composes_the_configuration_when_asked_for_local_agents(
        monkeypatch, args, early):
    """Its imports (torch, the engine: 1-2 s) then overlap the controller's own start-up instead of
    delaying the agents' (docs/benchmarks.md, "Where the agents' start goes": the whole command 0.9 s faster)."""
    import controller.config
    import controller.launchers.forkserver
    from controller import cli

    calls = []
    monkeypatch.setattr(controller.launchers.forkserver, "warm_forkserver", lambda: calls.append("warm"))

    def compose():
        calls.append("compose")
        raise SystemExit(0)

    monkeypatch.setattr(controller.config, "register_configs", compose)
    with pytest.raises(SystemExit):
        cli._run(args)
    assert calls == (["warm", "compose"] if early else ["compose"])

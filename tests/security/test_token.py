"""The token never appears in process arguments, logs, metrics or the run directory (issue 13 item 5)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.distributed.test_failures import LONG
from tests.helpers import wait_until

from .procs import agent_argv

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "tok-3f9a1c0e5b7d42a8b1c6e0f9d8a7b6c5"


def test_the_token_is_in_no_argument_log_metric_or_file_of_the_run(tmp_path):
    d = tmp_path / "run"
    over = [o for o in LONG if not o.startswith("stop.")] + ["stop.updates=200", "run_id=token-check",
                                                             "log_level=DEBUG", "metrics.port=0"]
    proc = subprocess.Popen([sys.executable, "-m", "controller.cli", "run", *over, f"hydra.run.dir={d}"], cwd=ROOT,
                            env={**os.environ, "LOCKSTEP_TOKEN": TOKEN}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        argvs = wait_until(lambda: len(agent_argv("token-check")) == 2 and agent_argv("token-check"), timeout=120,
                           what="both agents to run")
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err.decode()[-2000:]
    for argv in argvs.values():
        assert not any(TOKEN.encode() in a for a in argv)
    assert TOKEN.encode() not in out + err
    files = [p for p in d.rglob("*") if p.is_file()]
    assert any(p.name == "metrics.prom" for p in files) and any(p.name == "agent-0.log" for p in files)
    for p in files:
        assert TOKEN.encode() not in p.read_bytes(), p

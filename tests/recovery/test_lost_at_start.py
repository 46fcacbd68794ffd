"""An agent lost while the agents start (the first time, or again after a restart) is restarted like one lost
mid-run (docs/recovery.md): it stopped the run, because the agents were started outside the loop that restarts
them. Real processes, real SIGKILL, launcher=local."""
from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

from tests.distributed.conftest import wait_until
from tests.helpers import alive
from tests.recovery.test_recovery import RUN, _cli, assert_identical, undisturbed  # noqa: F401 - the fixture


def _first_pid(run_dir: Path, agent: int) -> int | None:
    """The pid agent ``agent`` logs once it has built its vworkers: before it is ready, while the others may
    still be building theirs."""
    p = run_dir / "agents" / f"agent-{agent}.log"
    found = re.findall(r"pid (\d+) hosting", p.read_text()) if p.exists() else []
    return int(found[0]) if found else None


def test_an_agent_killed_while_the_agents_start_is_restarted_and_the_run_ends_as_if_nothing_happened(
        tmp_path, undisturbed):  # noqa: F811
    d = tmp_path / "run"
    proc = _cli("run", *RUN, f"hydra.run.dir={d}")
    try:
        pid = wait_until(lambda: _first_pid(d, 0), timeout=120, interval=0.005, what="agent 0 to build its vworkers")
        os.kill(pid, signal.SIGKILL)
        err, _ = proc.communicate(timeout=600)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "agent 0 was lost" in err and "restart 1 of at most" in err, err
    assert_identical(undisturbed, d)
    events = [json.loads(line) for line in (d / "recovery.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "restart" and events[0]["agent"] == "0"
    assert not alive(pid)

"""Finding a run's agent processes from the outside (their argv names the run).

A spawned agent's argv is ``python -m agents ... --run-id R``; a forked one (``launcher.start_method=forkserver``)
shows ``lockstep agent ... --run-id R`` as one title (setproctitle), so words are split on NULs and spaces.
"""
from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import alive


def agents_of(run_id: str) -> list[int]:
    """Pids of the live agent processes started for ``run_id``."""
    return [pid for pid, argv in agent_argv(run_id).items() if alive(pid)]


def agent_argv(run_id: str) -> dict[int, list[bytes]]:
    """Each agent process of ``run_id`` and its command line."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                argv = [w for w in re.split(rb"[\0 ]", (d / "cmdline").read_bytes()) if w]
            except OSError:
                continue
            if (b"agents" in argv or argv[:2] == [b"lockstep", b"agent"]) and run_id.encode() in argv:
                out[int(d.name)] = argv
    return out

"""Finding a run's agent processes from the outside (their argv names the run)."""
from __future__ import annotations

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
                argv = (d / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"agents" in argv and run_id.encode() in argv:
                out[int(d.name)] = argv
    return out

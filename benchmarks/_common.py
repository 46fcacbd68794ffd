"""Shared helpers of the benchmarks: compose a config and run it in-process or over local gRPC agents."""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run(run_dir: Path, overrides: list[str], local: bool, **settings):
    from controller.config import load
    from controller.launchers.local import LocalLauncher
    from controller.remote import ControllerSettings, RemoteAgents
    from controller.run import execute

    rc = load(["progress=false", *overrides])
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])}
    pool = RemoteAgents(LocalLauncher(), ControllerSettings(**settings), extra_env=env) if local else None
    return execute(rc, run_dir, launcher=pool)

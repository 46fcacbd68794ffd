"""Shared helpers of the benchmarks: compose a config and run it in-process or over local gRPC agents."""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run(run_dir: Path, overrides: list[str], local: bool, **settings):
    from hydra import compose, initialize_config_dir

    from controller.config import validate
    from controller.launchers.local import LocalLauncher
    from controller.remote import ControllerSettings, RemoteAgents
    from controller.run import execute

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["progress=false", *overrides])
    rc = validate(cfg)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])}
    pool = RemoteAgents(LocalLauncher(), ControllerSettings(**settings), extra_env=env) if local else None
    return execute(rc, run_dir, launcher=pool)

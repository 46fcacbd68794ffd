"""Real `lockstep run` subprocesses for the observability tests (small: mlp, constant compute)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Callable

from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["model=mlp", "compute=constant", "launcher=inprocess", "progress=false", "eval.samples=500",
         "batch_size=16", "seed=3"]


def command(run_dir: Path, *overrides: str) -> list[str]:
    keys = {o.split("=", 1)[0] for o in overrides}
    small = [o for o in SMALL if o.split("=", 1)[0] not in keys]  # Hydra refuses a key given twice
    return [sys.executable, "-m", "controller.cli", "run", *small, *overrides, f"hydra.run.dir={run_dir}"]


def run(run_dir: Path, *overrides: str, timeout_s: float = 120) -> Path:
    """Run to the end; fail with the run's output if it did not succeed."""
    p = subprocess.run(command(run_dir, *overrides), cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
    if p.returncode != 0:
        raise AssertionError(f"lockstep run failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return run_dir


def start(run_dir: Path, *overrides: str) -> subprocess.Popen[str]:
    return subprocess.Popen(command(run_dir, *overrides), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def poll(what: str, ok: Callable[[], bool], timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    """Wait until ``ok()`` holds (tests.helpers.wait_until); fail at once if ``proc`` exits first."""
    def ready() -> bool:
        if ok():
            return True
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before {what}:\n{proc.stdout.read()}")
        return False

    wait_until(ready, timeout=timeout_s, what=what)

"""Helpers: compose configs like the CLI does and run them in-process or over local gRPC agents."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from controller.config import load
from tests.helpers import FAST, compose_cfg, wait_until  # noqa: F401  (also used by test modules)
from controller.config.schema import LocalLauncherConfig
from controller.launchers.local import LocalLauncher
from controller.remote import ControllerSettings, RemoteAgents
from controller.run import execute
from tests.distributed.fakes import plan, server  # noqa: F401  (fixtures: a controller with a fixed plan)

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def agents_env() -> dict[str, str]:
    """Agents import test strategies (``tests.distributed.probe``) from the repository root."""
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}


def local_pool(start_method: str = "forkserver", **settings) -> RemoteAgents:
    s = {"agent_timeout_s": 30.0, "startup_timeout_s": 120.0, "heartbeat_s": 0.5, **settings}
    return RemoteAgents(LocalLauncher(LocalLauncherConfig(start_method=start_method)), ControllerSettings(**s),
                        log_level="INFO", extra_env=agents_env())


def run(tmp: Path, overrides: list[str], local: bool = False, **settings):
    """Execute ``overrides`` (on top of FAST) in-process, or over local gRPC agents when ``local``.

    With the observer ``lockstep run`` gives a run (controller/observe.py), so the agents' state-log and
    trace records take the path they take from the command line (a crash record was once refused there)."""
    from controller.observe import Observer

    rc = load(FAST + overrides)
    observer = Observer(rc, Path(tmp))
    result = None
    try:
        result = execute(rc, Path(tmp), launcher=local_pool(**settings) if local else None, observer=observer)
    finally:
        observer.finish(None if result is None else result.summary)
    return result


def without_wall(path: Path) -> str:
    import csv

    with open(path, newline="") as f:
        data = list(csv.reader(f))
    keep = [i for i, name in enumerate(data[0]) if not name.startswith("wall_")]
    return "\n".join(",".join(r[i] for i in keep) for r in data)


def assert_same_outputs(a: Path, b: Path, params: bool = True) -> None:
    """metrics.csv and eval.csv byte-identical except wall_* columns; statelog.jsonl byte-identical where both
    runs wrote one; params.pt bit-identical."""
    for name in ("metrics.csv", "eval.csv"):
        if (a / name).exists() or (b / name).exists():
            assert without_wall(a / name) == without_wall(b / name), f"{name} differs between {a} and {b}"
    if (a / "statelog.jsonl").exists() and (b / "statelog.jsonl").exists():
        assert (a / "statelog.jsonl").read_bytes() == (b / "statelog.jsonl").read_bytes(), \
            f"statelog.jsonl differs between {a} and {b}"
    if params:
        pa, pb = torch.load(a / "params.pt"), torch.load(b / "params.pt")
        assert pa.dtype == pb.dtype and pa.shape == pb.shape
        assert torch.equal(pa.view(torch.uint8) if pa.dtype == torch.uint8 else pa, pb), "params.pt differs"

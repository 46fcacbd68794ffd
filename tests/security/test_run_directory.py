"""Finding 4 and torn rows: reading a run directory never runs its code, and tolerates a run killed mid-write.

Each test failed on the code before the fix (docs/security.md).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from controller.inspect import main as inspect_main
from controller.plotcli import main as plot_main
from tests.helpers import FAST, compose_cfg

QUICK = ["strategy=ps_async", "workers=2", "stop.updates=6", "statelog.snapshot_every=1"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    from controller.config import validate
    from controller.observe import Observer
    from controller.run import execute

    d = tmp_path_factory.mktemp("run")
    rc = validate(compose_cfg(FAST + QUICK))
    observer = Observer(rc, d)  # trace.json, statelog.jsonl and its snapshots, as the CLI writes them
    observer.finish(execute(rc, d, observer=observer).summary)
    return d


class _Payload:
    """Pickled, it runs ``exec`` when loaded: what a colleague's hostile run directory could hold."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').write('ran')",)


@pytest.mark.parametrize("nested", [False, True], ids=["target", "nested-target"])
def test_inspect_never_runs_code_a_run_directorys_config_names(run_dir, tmp_path, capsys, nested):
    import shutil

    d = tmp_path / "theirs"
    shutil.copytree(run_dir, d)
    marker = tmp_path / "ran"
    payload = tmp_path / "payload.pkl"
    torch.save(_Payload(marker), payload)  # torch's own format: torch.load(weights_only=False) unpickles it
    load = {"_target_": "torch.load", "f": str(payload), "weights_only": False}
    cfg = yaml.safe_load((d / "config.yaml").read_text())
    cfg["model"] = {"_target_": "mlp", "hidden": load} if nested else load
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert inspect_main([str(d), "--at", "1s", "--write-model", str(tmp_path / "out.pt")]) == 2
    assert not marker.exists(), "inspect ran code named by the run directory"
    err = capsys.readouterr().err
    assert "torch.load" in err and "--trust" in err and "Traceback" not in err


def test_inspect_with_trust_builds_the_model_the_run_names(run_dir, tmp_path):
    assert inspect_main([str(run_dir), "--at", "1s", "--write-model", str(tmp_path / "m.pt"), "--trust"]) == 0
    assert (tmp_path / "m.pt").stat().st_size > 0


def test_inspect_and_plot_read_a_run_whose_last_rows_are_torn(run_dir, tmp_path, capsys):
    import shutil

    d = tmp_path / "killed"
    shutil.copytree(run_dir, d)
    for name, torn in (("metrics.csv", "999,0.000000999,w"), ("eval.csv", "999,0.0"),
                       ("statelog.jsonl", '{"t":999,"vworker":"ps0","ki')):
        with open(d / name, "a") as f:
            f.write(torn)  # the controller was killed in the middle of this row
    # and it never wrote trace.json: its records wait in the spool, the last one torn too
    (d / "trace.json").unlink()
    (d / "trace.records.jsonl").write_text('["c",0,"gradient",0,500000]\n["c",1,"gradient",0,400000]\n["c",2,"up')
    assert inspect_main([str(d), "--at", "250us", "--json"]) == 0
    states = {s["vworker"]: s for s in json.loads(capsys.readouterr().out)["states"]}
    assert states["w0"]["doing"] == "computing gradient" and states["w0"]["source"] == "trace"
    assert plot_main([str(d), "-o", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").stat().st_size > 0

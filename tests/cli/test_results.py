"""Results that survive: summary.json grows with the run, a failed run keeps what it reached, the run
directory is uploaded with fsspec, and the reader pod's tar script (``lockstep fetch``) round-trips."""
from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller import cluster
from tests.helpers import run

ROOT = Path(__file__).resolve().parents[2]


class Watcher:
    """A progress bar that reads summary.json each time rows are written (the collector calls it)."""

    def __init__(self, run_dir: Path, stop_after: int | None = None):
        self.run_dir, self.stop_after = run_dir, stop_after
        self.seen: list[dict] = []
        self.updates = 0

    def update(self, n: int) -> None:
        self.updates += n
        path = self.run_dir / "summary.json"
        if path.exists():
            self.seen.append(json.loads(path.read_text()))
        if self.stop_after is not None and self.updates >= self.stop_after:
            raise KeyboardInterrupt

    def set_postfix_str(self, *a, **kw) -> None:
        pass


def test_summary_json_is_rewritten_as_the_run_goes_and_says_when_it_is_complete(tmp_path):
    watcher = Watcher(tmp_path)
    result = run(tmp_path, ["workers=4", "agents=2", "stop.updates=200", "outputs.summary_every_s=1e-9"],
                 progress=watcher)
    partial = [s for s in watcher.seen if not s["complete"]]
    assert len(partial) >= 3
    updates = [s["updates"] for s in partial]
    assert updates == sorted(updates) and updates[-1] < 200 and len(set(updates)) >= 3
    assert all(s["run_id"] == result.summary["run_id"] for s in partial)
    final = json.loads((tmp_path / "summary.json").read_text())
    assert final["complete"] is True and final["updates"] == 200


def test_a_run_that_stops_keeps_a_partial_summary_that_matches_its_metrics_csv(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, ["workers=4", "agents=2", "stop.updates=100000", "outputs.summary_every_s=0"],
            progress=Watcher(tmp_path, stop_after=150))
    summary = json.loads((tmp_path / "summary.json").read_text())
    rows = (tmp_path / "metrics.csv").read_text().splitlines()[1:]
    assert summary["complete"] is False
    assert summary["updates"] == len(rows) >= 150
    assert summary["virtual_time_ns"] == int(rows[-1].split(",")[0])


def test_a_run_in_a_directory_an_earlier_run_used_leaves_none_of_the_earlier_runs_outputs(tmp_path):
    earlier = {"params.pt": b"old model", "loss.png": b"old plot", "summary.json": b'{"complete": true}',
               "trace.json": b"[]", "statelog.jsonl": b"{}\n", "metrics.prom": b"# old\n",
               "metrics-agent-3.prom": b"# old\n", "endpoints.json": b"{}", "agents/agent-5.log": b"old agent",
               "snapshots/w0-v1.pt": b"old snapshot", "recovery.jsonl": b'{"event": "resumed"}\n',
               "lockstep.log": b"the earlier run's log\n"}
    for name, data in earlier.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(data)
    with pytest.raises(KeyboardInterrupt):  # this run fails: it writes no params.pt, no plot
        run(tmp_path, ["workers=4", "stop.updates=100000", "trace.mode=off", "statelog.enabled=false"],
            progress=Watcher(tmp_path, stop_after=50))
    left = sorted(f.relative_to(tmp_path).as_posix() for f in tmp_path.rglob("*") if f.is_file())
    assert left == ["config.yaml", "eval.csv", "lockstep.log", "metrics.csv", "plan.json", "summary.json"]
    assert (tmp_path / "lockstep.log").read_bytes() == earlier["lockstep.log"]  # a log is appended to
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["complete"] is False
    assert summary["updates"] == len((tmp_path / "metrics.csv").read_text().splitlines()) - 1 >= 50


def test_a_second_controller_in_a_run_directory_in_use_is_refused_and_changes_nothing(tmp_path):
    # two `lockstep resume D` at once: the second truncated the first's finished statelog.jsonl, overwrote its
    # summary.json with complete=false and died of a FileNotFoundError
    from controller.outputs import RunDirLock

    d = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):  # an unfinished run, which `lockstep resume` would go on with
        run(d, ["workers=2", "stop.updates=100000"], progress=Watcher(d, stop_after=3))
    before = {f.name: f.read_bytes() for f in d.iterdir() if f.is_file()}
    with RunDirLock(d):  # another controller runs there
        for args in (["run", "model=mlp", "workers=2", "stop.updates=5", "launcher=inprocess", "progress=false",
                      f"hydra.run.dir={d}"], ["resume", str(d)]):
            p = subprocess.run([sys.executable, "-m", "controller.cli", *args], cwd=ROOT, capture_output=True,
                               text=True, timeout=300)
            assert p.returncode == 2, p.stderr
            assert p.stderr.strip().splitlines()[-1] == (f"lockstep: {d} is in use by another lockstep controller "
                                                         f"(pid {os.getpid()}); accepted: wait for it to end, or "
                                                         "another hydra.run.dir")
    after = {f.name: f.read_bytes() for f in d.iterdir() if f.is_file()}
    assert {name: after.get(name) for name in before} == before  # (Hydra opened an empty lockstep.log)


def test_resume_auto_refuses_overrides_that_change_the_unfinished_runs_config(tmp_path):
    # it resumed with the run's own config.yaml without a word (lr=0.1 asked, 0.005 run), and Hydra's
    # .hydra/overrides.yaml, which lockstep plot labels sweeps with, recorded lr=0.1
    from controller.config import load
    from controller.observe import Observer
    from tests.helpers import FAST

    d = tmp_path / "run"
    mine = [*FAST, "workers=2", "stop.updates=300"]
    with pytest.raises(KeyboardInterrupt):  # with the CLI's observer, so that its plan is the CLI's
        run(d, mine, fast=False, progress=Watcher(d, stop_after=3), observer=Observer(load(mine), d))
    before = sorted(f.relative_to(d) for f in d.rglob("*"))

    def cli(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "controller.cli", "run", *mine, *extra, "recovery.resume=auto",
                               f"hydra.run.dir={d}"], cwd=ROOT, capture_output=True, text=True, timeout=300)

    p = cli("lr=0.1", "seed=7")
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines()[-1].strip() == (
        f"recovery.resume=auto: {d} holds an unfinished run of another config (lr=0.1 here, 0.005 there, seed=7 "
        "here, 0 there), which would resume with its own; accepted: that run's config, or another hydra.run.dir.")
    assert sorted(f.relative_to(d) for f in d.rglob("*")) == before  # nothing written, not even .hydra
    p = cli()  # its own config: resumed
    assert p.returncode == 0, p.stderr
    assert "resuming the unfinished run" in p.stderr
    assert json.loads((d / "summary.json").read_text())["updates"] == 300


def test_a_run_uploads_its_directory_to_an_fsspec_url(tmp_path):
    bucket = tmp_path / "bucket"
    run_dir = tmp_path / "runs" / "exp1"
    p = subprocess.run([sys.executable, "-m", "controller.cli", "run", "model=mlp", "compute=constant",
                        "launcher=inprocess", "progress=false", "workers=2", "stop.updates=20", "eval.every=0",
                        "eval.samples=100", f"outputs.upload=file://{bucket}/lockstep", f"hydra.run.dir={run_dir}"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert f"lockstep: uploaded the run directory to file://{bucket}/lockstep/exp1" in p.stderr
    local = sorted(f.relative_to(run_dir) for f in run_dir.rglob("*") if f.is_file())
    remote = sorted(f.relative_to(bucket / "lockstep" / "exp1") for f in (bucket / "lockstep" / "exp1").rglob("*")
                    if f.is_file())
    assert local == remote and Path("summary.json") in local
    for f in local:
        if f.name != "lockstep.log":  # the log gets the upload's own line after the copy
            assert (run_dir / f).read_bytes() == (bucket / "lockstep" / "exp1" / f).read_bytes()


def test_an_upload_url_that_is_not_one_is_a_config_error(tmp_path):
    p = subprocess.run([sys.executable, "-m", "controller.cli", "run", "outputs.upload=bucket",
                        f"hydra.run.dir={tmp_path / 'r'}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert ("outputs.upload=bucket is not valid; accepted: null or an fsspec URL such as s3://bucket/prefix, "
            "gs://bucket/prefix or file:///path.") in p.stderr


def test_the_reader_pods_tar_script_round_trips_a_run_directory(tmp_path):
    """What runs in the reader pod (through the API's exec, which needs a kubelet): here a local process."""
    src = tmp_path / "results" / "sweep" / "exp1"
    (src / "agents").mkdir(parents=True)
    (src / "summary.json").write_text('{"complete": true}')
    (src / "agents" / "agent-0.log").write_bytes(bytes(range(256)) * 1000)
    p = subprocess.run([sys.executable, "-c", cluster.TAR_SCRIPT, str(src), "exp1"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    names = cluster.extract_tar(base64.b64decode(p.stdout), tmp_path / "out")
    assert sorted(names) == ["exp1", "exp1/agents", "exp1/agents/agent-0.log", "exp1/summary.json"]
    assert (tmp_path / "out" / "exp1" / "agents" / "agent-0.log").read_bytes() == bytes(range(256)) * 1000


def test_a_sweeps_plot_leaves_out_runs_whose_summary_is_not_complete(tmp_path):
    from controller.plotcli import sweep_points

    sweep = tmp_path / "lr"
    for name, complete in (("a", True), ("b", False)):
        (sweep / name).mkdir(parents=True)
        (sweep / name / "summary.json").write_text(json.dumps({"complete": complete, "strategy": "ps_async",
                                                               "workers": 4}))
    assert [i["dir"].name for infos in sweep_points(sweep).values() for i in infos] == ["a"]


def test_a_sweeps_plot_draws_a_line_for_each_value_of_another_swept_key(tmp_path, capsys):
    """A sweep of lr (or faults) beside workers used to join its points into one line per strategy."""
    from controller.plotcli import sweep_points

    sweep = tmp_path / "lr"
    for i, (workers, lr) in enumerate([(2, "0.1"), (4, "0.1"), (2, "0.01"), (4, "0.01")]):
        d = sweep / str(i)
        (d / ".hydra").mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"strategy": "ps_sync", "workers": workers,
                                                   "throughput_samples_per_s": 100.0 * workers}))
        (d / "plan.json").write_text(json.dumps({"network": {"egress": "fair"}}))
        (d / ".hydra" / "overrides.yaml").write_text(f"- workers={workers}\n- lr={lr}\n- stop.updates=5\n"
                                                     f"- hydra.run.dir=x{i}\n")
    groups = sweep_points(sweep)
    assert {k: [i["dir"].name for i in v] for k, v in groups.items()} == {
        ("ps_sync", "fair", "lr=0.1"): ["0", "1"], ("ps_sync", "fair", "lr=0.01"): ["2", "3"]}
    out = tmp_path / "t.png"
    from controller.plotcli import plot_sweep

    (sweep / "4" / ".hydra").mkdir(parents=True)  # a job that failed before its summary
    plot_sweep(sweep, out)
    assert out.stat().st_size > 1000
    assert capsys.readouterr().err == (f"lockstep plot: note: 1 job(s) of {sweep} left out, without a complete "
                                       "summary.json: 4\n")


@pytest.mark.parametrize("out, says", [
    ("nodir/x.png", "-o {d}/nodir/x.png: the folder {d}/nodir does not exist"),
    ("x.foo", "-o {d}/x.foo: the file type '.foo' is not one matplotlib writes; accepted: a name ending in "),
])
def test_lockstep_plot_with_an_output_it_cannot_write_says_so_before_plotting(tmp_path, out, says):
    """Both were tracebacks from savefig, after every plot was drawn."""
    p = subprocess.run([sys.executable, "-m", "controller.cli", "plot", str(tmp_path / "run"), "-o",
                        str(tmp_path / out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"lockstep plot: error: {says.format(d=tmp_path)}" in p.stderr, p.stderr


def _fake_sweep(sweep: Path, points: int = 2) -> None:
    """A sweep's directory as lockstep run --multirun leaves it: each point's summary, plan and metrics."""
    for i in range(points):
        d = sweep / str(i)
        (d / ".hydra").mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps({"strategy": "ps_sync", "workers": 2 * (i + 1), "complete": True,
                                                   "throughput_samples_per_s": 100.0 * (i + 1)}))
        (d / "plan.json").write_text(json.dumps({"network": {"egress": "fair"}}))
        (d / "metrics.csv").write_text("iteration,virtual_time_s,loss\n1,0.5,2.3\n2,1.0,2.1\n")


def _plot(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controller.cli", "plot", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=180)


def test_plot_o_with_two_sweeps_names_each_sweeps_figures_after_it_in_the_format_asked(tmp_path):
    # -o was ignored with two sweeps (each wrote throughput.png into its own directory), and -o u.pdf wrote
    # u-loss.png beside u.pdf
    for name in ("s1", "s2"):
        _fake_sweep(tmp_path / name)
    p = _plot(str(tmp_path / "s1"), str(tmp_path / "s2"), "-o", str(tmp_path / "two.pdf"))
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in tmp_path.glob("two*")) == ["two-s1-loss.pdf", "two-s1.pdf", "two-s2-loss.pdf",
                                                             "two-s2.pdf"]
    assert all(x.read_bytes().startswith(b"%PDF") for x in tmp_path.glob("two*"))
    assert not (tmp_path / "s1" / "throughput.png").exists()


def test_plot_of_a_sweep_with_no_finished_point_says_so(tmp_path):
    sweep = tmp_path / "sw"
    (sweep / "0" / ".hydra").mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    p = _plot(str(sweep))
    assert p.returncode == 2
    assert p.stderr.strip().splitlines()[-1] == (f"lockstep plot: error: {sweep} is a sweep directory with no complete "
                                                 "point yet (no */summary.json): its points are still running, or "
                                                 "failed")


def test_plot_of_a_run_without_an_update_yet_says_so(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "metrics.csv").write_text("iteration,virtual_time_s,loss\n")
    p = _plot(str(run))
    assert p.returncode == 0 and "No artists with labels" not in p.stderr, p.stderr
    assert f"lockstep plot: note: 1 run(s) with no update in metrics.csv yet, not drawn: {run}" in p.stderr

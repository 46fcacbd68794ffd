"""Every conf/experiment/*.yaml runs, shortened; the sweep CLI and `lockstep plot` work end to end."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from controller.plotcli import closed_form_step, sweep_points

CONF = str(Path(__file__).resolve().parents[2] / "conf")

EXPERIMENTS = sorted(p.stem for p in Path(CONF, "experiment").glob("*.yaml"))
SHORT = ["model=mlp", "stop.updates=2", "eval.every=0", "eval.samples=100", "progress=false", "launcher=inprocess"]


def sweep_params(name: str) -> dict[str, list[str]]:
    from controller.config import register_configs

    register_configs()  # (composing the schemas needs them registered, also when this test runs alone)
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(config_name="config", overrides=[f"+experiment={name}"], return_hydra_config=True)
    out = {}
    for key, spec in cfg.hydra.sweeper.params.items():
        spec = str(spec)
        if spec.startswith("range("):
            lo, hi = (int(x) for x in spec[6:-1].split(","))
            values = [str(v) for v in range(lo, hi)]
        else:
            values = spec.split(",")
        out[key] = values
    return out


def test_there_is_one_experiment_per_paper_grid():
    assert {"hybrid2019_table4", "hybrid2019_async_scaling", "throughput_scaling", "fedasync_thesis",
            "gossip_vs_ring"} <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_runs_shortened_at_the_ends_of_its_grid(run, name):
    params = sweep_params(name)
    assert params, f"{name} has no hydra.sweeper.params grid"
    for pick in (0, -1):
        point = [f"{k}={min(int(v[pick]), 4) if k == 'workers' else v[pick]}" for k, v in params.items()]
        ran = run([f"+experiment={name}", *SHORT, *point], fast=False)
        assert ran.summary["updates"] == 2, point
        assert ran.summary["virtual_time_s"] > 0


def test_fedasync_thesis_reruns_with_new_run_ids_have_zero_spread(run):
    base = [f"+experiment=fedasync_thesis", *SHORT, "stop.updates=15"]
    runs = [run([*base, f"run_id=rerun-{i}"], fast=False) for i in (1, 2, 3)]
    strip = [[{k: v for k, v in r.items() if not k.startswith("wall")} for r in x.rows()] for x in runs]
    assert strip[0] == strip[1] == strip[2]
    assert {x.summary["run_id"] for x in runs} == {"rerun-1", "rerun-2", "rerun-3"}
    assert runs[0].params.equal(runs[2].params)
    # heterogeneous batches (10 and 300) under FedAsync: some updates are stale
    assert max(int(r["staleness"]) for r in strip[0]) > 0
    # the experiment really uses its settings: WAN latencies, non-IID data, polynomial a = 0.5
    plan = runs[0].handles[0].core.plan
    assert plan.network.latency.kind == "normal" and plan.workload.partition == "two_class_non_iid"
    assert plan.workload.batch_size == (10,) * 5 + (300,) * 5 and plan.settings["a"] == 0.5


def test_throughput_sweep_matches_the_closed_forms_and_plots(tmp_path):
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "-m", "controller.cli", "run", "--multirun", "+experiment=throughput_scaling",
           "launcher=inprocess", "workers=2,3", "strategy=ps_sync,ring_allreduce", "network.discipline=fifo,fair",
           "stop.updates=3", "eval.samples=100", f"hydra.sweep.dir={sweep}"]
    subprocess.run(cmd, check=True, cwd=Path(CONF).parent, capture_output=True, timeout=600)
    groups = sweep_points(sweep)
    assert set(groups) == {("ps_sync", "fifo"), ("ps_sync", "fair"), ("ring_allreduce", "fifo"),
                           ("ring_allreduce", "fair")}
    form = {("ps_sync", "fifo"): "eq8_fcfs", ("ps_sync", "fair"): "eq7_ps", ("ring_allreduce", "fifo"): "eq11_ring",
            ("ring_allreduce", "fair"): "eq11_ring"}
    for key, infos in groups.items():
        for info in infos:
            step = info["summary"]["virtual_time_ns"] / info["summary"]["updates"] / 1e9
            assert step == pytest.approx(closed_form_step(info, form[key]), rel=1e-6), (key, info["dir"])
    out = tmp_path / "thr.png"
    subprocess.run([sys.executable, "-m", "controller.cli", "plot", str(sweep), "-o", str(out)], check=True,
                   cwd=Path(CONF).parent, capture_output=True, timeout=300)
    assert out.stat().st_size > 10_000 and (tmp_path / "thr-loss.png").exists()
    runs = sorted(p for p in sweep.iterdir() if (p / "summary.json").exists())
    assert json.loads((runs[0] / "summary.json").read_text())["updates"] == 3
    subprocess.run([sys.executable, "-m", "controller.cli", "plot", str(runs[0]), str(runs[1]), "-o",
                    str(tmp_path / "runs.png")], check=True, cwd=Path(CONF).parent, capture_output=True, timeout=300)
    assert (tmp_path / "runs.png").stat().st_size > 10_000

"""The compute-time models of DESIGN §4.2 through real runs."""
from __future__ import annotations

import json

import torch

from tests.helpers import rows, run, without_wall

BASE = ["strategy=ps_sync", "workers=2", "stop.updates=4", "model=mlp", "eval.every=0", "progress=false",
        "launcher=inprocess", "network.bandwidth=1e18", "network.latency=0"]


def test_profiled_measures_ahead_of_time_once_and_reuses_the_database(tmp_path):
    db = tmp_path / "profiles.json"
    first = run(tmp_path / "a", BASE + ["compute=profiled", f"compute.db={db}", "compute.runs=3"], fast=False)
    entries = json.loads(db.read_text())
    (device, sigs), = entries.items()
    assert device.startswith("cpu:") and "threads=1" in device
    kinds = sorted(s.split("|")[0] for s in sigs)
    assert kinds == ["aggregate", "gradient", "update"]
    assert any("MLP" in s and "float32(16, 1, 28, 28)" in s for s in sigs)  # model and batch shape are keyed
    assert first.summary["profile_misses"] == 0 and first.summary["reproducible"] is True
    # a later run reuses the stored medians: same virtual times, byte for byte
    second = run(tmp_path / "b", BASE + ["compute=profiled", f"compute.db={db}"], fast=False)
    assert json.loads(db.read_text()) == entries
    assert without_wall(tmp_path / "a" / "metrics.csv") == without_wall(tmp_path / "b" / "metrics.csv")
    # and the virtual compute time of a gradient is the stored median
    grad_s = next(v for k, v in sigs.items() if k.startswith("gradient|"))
    assert second.summary["compute_virtual_s"]["gradient"] == round(grad_s * 1e9) * 2 * 4 / 1e9


def test_measured_marks_the_run_not_reproducible(tmp_path):
    res = run(tmp_path, BASE + ["compute=measured"], fast=False)
    assert res.summary["reproducible"] is False
    assert res.summary["compute_batch"]["placement_independent"] is False  # not even the same placement twice
    assert res.summary["compute_virtual_s"]["gradient"] > 0


def test_analytic_is_flops_over_peak(tmp_path):
    res = run(tmp_path, BASE + ["compute=analytic", "compute.peak_flops=1e9"], fast=False)
    # MLP 784-200-10 on a batch of 16: forward 2·16·(784·200 + 200·10) FLOPs; backward the same for the
    # weight gradients plus the input gradient of the second layer only (the images need none)
    flops = 2 * (2 * 16 * (784 * 200 + 200 * 10)) + 2 * 16 * 200 * 10
    per_grad_ns = round(flops / 1e9 * 1e9)
    assert res.summary["compute_virtual_s"]["gradient"] == per_grad_ns * 2 * 4 / 1e9
    # update: cost = 2 FLOPs per parameter
    assert res.summary["compute_virtual_s"]["update"] == round(2 * 159010 / 1e9 * 1e9) * 4 / 1e9


def test_speed_factors_scale_each_workers_compute(tmp_path):
    res = run(tmp_path, ["strategy=ps_async", "workers=2", "stop.updates=2", "compute.gradient=0.1",
                         "compute.update=0", "compute.speed=[1.0,3.0]", "network.bandwidth=1e18",
                         "network.latency=0"])
    # w0 finishes its gradient at 0.1 s, w1 at 0.3 s (transfers take under a nanosecond)
    assert [(r["vworker"], r["virtual_time_ns"]) for r in rows(tmp_path / "metrics.csv")] == [
        ("ps0", "100000000"), ("ps0", "200000000")]
    assert torch.is_tensor(res.params)

"""A model's layers, their per-layer profile entries, and where compute.layerwise takes its shares from."""
from __future__ import annotations

import json

import pytest
import torch

from agents.workloads.layers import layer_signature, layer_table
from agents.workloads.models import build_model, param_bytes
from controller.config import load
from controller.plan import make_plan
from controller.predict.costs import layer_costs
from tests.helpers import FAST


def test_the_cnns_layers_in_forward_order_hold_every_parameter_once():
    model = build_model("cnn", 0)
    table = layer_table(model, torch.zeros(16, 1, 28, 28))
    assert [l.name for l in table] == ["conv1", "conv2", "fc1", "fc2", "fc3"]
    assert sorted(i for l in table for i in l.params) == list(range(len(list(model.parameters()))))
    assert sum(l.param_bytes for l in table) == param_bytes(model) == 177704
    assert table[1].input_shape == (16, 6, 12, 12)
    assert table[0].forward_flops == 2 * 16 * 6 * 24 * 24 * 25  # multiply-adds of conv1 on 24x24 outputs
    assert layer_signature(table[2], "forward") == "layer_forward|Linear(in_features=256,out_features=120)|float32(16x256)"


@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet", "flat"])
def test_each_layers_flops_are_what_torchs_flop_counter_counts(name):
    from agents.workloads.layers import _counted_flops

    model = build_model(name, 0)
    sample = torch.randn(4, 1, 28, 28)
    counted = _counted_flops(model, sample)
    for layer in layer_table(model, sample):
        own = counted.get(f"{type(model).__name__}.{layer.name}", counted.get(layer.name, {}))
        assert layer.forward_flops == float(sum(own.values())), layer.name


def _profile(tmp_path, entries):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"name": "p", "signatures": entries}))
    return str(path)


def test_layer_shares_come_from_the_device_profile_when_it_has_every_layer(tmp_path):
    table = layer_table(build_model("mlp", 0), torch.zeros(16, 1, 28, 28))
    entries = {layer_signature(table[0], "forward"): 1.0, layer_signature(table[0], "backward"): 2.0,
               layer_signature(table[1], "forward"): 0.5, layer_signature(table[1], "backward"): 0.5}
    rc = load([*FAST, "compute=profiled", f"compute.profile={_profile(tmp_path, entries)}", "workers=2"],
              check_data=False)
    costs, source = layer_costs(rc, make_plan(rc))
    assert source == "profile"
    assert [(c.forward, c.backward) for c in costs] == [(0.25, 0.5), (0.125, 0.125)]


def test_without_per_layer_entries_the_shares_follow_the_forward_flops(tmp_path):
    rc = load([*FAST, "workers=2", "compute.forward_fraction=0.25"], check_data=False)
    costs, source = layer_costs(rc, make_plan(rc))
    assert source == "flops"
    f1, f2 = 784 * 200, 200 * 10  # multiply-adds of the MLP's two Linear layers
    assert costs[0].forward == pytest.approx(0.25 * f1 / (f1 + f2))
    assert costs[1].backward == pytest.approx(0.75 * f2 / (f1 + f2))


def test_lockstep_profile_layers_writes_times_and_bytes_per_layer(tmp_path):
    import subprocess
    import sys

    out = tmp_path / "prof.json"
    p = subprocess.run([sys.executable, "-m", "controller.cli", "profile", "--name", "t", "--out", str(out), "--layers",
                        "model=mlp", "batch_size=8", "compute.runs=1", "workers=1"], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    d = json.loads(out.read_text())
    rows = d["layers"]["MLP/batch8"]
    assert [(r["name"], r["param_bytes"]) for r in rows] == [("net.1", 628000), ("net.3", 8040)]
    assert all(r["forward_s"] > 0 and r["backward_s"] > 0 for r in rows)
    table = layer_table(build_model("mlp", 0), torch.zeros(8, 1, 28, 28))
    assert d["signatures"][layer_signature(table[0], "forward")] == rows[0]["forward_s"]

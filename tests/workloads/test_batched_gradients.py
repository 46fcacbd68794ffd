"""The batch rule of Training.gradient_at (torch.func.vmap over stacked parameters and batches), on CPU and GPU."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from agents.sim.executor import batch_rule_of
from agents.workloads.training import Training, WorkloadSpec
from tests.helpers import run

GPU = pytest.mark.skipif(not torch.cuda.is_available(),
                         reason="needs a CUDA GPU; this machine has none (the CPU path is tested beside it)")


def _training(model: str, device: str = "cpu") -> Training:
    spec = WorkloadSpec(model={"_target_": model}, data_root=None, partition="iid", partition_kw={},
                        data_holders=("w0",), batch_size=(8,), lr=0.05, momentum=0.0, eval_samples=10,
                        device=device, threads=1, optimizer="sgd")
    return Training(spec, seed=0)


def _calls(tr: Training, n: int) -> list[tuple]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        x, y = tr.batch(np.arange(8) + 8 * i)
        out.append((tr.initial + 0.01 * torch.randn(tr.initial.shape, generator=g), x, y))
    return out


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_the_vmap_rule_gives_each_calls_loss_and_gradient_up_to_rounding(model):
    tr = _training(model)
    assert batch_rule_of(tr.gradient_at) == tr.gradient_at_batched
    calls = _calls(tr, 5)
    batched = tr.gradient_at_batched(calls)
    for (loss, grad), c in zip(batched, calls):
        ref_loss, ref_grad = tr.gradient_at(*c)
        assert grad.shape == ref_grad.shape and grad.device.type == "cpu"
        assert loss == pytest.approx(ref_loss, rel=1e-5)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-6)


def test_a_model_with_frozen_parameters_falls_back_to_one_call_each():
    tr = _training("mlp")
    next(tr.scratch.parameters()).requires_grad_(False)
    calls = _calls(tr, 3)
    for (loss, grad), c in zip(tr.gradient_at_batched(calls), calls):
        ref_loss, ref_grad = tr.gradient_at(*c)
        assert loss == ref_loss and torch.equal(grad, ref_grad)


@pytest.mark.parametrize("model", ["mlp", "cnn", "resnet"])
def test_on_the_cpu_a_row_of_the_rule_is_the_same_whatever_else_is_in_its_batch(model):
    """What makes ``compute.batch=vmap`` placement-independent (docs/batching.md, "Placement"): batches form per
    agent, so a gradient meets other companions with another placement. A batch of one runs as two copies of
    its call: vmap over one row alone takes the CNN's convolution down another path (other last bits)."""
    tr = _training(model)
    calls = _calls(tr, 16)
    whole = tr.gradient_at_batched(calls)
    for lo, n in [(0, 1), (5, 1), (0, 2), (3, 2), (2, 5), (8, 8), (1, 15)]:
        for i, (loss, grad) in enumerate(tr.gradient_at_batched(calls[lo:lo + n])):
            assert loss == whole[lo + i][0] and torch.equal(grad, whole[lo + i][1]), (model, lo, n, i)
    assert tr.batch_rows_independent(calls)


def test_a_rule_whose_rows_depend_on_the_batch_is_found_and_the_summary_says_so(tmp_path, monkeypatch, caplog):
    """The check before the first window (Training.prepare_batches) compares the largest batch any placement can
    form with its first half and its first call: a rule that mixes rows (here: each gradient plus a millionth
    of the batch's mean) fails it, the agent warns, and summary.json says the outputs depend on the placement."""
    rule = Training.gradient_at_batched

    def mixing(self, calls):
        rows = rule(self, calls)
        mean = torch.stack([g for _, g in rows]).mean(0)
        return [(loss, g + 1e-6 * mean) for loss, g in rows]

    tr = _training("mlp")
    assert tr.batch_rows_independent(_calls(tr, 4))
    base = ["strategy=ps_sync", "workers=4", "stop.updates=2", "eval.every=0", "model=mlp", "compute.batch=vmap"]
    fine = run(tmp_path / "fine", base)
    assert fine.summary["compute_batch"]["placement_independent"] is True
    monkeypatch.setattr(Training, "gradient_at_batched", mixing)
    with caplog.at_level("WARNING"):
        mixed = run(tmp_path / "mixed", base)
    assert mixed.summary["compute_batch"]["placement_independent"] is False
    assert "depends on the rest of its batch" in caplog.text


@GPU
def test_on_the_gpu_placement_independent_in_the_summary_holds_where_it_is_claimed(tmp_path):
    """Not established on a GPU (cuBLAS and cuDNN may choose kernels by the batch's size): each agent checks its
    device before the first window, and where summary.json says the outputs do not depend on the placement, one
    agent and two give the same outputs."""
    from tests.distributed.conftest import assert_same_outputs

    base = ["strategy=ps_sync", "workers=8", "stop.updates=10", "batch_size=8", "model=cnn", "device=cuda",
            "compute.batch=vmap", "compute.speed=[1,1.5,2,3,1,1,2,1]", "eval.every=0"]
    one = run(tmp_path / "one", base)
    two = run(tmp_path / "two", base + ["agents=2"])
    claimed = one.summary["compute_batch"]["placement_independent"]
    assert two.summary["compute_batch"]["placement_independent"] == claimed  # the same device, the same check
    print("cuda: rows independent of their batch:", claimed)  # for docs/batching.md, from the next lent GPU
    if claimed:
        assert_same_outputs(tmp_path / "one", tmp_path / "two")


@GPU
def test_the_vmap_rule_runs_on_the_gpu_and_returns_cpu_tensors():
    tr = _training("mlp", device="cuda")
    cpu = _training("mlp")
    calls = _calls(tr, 6)
    torch.cuda.reset_peak_memory_stats()
    batched = tr.gradient_at_batched(calls)
    assert torch.cuda.max_memory_allocated() > 0  # the stacked batch lived on the device
    for (loss, grad), c in zip(batched, calls):
        ref_loss, ref_grad = cpu.gradient_at(*c)
        assert grad.device.type == "cpu" and grad.is_pinned()  # through pinned host memory
        assert loss == pytest.approx(ref_loss, rel=1e-4)
        torch.testing.assert_close(grad, ref_grad, rtol=1e-3, atol=1e-5)


@GPU
def test_vmap_on_the_gpu_trains_like_eager_cpu_within_1e_4(tmp_path):
    base = ["strategy=ps_sync", "workers=8", "stop.updates=20", "batch_size=8", "model=mlp"]
    cpu = run(tmp_path / "cpu", base + ["compute.batch=off"])
    gpu = run(tmp_path / "gpu", base + ["compute.batch=vmap", "device=cuda", "compute.overlap=true"])
    assert gpu.summary["device"].startswith("cuda")
    cb = gpu.summary["compute_batch"]
    assert cb["vmap_batches"] > 0 and cb["largest_batch"] == 8
    assert "gpu_peak_allocated_bytes" in gpu.summary["peak_memory"]
    rel = float((gpu.params - cpu.params).norm() / cpu.params.norm())
    assert rel <= 1e-4, rel
    assert gpu.summary["virtual_time_ns"] == cpu.summary["virtual_time_ns"]  # compute=constant


@GPU
def test_auto_probes_on_the_gpu_and_records_the_device(tmp_path):
    r = run(tmp_path, ["strategy=ps_sync", "workers=8", "stop.updates=3", "model=mlp", "compute.batch=auto",
                       "device=cuda", f"compute.db={tmp_path / 'db.json'}", "compute.max_batch=8"])
    (probes,) = r.summary["compute_batch"]["probes"]
    (sig,) = probes
    assert "/cuda" in sig  # the probe is keyed by the device it measured


_PREPARE = """
import json, sys
from agents.common.plan import Plan
from agents.core import AgentCore
from controller.config import load
from controller.plan import make_plan

core = AgentCore(Plan.from_json(make_plan(load(json.loads(sys.argv[1]))).to_json()), 0)
froms = [p["vmap_from"] for p in core.env.executor.probes.values()]
print(json.dumps([froms, "torch._dynamo" in sys.modules]))
"""


def _prepared(tmp_path, batch: str, extra: tuple[str, ...] = ()) -> list:
    """What an agent holds once built, before its first window: the probe's choices and whether the batch
    rule's first call (which imports torch._dynamo) already ran."""
    import json
    import subprocess
    import sys

    args = ["model=mlp", "workers=4", "stop.updates=4", "eval.every=0", "progress=false",
            f"compute.batch={batch}", f"compute.db={tmp_path / 'db.json'}", *extra]
    out = subprocess.run([sys.executable, "-c", _PREPARE, json.dumps(args)], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_batch_rules_first_call_runs_before_the_first_window_wherever_the_rule_will_run(tmp_path):
    """The rule's first call imports torch's compiler (~800 modules, 1.6 s here, ~3 s on the lent H200). An
    agent makes that call while it prepares wherever the rule will run, so no window pays it; where the rule
    never runs (``loop``, ``auto`` where the loop won, an agent that hosts no gradient), the agent starts
    without the compiler. The case the lent GPU found: ``auto`` whose probe
    figures come from the profile database (an earlier run's), saying vmap wins."""
    import json

    assert _prepared(tmp_path, "vmap") == [[], True]
    assert _prepared(tmp_path, "vmap", ("agents=2", "placement=ps_alone")) == [[], False]  # agent 0: the PS alone
    assert _prepared(tmp_path, "loop") == [[], False]
    db = tmp_path / "db.json"
    assert not db.exists() or "batchprobe" not in db.read_text()
    _prepared(tmp_path, "auto")  # the probe measures loop and vmap, and stores its figures
    figures = json.loads(db.read_text())

    def rule_takes(seconds: float) -> None:
        for device in figures.values():
            for key in device:
                if key.startswith("batchprobe|vmap|"):
                    device[key] = seconds
        db.write_text(json.dumps(figures))

    rule_takes(1.0)  # as with the MLP on this CPU: the rule loses, so it never runs
    assert _prepared(tmp_path, "auto") == [[None], False]
    rule_takes(1e-9)  # as on a GPU: the rule wins at every size
    assert _prepared(tmp_path, "auto") == [[2], True]

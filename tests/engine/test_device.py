"""device=cuda: the GPU path, and its CPU fallback on machines without a GPU."""
from __future__ import annotations

import logging

import pytest
import torch

from tests.helpers import run


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the fallback cannot happen here")
def test_cuda_without_a_gpu_falls_back_to_the_cpu_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        cpu = run(tmp_path / "cpu", ["strategy=ps_sync", "workers=2", "stop.updates=3"])
        cuda = run(tmp_path / "cuda", ["strategy=ps_sync", "workers=2", "stop.updates=3", "device=cuda"])
    assert "device=cuda requested but this agent has no CUDA device" in caplog.text
    assert cuda.summary["device"] == "cpu"
    assert torch.equal(cuda.params, cpu.params)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the CPU fallback is tested above)")
def test_cuda_run_computes_on_the_gpu_and_matches_the_cpu_closely(tmp_path):
    cpu = run(tmp_path / "cpu", ["strategy=ps_sync", "workers=2", "stop.updates=3"])
    gpu = run(tmp_path / "gpu", ["strategy=ps_sync", "workers=2", "stop.updates=3", "device=cuda"])
    assert gpu.summary["device"].startswith("cuda")
    assert gpu.params.device.type == "cpu"  # payloads and results live on the CPU
    torch.testing.assert_close(gpu.params, cpu.params, rtol=1e-4, atol=1e-5)
    assert gpu.summary["virtual_time_ns"] == cpu.summary["virtual_time_ns"]  # compute=constant

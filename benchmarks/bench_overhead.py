"""Emulation overhead (issue 2): the 64-worker async PS run for N updates, against the same N
gradient computations and optimizer steps in a plain Python loop, in one process on this machine.

ratio = wall(lockstep run) / wall(plain loop)   (target <= 1.25)
Run: .venv/bin/python benchmarks/bench_overhead.py [--updates 1000] [--workers 64]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from _common import run  # also puts the repository on sys.path
from agents.workloads.training import Training, WorkloadSpec
from agents.workloads.batches import BatchStream
from agents.workloads.partition import iid


def _config_lr() -> float:
    from controller.config.schema import LockstepConfig

    return LockstepConfig.lr  # the emulated run's learning rate: the loop steps the same way


def plain_loop(updates: int, workers: int, batch: int) -> float:
    """The real work alone: N gradients at the current parameters and N SGD steps."""
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    spec = WorkloadSpec(model={"_target_": "agents.workloads.models.ThesisCNN"}, data_root=None, partition="iid",
                        partition_kw={}, data_holders=("w0",), batch_size=(batch,), lr=_config_lr(), momentum=0.0,
                        eval_samples=1, device="cpu", threads=1, optimizer="sgd")
    tr = Training(spec, seed=0)
    model, opt = tr.new_model()
    shards = iid(len(tr.data.train_y), workers, 0)
    streams = [BatchStream(shards[i], batch, 0, i) for i in range(workers)]
    for i in range(updates):
        x, y = tr.batch(next(streams[i % workers]))
        _, g = tr.gradient_at(tr.flat(model), x, y)
        tr.apply(model, opt, g)
    return time.perf_counter() - t0


def emulated(updates: int, workers: int, batch: int) -> float:
    overrides = [f"workers={workers}", f"stop.updates={updates}", f"batch_size={batch}", "compute=constant",
                 "eval.every=0", "eval.samples=1", "launcher=inprocess", "trace.mode=off", "statelog.enabled=false"]
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        run(Path(d), overrides, local=False)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--updates", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    # warm both paths first: the data set, torch's lazy imports and the profile of the first calls
    # are process-wide caches that would otherwise favour whichever side runs second
    plain_loop(a.workers + 1, a.workers, a.batch)
    emulated(a.workers + 1, a.workers, a.batch)
    loop = min(plain_loop(a.updates, a.workers, a.batch) for _ in range(a.repeat))
    emu = min(emulated(a.updates, a.workers, a.batch) for _ in range(a.repeat))
    print(f"{a.updates} updates, {a.workers} workers, CNN batch {a.batch} (best of {a.repeat})")
    print(f"plain loop   {loop:8.2f} s")
    print(f"lockstep run {emu:8.2f} s")
    print(f"overhead ratio {emu / loop:.3f}  (target <= 1.25)")


if __name__ == "__main__":
    main()

"""The GPU path (issue 11): 256 vworkers of the thesis CNN, ps_async, on one GPU — compute.batch=auto vs off.

Needs a CUDA GPU (it says so and exits 0 without one; this repository's CI machine has none). Each
side runs in a fresh process, interleaved, best of REPEATS; while a run goes on, this process samples
the GPU's utilisation (``nvidia-smi``, every 0.1 s) to estimate its busy share of the wall time.
Targets: updates/s with auto >= 10x off; GPU busy >= 70 % of the wall time. It also prints vworkers per
GPU (256 here) beside the published anchors: FedScale runs about 20 clients per GPU; Flower places
fractional-GPU actors (e.g. ``num_gpus=0.1``: 10 per GPU).
usage: python benchmarks/bench_gpu.py [UPDATES] [REPEATS] [WORKERS]
"""
from __future__ import annotations

import subprocess
import sys
import threading

from _common import fresh_runs, load_average


class GpuSampler:
    """Samples ``nvidia-smi --query-gpu=utilization.gpu`` on a thread while a run goes on."""

    def __init__(self, period_s: float = 0.1):
        self.period_s, self.samples, self._stop = period_s, [], threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                      "-i", "0"], capture_output=True, text=True, timeout=5).stdout
                self.samples.append(float(out.strip().splitlines()[0]))
            except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
                pass

    def __enter__(self) -> "GpuSampler":
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    def busy(self) -> float:
        """Mean utilisation (0..1) over the samples (the share of time a kernel was running)."""
        return sum(self.samples) / len(self.samples) / 100.0 if self.samples else float("nan")


def main() -> None:
    import torch

    if not torch.cuda.is_available():
        print("bench_gpu: no CUDA GPU on this machine; nothing measured (run it on a machine with one)")
        return
    updates = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    common = ["launcher=inprocess", "agents=1", "device=cuda", f"workers={workers}", "strategy=ps_async",
              f"stop.updates={updates}", "trace.mode=off", "eval.every=0"]
    fresh_runs({"warm": common + ["compute.batch=auto", "stop.updates=2"]}, 1)  # profile and probe, once
    best: dict[str, tuple[dict, float]] = {}
    for i in range(repeats):
        for name in ("off", "auto"):
            with GpuSampler() as g:
                (s,) = fresh_runs({name: common + [f"compute.batch={name}"]}, 1)[name]
            if name not in best or s["wall_time_s"] < best[name][0]["wall_time_s"]:
                best[name] = (s, g.busy())
    (off, busy_off), (auto, busy_auto) = best["off"], best["auto"]
    cb = auto["compute_batch"]
    print(f"bench_gpu: {workers} vworkers (thesis CNN, ps_async) on {torch.cuda.get_device_name(0)}, {updates} "
          f"updates, best of {repeats}: off {updates / off['wall_time_s']:.1f} updates/s (GPU busy "
          f"{busy_off:.0%}), auto {updates / auto['wall_time_s']:.1f} updates/s (GPU busy {busy_auto:.0%}): "
          f"{off['wall_time_s'] / auto['wall_time_s']:.2f}x (target >= 10x, busy >= 70 %); batches mean "
          f"{cb.get('mean_batch', 0):.1f}, largest {cb.get('largest_batch')}; {workers} vworkers per GPU vs "
          f"FedScale ~20 clients per GPU; load average {load_average()}")


if __name__ == "__main__":
    main()

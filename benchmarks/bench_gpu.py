"""The GPU path (issue 11): 256 vworkers of the thesis CNN, ps_async, on one GPU — compute.batch=auto vs off.

Needs a CUDA GPU (it says so and exits 0 without one; this repository's CI machine has none). Each
side runs in a fresh process, interleaved, best of REPEATS; while a run goes on, this process samples
the GPU's utilisation (``nvidia-smi``, every 0.1 s) to estimate its busy share of the wall time.
Targets: updates/s with auto >= 10x off; GPU busy >= 70 % of the wall time. It also prints vworkers per
GPU (256 here) beside the published anchors: FedScale runs about 20 clients per GPU; Flower places
fractional-GPU actors (e.g. ``num_gpus=0.1``: 10 per GPU).
usage: python benchmarks/bench_gpu.py [UPDATES] [REPEATS] [WORKERS] [--cpu] [--strategy=NAME] [--set k=v,...]
(``--cpu``: the same runs with ``device=cpu``, to check the benchmark itself on a machine without a GPU;
``--strategy=ps_sync``: another strategy than ps_async, e.g. one whose gradients coincide in virtual time;
``--set network=datacenter_25g``: overrides for both sides, e.g. a network on which ps_async's gradients
coincide too.)
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time

from _common import fresh_runs, load_average


class GpuSampler:
    """Samples ``nvidia-smi --query-gpu=utilization.gpu`` on a thread while a run goes on."""

    def __init__(self, period_s: float = 0.1):
        self.period_s, self.samples, self._stop = period_s, [], threading.Event()  # (time.time(), percent)
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                      "-i", "0"], capture_output=True, text=True, timeout=5).stdout
                self.samples.append((time.time(), float(out.strip().splitlines()[0])))
            except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
                pass

    def __enter__(self) -> "GpuSampler":
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()

    def busy(self, start: float, end: float) -> float:
        """Mean utilisation (0..1) of the samples taken in [start, end] (the share of time a kernel ran)."""
        xs = [u for t, u in self.samples if start <= t <= end]
        return sum(xs) / len(xs) / 100.0 if xs else float("nan")


def main() -> None:
    import torch

    device = "cpu" if "--cpu" in sys.argv else "cuda"
    strategy = next((a.split("=", 1)[1] for a in sys.argv if a.startswith("--strategy=")), "ps_async")
    if device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no CUDA GPU on this machine; nothing measured (run it on a machine with one)")
        return
    extra = sys.argv[sys.argv.index("--set") + 1].split(",") if "--set" in sys.argv else []
    args = [a for i, a in enumerate(sys.argv[1:]) if not a.startswith("--") and sys.argv[i] != "--set"]
    updates = int(args[0]) if args else 3000
    repeats = int(args[1]) if len(args) > 1 else 2
    workers = int(args[2]) if len(args) > 2 else 256
    common = ["launcher=inprocess", "agents=1", f"device={device}", f"workers={workers}", f"strategy={strategy}",
              f"stop.updates={updates}", "trace.mode=off", "eval.every=0", *extra]
    fresh_runs({"warm": common + ["compute.batch=auto", "stop.updates=2"]}, 1)  # profile and probe, once
    best: dict[str, tuple[dict, float]] = {}
    for i in range(repeats):
        for name in ("off", "auto"):
            with GpuSampler() as g:
                (s,) = fresh_runs({name: common + [f"compute.batch={name}"]}, 1)[name]
            t0, t1 = s["t_execute"]
            busy = (g.busy(t1 - s["wall_barrier_s"], t1), g.busy(t0, t1))
            print(f"  {name}: {updates / s['wall_time_s']:.1f} updates/s, GPU busy {busy[0]:.0%} of the window loop "
                  f"({s['wall_barrier_s']:.1f} s), {busy[1]:.0%} of execute ({t1 - t0:.1f} s)", flush=True)
            if name not in best or s["wall_time_s"] < best[name][0]["wall_time_s"]:
                best[name] = (s, busy)
    (off, busy_off), (auto, busy_auto) = best["off"], best["auto"]
    cb = auto["compute_batch"]
    rate = {k: (updates / v[0]["wall_time_s"], updates / v[0]["wall_barrier_s"]) for k, v in best.items()}
    where = torch.cuda.get_device_name(0) if device == "cuda" else "the CPU"
    print(f"bench_gpu: {workers} vworkers (thesis CNN, {strategy}{', ' + ','.join(extra) if extra else ''}) on {where}, {updates} "
          f"updates, best of {repeats}\n"
          f"  off:  {rate['off'][0]:.1f} updates/s whole run, {rate['off'][1]:.1f} in the window loop; GPU busy "
          f"{busy_off[0]:.0%} of the loop, {busy_off[1]:.0%} of execute\n"
          f"  auto: {rate['auto'][0]:.1f} updates/s whole run, {rate['auto'][1]:.1f} in the window loop; GPU busy "
          f"{busy_auto[0]:.0%} of the loop, {busy_auto[1]:.0%} of execute\n"
          f"  auto / off: {rate['auto'][0] / rate['off'][0]:.2f}x whole run, {rate['auto'][1] / rate['off'][1]:.2f}x "
          f"window loop (target >= 10x; GPU busy >= 70 %); batches mean {cb.get('mean_batch', 0):.1f}, largest "
          f"{cb.get('largest_batch')}, {cb.get('vmap_tasks')} of {cb.get('tasks')} tasks by vmap; the probe: "
          f"vmap from batches of {[p.get('vmap_from') for a in cb.get('probes', []) for p in a.values()]}, "
          f"switched to loop {cb.get('switched_to_loop')}\n"
          f"  {workers} vworkers on one GPU vs FedScale ~20 clients per GPU, Flower num_gpus=0.1: 10 per GPU; "
          f"load average {load_average()}")


if __name__ == "__main__":
    main()

"""The batch rule for gradients (``Training.gradient_at_batched``, DESIGN §4.2) against a loop of the same calls.

For each model and batch size n it times, in one process, interleaved, best of REPEATS:

* ``loop``: n calls of ``Training.gradient_at`` (what ``compute.batch=loop`` runs);
* ``vmap``: the rule — ``torch.func.vmap`` over the stacked *flat* parameters, split into tensors inside the
  vmapped function;
* ``vmap_split``: the variant that splits the stacked parameters into per-tensor stacks *outside* vmap (a
  dict of batched tensors in, a dict of gradients out, concatenated back).

and prints the times and the ratios to the loop (below 1: the rule is faster), with the largest difference
between the two rules' gradients. The calls are the ``auto`` probe's (``Training.probe_calls``).
usage: python benchmarks/bench_vmap_rule.py [REPEATS] [--models mlp,cnn] [--sizes 4,8,16,64] [--threads 1]
       [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import time

from _common import load_average


def main() -> None:
    import torch
    import torch.nn.functional as F
    from torch.func import functional_call, grad_and_value, vmap

    from agents.workloads.training import Training
    from controller.config import load
    from controller.plan import make_plan

    ap = argparse.ArgumentParser(description="the gradient batch rule against a loop")
    ap.add_argument("repeats", nargs="?", type=int, default=7)
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--sizes", default="4,8,16,64")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    repeats = a.repeats
    torch.set_num_threads(a.threads)
    sizes = [int(s) for s in a.sizes.split(",")]
    lines = []
    for model_name in a.models.split(","):
        over = ([] if model_name == "cnn" else [f"model={model_name}"]) + [f"device={a.device}"]
        plan = make_plan(load(over))
        tr = Training(plan.workload, plan.seed)
        model = tr.scratch
        named = list(model.named_parameters())
        names, shapes, numels = [n for n, _ in named], [p.shape for _, p in named], [p.numel() for _, p in named]

        def loss(params, x, y):
            return F.cross_entropy(functional_call(model, params, (x,)), y)

        split_rule = vmap(grad_and_value(loss))

        def vmap_split(calls):
            dev = tr.device
            ps, xs, ys = (torch.stack([c[i] for c in calls]).to(dev) for i in range(3))
            b = ps.shape[0]
            grads, losses = split_rule({n: t.reshape(b, *s) for n, t, s in zip(names, ps.split(numels, dim=1), shapes)},
                                       xs, ys)
            return torch.cat([grads[n].reshape(b, -1) for n in names], dim=1).cpu(), losses.cpu()

        variants = {"loop": lambda calls: [tr.gradient_at(*c) for c in calls],
                    "vmap": tr.gradient_at_batched, "vmap_split": vmap_split}
        for n in sizes:
            calls = tr.probe_calls(plan.workload.batch_size[0])(n)  # a worker's batch, as the probe uses
            best = {k: float("inf") for k in variants}
            for f in variants.values():
                f(calls)  # warm-up
            for _ in range(repeats):
                for k, f in variants.items():
                    t0 = time.perf_counter()
                    f(calls)
                    best[k] = min(best[k], time.perf_counter() - t0)
            a = torch.stack([g for _, g in tr.gradient_at_batched(calls)])
            diff = float((a - vmap_split(calls)[0]).abs().max())
            lines.append(f"{model_name} n={n}: loop {best['loop'] * 1e3:.2f} ms, vmap {best['vmap'] * 1e3:.2f} ms "
                         f"({best['vmap'] / best['loop']:.2f}x the loop), vmap_split {best['vmap_split'] * 1e3:.2f} ms "
                         f"({best['vmap_split'] / best['loop']:.2f}x); rules differ by {diff:.1e}")
    print(f"bench_vmap_rule: best of {repeats}, {torch.get_num_threads()} thread(s), load average {load_average()}\n  "
          + "\n  ".join(lines))


if __name__ == "__main__":
    main()

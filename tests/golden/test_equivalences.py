"""Golden equivalences of DESIGN §5 and rerun identity."""
from __future__ import annotations

import numpy as np
import torch

from agents.workloads.batches import BatchStream
from agents.workloads.data import load_fashion_mnist
from agents.workloads.models import build_model, flat_params, gradient
from agents.workloads.partition import iid
from tests.helpers import rows, run, without_wall


def test_sync_ps_equals_large_batch_sgd(tmp_path):
    K, b, steps, lr, seed = 4, 8, 5, 0.1, 3
    res = run(tmp_path, ["strategy=ps_sync", f"workers={K}", f"batch_size={b}", f"stop.updates={steps}",
                         f"lr={lr}", f"seed={seed}"])
    # plain SGD with batch K·b on the same samples: the union of the workers' batches, step by step
    data = load_fashion_mnist()
    shards = iid(len(data.train_y), K, seed)
    streams = [BatchStream(shards[k], b, seed, k) for k in range(K)]  # worker wk has vworker id k
    model = build_model({"_target_": "agents.workloads.models.MLP", "hidden": [200]}, seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for _ in range(steps):
        idx = torch.from_numpy(np.concatenate([next(s) for s in streams]))
        _, grads = gradient(model, data.train_x[idx], data.train_y[idx])
        for p, g in zip(model.parameters(), grads):
            p.grad = g
        opt.step()
    expected = flat_params(model)
    assert not torch.equal(expected, flat_params(build_model({"_target_": "agents.workloads.models.MLP"}, seed)))
    torch.testing.assert_close(res.params, expected, rtol=1e-5, atol=1e-6)


# With one worker every strategy equals plain SGD: tests/strategies/test_equivalences.py (every strategy).


def test_rerun_gives_byte_identical_outputs_except_wall_columns(tmp_path):
    args = ["strategy=ps_async", "workers=6", "stop.updates=30", "eval.every=10", "network.latency=0.002",
            "compute=distribution", "compute.params=[-4.0,0.5]"]
    a = run(tmp_path / "a", args)
    b = run(tmp_path / "b", args)
    for name in ("metrics.csv", "eval.csv"):
        assert without_wall(tmp_path / "a" / name) == without_wall(tmp_path / "b" / name)
    assert torch.equal(a.params, b.params)
    assert a.summary["virtual_time_ns"] == b.summary["virtual_time_ns"]
    # and the draws are really random: another seed moves the times
    c = run(tmp_path / "c", args + ["seed=7"])
    assert rows(tmp_path / "c" / "metrics.csv")[0]["virtual_time_ns"] != rows(tmp_path / "a" / "metrics.csv")[0]["virtual_time_ns"]
    assert c.summary["reproducible"] is True

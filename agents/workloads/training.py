"""What the vworkers of one agent share to train for real: data, shards, a scratch model.

Workers hold only flat parameter vectors (the payloads they receive); gradients
are computed on one scratch model per agent, so a 10 000-vworker agent keeps
one model, not ten thousand. The functions passed to ``Worker.compute`` are
bound methods of this object, and their profile key includes the model's name.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from agents.sim.compute import resolve_device
from agents.sim.executor import batch_rule
from agents.workloads.batches import BatchStream
from agents.workloads.data import Dataset, load_fashion_mnist
from agents.workloads.models import (build_model, evaluate, flat_params, gradient, optimizer, param_bytes,
                                     set_flat_params, step)
from agents.workloads.partition import partition

__all__ = ["WorkloadSpec", "Training"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkloadSpec:
    """The resolved workload of a run (plain values, identical on every agent; the config has the defaults)."""

    model: dict[str, Any]  # {"_target_": ..., **kwargs}
    data_root: str | None
    partition: str  # iid | dirichlet | two_class_non_iid
    partition_kw: dict[str, Any]
    data_holders: tuple[str, ...]  # vworkers that own a shard, in shard order
    batch_size: tuple[int, ...]  # per data holder
    lr: float
    momentum: float
    eval_samples: int
    device: str
    threads: int  # torch intra-op threads of each agent process
    optimizer: str  # sgd | adam: what the model holder (PS, learner) steps with
    data_placement: str = "local"  # local | end_devices (agents.workloads.datanet)
    cache: str = "none"  # none | lru: each training vworker's node caches fetched samples
    cache_size: int = 3000  # samples
    data_servers: dict[str, list[str]] = field(default_factory=dict)  # worker -> its end devices
    memory: str = "auto"  # auto | compact | fast: the allocator of each agent process (agents.core.use_memory)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (the plan travels to agents as JSON)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "WorkloadSpec":
        return cls(**{**d, "data_holders": tuple(d["data_holders"]), "batch_size": tuple(d["batch_size"])})


class Training:
    """Shared training state of one agent."""

    def __init__(self, spec: WorkloadSpec, seed: int, data: Dataset | None = None):
        self.spec, self.seed = spec, seed
        self.data = data if data is not None else load_fashion_mnist(spec.data_root)
        self.device = torch.device(resolve_device(spec.device))
        self.scratch = build_model(spec.model, seed).to(self.device)
        self._params = list(self.scratch.parameters())  # kept: walking the modules costs every call
        # the initial parameters as strategies send them (flat, on the CPU: Training.flat); profiling and the
        # auto probe call gradient_at with them, so their calls look like the run's (same batch key)
        self.initial = flat_params(self.scratch).cpu().clone()
        self.model_name = type(self.scratch).__name__
        self.model_bytes = param_bytes(self.scratch)
        labels = self.data.train_y.numpy()
        self.shards = partition(spec.partition, labels, len(spec.data_holders), seed, **spec.partition_kw)
        self._rank = {name: i for i, name in enumerate(spec.data_holders)}
        n_eval = min(spec.eval_samples, len(self.data.test_y))
        self.test_x, self.test_y = self.data.test_x[:n_eval], self.data.test_y[:n_eval]
        # the scratch model is shared by every call below; a background executor thread may run them
        self.lock = threading.RLock()
        self._vmapped: Callable[..., Any] | None = None
        self._streams = threading.local()  # a CUDA stream per thread that computes (GPU agents)

    def __getstate__(self) -> dict[str, Any]:
        """For a checkpoint (agents.checkpoint): no lock, thread-local streams or compiled vmap; the test
        set is a view of the data set, which the checkpoint refers to rather than holds."""
        state = dict(self.__dict__)
        for k in ("lock", "_streams", "_vmapped", "test_x", "test_y", "_params"):
            state.pop(k)
        state["_n_eval"] = len(self.test_y)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        n_eval = state.pop("_n_eval")
        self.__dict__.update(state)
        self.test_x, self.test_y = self.data.test_x[:n_eval], self.data.test_y[:n_eval]
        self.lock = threading.RLock()
        self._vmapped = None
        self._streams = threading.local()
        self._params = list(self.scratch.parameters())

    # the profile database keys compute calls by function and shapes; add the model's identity
    @property
    def profile_name(self) -> str:
        return f"{self.model_name}/{self.model_bytes}B/{self.device.type}"

    def shard_size(self, vworker: str) -> int:
        """Samples in ``vworker``'s shard."""
        return len(self.shards[self._rank[vworker]])

    def batch_size(self, vworker: str) -> int:
        return self.spec.batch_size[self._rank[vworker]]

    def stream(self, vworker: str, vid: int) -> BatchStream:
        """The keyed stream of index batches over ``vworker``'s shard."""
        rank = self._rank[vworker]
        return BatchStream(self.shards[rank], self.spec.batch_size[rank], self.seed, vid)

    def batch(self, indices: np.ndarray) -> tuple[Tensor, Tensor]:
        idx = torch.from_numpy(indices)
        return self.data.train_x[idx], self.data.train_y[idx]

    def new_model(self) -> tuple[nn.Module, torch.optim.Optimizer]:
        """A model holding the initial parameters, and its optimizer (for a PS or a local learner)."""
        model = build_model(self.spec.model, self.seed).to(self.device)
        return model, optimizer(self.spec.optimizer, model.parameters(), self.spec.lr, self.spec.momentum)

    # ---- the compute functions (each is a real computation, timed by the compute model)
    @batch_rule("gradient_at_batched")
    def gradient_at(self, params: Tensor, x: Tensor, y: Tensor) -> tuple[float, Tensor]:
        """Loss and flat gradient of the model at ``params`` on batch ``(x, y)``."""
        with self.lock:
            set_flat_params(self.scratch, params, self._params)
            loss, grads = gradient(self.scratch, x, y, self._params)
            # payloads live on the CPU: they cross agents as raw bytes (a no-op copy on a CPU agent)
            return loss, torch.cat([g.reshape(-1) for g in grads]).cpu()

    def gradient_at_batched(self, calls: list[tuple[Tensor, Tensor, Tensor]]) -> list[tuple[float, Tensor]]:
        """:meth:`gradient_at` of many (params, x, y) at once: ``torch.func.vmap`` over the stacked
        parameters and batches (``functional_call`` + ``grad_and_value``), equal up to float rounding.

        On a GPU the stacked inputs go through pinned host memory and the batch runs on a CUDA stream
        of the calling thread; the gradients come back as rows of one CPU tensor.

        On the CPU a row is the same to the bit whatever else is in the batch, from two rows up
        (``tests/workloads/test_batched_gradients.py``); a batch of one would take other kernels (the
        CNN's convolution), so it runs as two copies of its call and keeps the first row.
        """
        if self._vmapped is None:
            self._vmapped = self._make_vmapped()
        if self._vmapped is False:  # frozen parameters: no rule over the flat vector, a loop it is
            return [self.gradient_at(*c) for c in calls]
        if len(calls) == 1:
            return self.gradient_at_batched([calls[0], calls[0]])[:1]
        ps = torch.stack([c[0] for c in calls])
        xs = torch.stack([c[1] for c in calls])
        ys = torch.stack([c[2] for c in calls])
        dev = self.device
        with self.lock:
            if dev.type != "cuda":
                grads, losses = self._vmapped(ps, xs, ys)
                return list(zip(losses.tolist(), grads.unbind(0)))
            stream = getattr(self._streams, "stream", None)
            if stream is None:
                stream = self._streams.stream = torch.cuda.Stream(dev)
            with torch.cuda.stream(stream):
                ps, xs, ys = (t.pin_memory().to(dev, non_blocking=True) for t in (ps, xs, ys))
                grads, losses = self._vmapped(ps, xs, ys)
                out = torch.empty(grads.shape, dtype=grads.dtype, pin_memory=True)
                out.copy_(grads, non_blocking=True)
                host_losses = losses.to("cpu", non_blocking=True)
            stream.synchronize()
            return list(zip(host_losses.tolist(), out.unbind(0)))

    def _make_vmapped(self) -> Callable[..., Any] | bool:
        from torch.func import functional_call, grad_and_value, vmap

        named = list(self.scratch.named_parameters())
        if any(not p.requires_grad for _, p in named):
            return False
        names = [n for n, _ in named]
        shapes = [p.shape for _, p in named]
        sizes = [p.numel() for _, p in named]
        model = self.scratch

        def loss(flat: Tensor, x: Tensor, y: Tensor) -> Tensor:
            params = {n: t.view(s) for n, t, s in zip(names, flat.split(sizes), shapes)}
            return F.cross_entropy(functional_call(model, params, (x,)), y)

        return vmap(grad_and_value(loss))

    def probe_calls(self, batch_size: int) -> Callable[[int], list[tuple[Tensor, Tensor, Tensor]]]:
        """For the executor's ``auto`` probe: ``n`` distinct gradient calls of ``batch_size`` samples."""

        def make(n: int) -> list[tuple[Tensor, Tensor, Tensor]]:
            g = torch.Generator().manual_seed(n)
            out = []
            for i in range(n):
                idx = (np.arange(batch_size) * (i + 1) + i) % len(self.data.train_y)
                x, y = self.batch(idx)
                out.append((self.initial + 1e-3 * torch.randn(self.initial.shape, generator=g), x, y))
            return out

        return make

    @staticmethod
    def apply(model: nn.Module, opt: torch.optim.Optimizer, grad: Tensor) -> None:
        """One optimizer step with the flat gradient ``grad``."""
        offset = 0
        for p in model.parameters():
            n = p.numel()
            g = grad[offset:offset + n].view_as(p)  # a view, no copy: the optimizers only read p.grad
            p.grad = g if g.device == p.device else g.to(p.device)
            offset += n
        step(opt)

    @staticmethod
    def aggregate(grads: list[Tensor], weights: list[float] | None = None) -> Tensor:
        """The (weighted) mean of flat tensors, summed in list order."""
        if weights is None:
            out = grads[0].clone()
            for g in grads[1:]:
                out += g
            return out / len(grads)
        total = float(sum(weights))
        out = grads[0] * (weights[0] / total)
        for g, w in zip(grads[1:], weights[1:]):
            out += g * (w / total)
        return out

    def evaluate(self, model_or_params: nn.Module | Tensor) -> tuple[float, float]:
        """Test loss and accuracy (an observer: real compute, no virtual time)."""
        if isinstance(model_or_params, Tensor):
            with self.lock:
                set_flat_params(self.scratch, model_or_params, self._params)
                return evaluate(self.scratch, self.test_x, self.test_y)
        return evaluate(model_or_params, self.test_x, self.test_y)

    @staticmethod
    def flat(model: nn.Module) -> Tensor:
        """A fresh CPU copy of the model's parameters (what is sent)."""
        return flat_params(model).cpu()

    def profile(self, compute: Any, workers: int) -> None:
        """Ahead-of-time profile (DESIGN §4.2, Tianshu) of the calls strategies make."""
        for b in sorted(set(self.spec.batch_size)):
            idx = np.arange(b) % len(self.data.train_y)
            xb, yb = self.batch(idx)
            compute.profile("gradient", self.gradient_at, (self.initial, xb, yb))
        model, opt = self.new_model()
        g = torch.zeros_like(self.initial)
        compute.profile("update", self.apply, (model, opt, g))
        compute.profile("aggregate", self.aggregate, ([g] * max(1, workers), None))

    def prepare_batches(self, executor: Any, compute: Any, local_holders: int, holders: int) -> None:
        """Before the first window: ``compute.batch=auto`` lets the executor time loop against vmap for the
        gradient calls; wherever the batch rule will run (``vmap``, or ``auto`` where it won), the rule runs
        once on probe calls. Its first call imports torch's compiler (``torch._dynamo``, sympy: about
        800 modules, 1.6 s on the 2-core VM and 3-4 s on the lent H200), which otherwise lands in the first
        window that batches — inside the timed run, once the probe's figures come from the profile
        database (docs/benchmarks.md, "Sixth loan"). The values are dropped; nothing random is drawn.
        ``local_holders`` counts the data-holding vworkers on this agent, ``holders`` those of the run.

        With ``vmap`` that call is also the check behind ``placement_independent`` in summary.json: the
        largest batch any placement of the run's ``holders`` can form, its first half and its first call
        alone must give the same rows to the bit (:meth:`batch_rows_independent`); the result is kept
        in ``executor.rows_independent``."""
        from agents.sim.compute import signature

        sizes = [n for n in (2, 4, 8, 16, 32, 64, 128, 256, 512) if n <= max(2, local_holders)]
        for b in sorted(set(self.spec.batch_size)):
            make = self.probe_calls(b)
            if executor.spec.batch == "vmap":
                if not local_holders:  # no gradient runs here (placement=ps_alone's PS agent): no rule either
                    continue
                n = max(2, min(executor.spec.max_batch, holders))
                same = self.batch_rows_independent(make(n))
                executor.rows_independent = same and executor.rows_independent is not False
                if not same:
                    log.warning("compute.batch=vmap: on %s a row of the batch rule depends on the rest of its "
                                "batch, so the outputs depend on how the vworkers are placed on agents "
                                "(summary.json: placement_independent false)", self.device)
                continue
            if executor.spec.batch == "auto":
                sig = signature("gradient", self.gradient_at, make(1)[0])
                executor.probe(sig, self.gradient_at, make, sizes, db=compute.db, device=compute.device)
                if executor.probes.get(sig, {}).get("vmap_from") is None:
                    continue
            if min(executor.spec.max_batch, local_holders) >= 2:
                self.gradient_at_batched(make(2))

    def batch_rows_independent(self, calls: list[tuple[Tensor, Tensor, Tensor]]) -> bool:
        """Whether :meth:`gradient_at_batched` gives each of ``calls`` the same loss and gradient, to the bit,
        in the whole batch, in its first half and alone (docs/batching.md, "Placement")."""
        whole = self.gradient_at_batched(calls)
        for part in {1, (len(calls) + 1) // 2}:
            for (loss, grad), (loss_w, grad_w) in zip(self.gradient_at_batched(calls[:part]), whole):
                if loss != loss_w or not torch.equal(grad, grad_w):
                    return False
        return True

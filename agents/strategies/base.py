"""What every strategy shares: the vworker layout, and a worker that trains on its shard."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents.checkpoint import continues, finishes
from agents.common.units import parse_duration
from agents.sim.types import seconds_to_ns
from agents.sim.worker import Worker

__all__ = ["VWorkerSpec", "Strategy", "TrainingWorker", "layout_of"]


@dataclass(frozen=True)
class VWorkerSpec:
    """One vworker of the plan: its name, the class that runs it (dotted path) and plain kwargs."""

    name: str
    cls: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    holds_data: bool = False


_last_layout: tuple[Any, list[VWorkerSpec]] | None = None


def layout_of(strategy: type["Strategy"], workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
    """``strategy.layout(workers, settings)``, kept for the next call with the same arguments: one ``lockstep
    run`` lays out its vworkers when the CLI validates the configuration, when Hydra's task validates it again,
    and when the plan is made (100 000 FedAvg clients: 0.33-0.38 s each, docs/benchmarks.md). The specs are
    frozen and shared, the list a fresh copy. Only the last layout is kept (a sweep runs one after another)."""
    global _last_layout
    key = (strategy, workers, repr(settings))  # plain data: equal reprs, equal settings (a miss only costs time)
    if _last_layout is None or _last_layout[0] != key:
        _last_layout = (key, strategy.layout(workers, settings))
    return list(_last_layout[1])


class Strategy:
    """A gradient-exchange algorithm: lays out vworkers; their classes do the rest.

    ``result`` names the vworker whose model is the run's final model.
    """

    name: str = ""
    result: str = "ps0"

    @classmethod
    def layout(cls, workers: int, settings: dict[str, Any]) -> list[VWorkerSpec]:
        raise NotImplementedError  # pragma: no cover - abstract

    @classmethod
    def result_for(cls, workers: int, settings: dict[str, Any]) -> str:
        """The result vworker for these settings (``result`` unless a strategy says otherwise)."""
        return cls.result


class TrainingWorker(Worker):
    """A Worker with helpers for the common cases: batches, gradients, updates, evaluation."""

    def __init__(self, name: str, vid: int, env: Any, **kwargs: Any):
        super().__init__(name, vid, env)
        self.settings = env.settings
        self.training = env.workload
        self._stream = None
        self.model = None  # set by holders of a model (PS, local learners)
        self.opt = None

    def next_batch(self):
        if self._stream is None:
            self._stream = self.training.stream(self.name, self.id)
        return self.training.batch(next(self._stream))

    async def fetch_batch(self):
        """The next batch; with ``data.placement=end_devices`` it travels from the end devices first."""
        if self.training.spec.data_placement == "local":
            return self.next_batch()
        from agents.workloads.datanet import fetch_batch

        return await fetch_batch(self)

    async def gradient(self, params):
        """Forward+backward at ``params`` on the next batch: ``(loss, flat_grad, samples)``."""
        x, y = await self.fetch_batch()
        return await self._gradient_on(params, x, y)

    async def _gradient_on(self, params, x, y):
        seq = self.compute_seq
        loss_grad = await self.compute(self.training.gradient_at, params, x, y, kind="gradient")
        return self._gradient_done(seq, y, *loss_grad)

    def _gradient_done(self, seq: int, y, loss, grad):
        if self.env.faults.byzantine:  # a Byzantine worker corrupts the gradient it then uses and sends
            grad = self.env.faults.corrupt(self.id, seq, self.now, grad)
        return loss, grad, len(y)

    async def repeat(self, step: Any) -> None:
        """``await step()`` until it returns True (the run stops): a strategy's loop, one await to continue from."""
        while True:
            if await step():
                return

    async def local_step(self) -> tuple[float, int]:
        """A gradient at this vworker's parameters and an optimizer step with it: ``(loss, samples)``."""
        loss, grad, samples = await self.gradient(self.flat())
        return await self._apply_then(grad, (loss, samples))

    async def _apply_then(self, grad, result: Any) -> Any:
        await self.apply(grad)
        return result

    async def train_local(self, steps: int, acc: tuple[int, float, int] = (0, 0.0, 0)) -> tuple[int, float, int]:
        """:meth:`local_step` until ``steps`` are done; ``acc``: (steps done, the sum of their losses, samples)."""
        while acc[0] < steps:
            acc = _counted(acc, *await self.local_step())
        return acc

    async def apply(self, grad):
        """One optimizer step on this vworker's model (kind ``update``)."""
        await self.compute(self.training.apply, self.model, self.opt, grad, kind="update",
                           cost=2.0 * grad.numel())

    async def aggregate(self, grads, weights=None):
        """Mean of flat tensors (kind ``aggregate``), summed in the given order."""
        return await self.compute(self.training.aggregate, grads, weights, kind="aggregate",
                                  cost=float(len(grads) * grads[0].numel()))

    async def start_late(self, first: str) -> None:
        """``strategy.start_after``: ``first`` (rank 0: a ring's first member, the PS) starts that long after
        the others."""
        start_after = self.setting("start_after")
        if start_after and self.name == first:
            await self.sleep(seconds_to_ns(parse_duration(start_after, "strategy.start_after")))

    def make_model(self) -> None:
        self.model, self.opt = self.training.new_model()

    def flat(self):
        """This vworker's parameters as one flat tensor (a new tensor, safe to send)."""
        return self.training.flat(self.model)

    def load(self, params) -> None:
        """Copy flat ``params`` into this vworker's model (creating it on first use)."""
        from agents.workloads.models import set_flat_params

        if self.model is None:
            self.make_model()
        set_flat_params(self.model, params)

    def setting(self, key: str, default: Any = None) -> Any:
        """A strategy setting from the config (``strategy.<key>``), or ``default`` when unset/null."""
        v = self.settings.get(key)
        return default if v is None else v

    def updated(self, version: int, loss: float, staleness: int, samples: int, nbytes: int) -> bool:
        """Record a global update; run the evaluation observer; True when the stop condition fired."""
        self.env.recorder.update(self, version, loss, staleness, samples, nbytes)
        every = self.settings.get("eval_every", 0)
        stop = self.settings.get("stop_updates")
        done = stop is not None and version >= stop
        if done or (every and version % every == 0):
            self.evaluate(version)
        if done:
            self.stop_run()
        return done

    def evaluate(self, version: int) -> None:
        """Observer: test loss/accuracy of this vworker's model, taking no virtual time."""
        loss, acc = self.training.evaluate(self.model)
        self.env.recorder.evaluation(self, version, loss, acc)


def _counted(acc: tuple[int, float, int], loss: float, samples: int) -> tuple[int, float, int]:
    return acc[0] + 1, acc[1] + loss, acc[2] + samples


# ------------------------------------------------------------------ checkpoints (agents.checkpoint)
# The rest of each frame above, for a coroutine rebuilt from a checkpoint (keep each in step with its method).
finishes(TrainingWorker.fetch_batch)


@continues(TrainingWorker.gradient)
async def _(f: dict[str, Any], value: Any, below: str) -> Any:
    if below == "fetch_batch":
        return await f["self"]._gradient_on(f["params"], *value)
    return value


@continues(TrainingWorker._gradient_on)
async def _(f: dict[str, Any], value: Any, below: str) -> Any:
    return f["self"]._gradient_done(f["seq"], f["y"], *value)


finishes(TrainingWorker.apply, None)
finishes(TrainingWorker.aggregate)
finishes(TrainingWorker.start_late, None)


@continues(TrainingWorker.repeat)
async def _(f: dict[str, Any], stop: bool, below: str) -> None:
    if not stop:
        return await f["self"].repeat(f["step"])


@continues(TrainingWorker.local_step)
async def _(f: dict[str, Any], value: Any, below: str) -> tuple[float, int]:
    if below == "gradient":
        loss, grad, samples = value
        return await f["self"]._apply_then(grad, (loss, samples))
    return value


@continues(TrainingWorker._apply_then)
async def _(f: dict[str, Any], value: Any, below: str) -> Any:
    return f["result"]


@continues(TrainingWorker.train_local)
async def _(f: dict[str, Any], value: Any, below: str) -> tuple[int, float, int]:
    return await f["self"].train_local(f["steps"], _counted(f["acc"], *value))

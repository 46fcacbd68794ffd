"""The per-agent environment a vworker sees: network, compute model, workload and recorder."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from agents.sim.compute import ComputeModel, ComputeSpec
from agents.sim.executor import Executor, ExecutorSpec
from agents.sim.faults import Faults, FaultSpec
from agents.sim.kernel import PRIO_NET, Kernel
from agents.sim.network import Network, NetworkSpec, Transfer
from agents.sim.records import OWN_KINDS, check_custom_record
from agents.sim.tcp import TcpNetwork
from agents.sim.types import VirtualTime
from agents.sim.worker import SendHandle

if TYPE_CHECKING:  # pragma: no cover
    from agents.sim.worker import Worker

__all__ = ["usable_cpus", "Environment", "Recorder", "RowKey", "UpdateRow", "EvalRow", "UPDATE_COLUMNS",
           "EVAL_COLUMNS", "Stats"]


class RowKey(NamedTuple):
    """Orders rows the same whatever the placement: virtual time, vworker id, that vworker's row counter."""

    time: VirtualTime
    vworker_id: int
    n: int


class UpdateRow(NamedTuple):
    """One global model update: a row of metrics.csv."""

    virtual_time_ns: VirtualTime
    virtual_time_s: float
    vworker: str
    iteration: int
    loss: float
    staleness: int
    samples: int
    bytes: int
    wall_time_s: float


class EvalRow(NamedTuple):
    """One evaluation of the global model: a row of eval.csv."""

    virtual_time_ns: VirtualTime
    virtual_time_s: float
    vworker: str
    iteration: int
    test_loss: float
    test_accuracy: float
    wall_time_s: float


UPDATE_COLUMNS = UpdateRow._fields
EVAL_COLUMNS = EvalRow._fields


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, e.g. a container's cpuset)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


@dataclass
class Stats:
    """Counters of one agent (summed by the controller)."""

    events: int = 0
    messages_local: int = 0
    messages_remote: int = 0
    bytes_local: int = 0
    bytes_remote: int = 0
    compute_wall_s: dict[str, float] = field(default_factory=dict)
    compute_virtual_ns: dict[str, int] = field(default_factory=dict)

    def merge(self, other: "Stats") -> None:
        self.events += other.events
        self.messages_local += other.messages_local
        self.messages_remote += other.messages_remote
        self.bytes_local += other.bytes_local
        self.bytes_remote += other.bytes_remote
        for k, v in other.compute_wall_s.items():
            self.compute_wall_s[k] = self.compute_wall_s.get(k, 0.0) + v
        for k, v in other.compute_virtual_ns.items():
            self.compute_virtual_ns[k] = self.compute_virtual_ns.get(k, 0) + v


class Recorder:
    """Rows of one agent, each keyed by (virtual time, vworker id, vworker's row counter).

    Sorting by that key gives the same global order whatever the placement; wall
    times are kept in ``wall_*`` columns that comparisons ignore.
    """

    def __init__(self, wall_start: float | None = None):
        self.updates: list[tuple] = []  # (t, vid, n, row-tuple without wall) + wall
        self.evals: list[tuple] = []
        self.events: list[tuple] = []  # free-form per-vworker records for the state log / trace
        self._n: dict[int, int] = {}
        self.wall_start = time.perf_counter() if wall_start is None else wall_start
        self.listeners: list[Any] = []  # objects with on_update(row) / on_eval(row)

    def _key(self, t: VirtualTime, w: "Worker") -> RowKey:
        n = self._n.get(w.id, 0) + 1
        self._n[w.id] = n
        return RowKey(t, w.id, n)

    def update(self, w: "Worker", iteration: int, loss: float, staleness: int, samples: int, nbytes: int) -> None:
        t = w.now
        row = UpdateRow(t, t / 1e9, w.name, int(iteration), float(loss), int(staleness), int(samples), int(nbytes),
               round(time.perf_counter() - self.wall_start, 6))
        self.updates.append((self._key(t, w), row))
        for li in self.listeners:
            li.on_update(row)

    def evaluation(self, w: "Worker", iteration: int, loss: float, accuracy: float) -> None:
        t = w.now
        row = EvalRow(t, t / 1e9, w.name, int(iteration), float(loss), float(accuracy),
               round(time.perf_counter() - self.wall_start, 6))
        self.evals.append((self._key(t, w), row))
        for li in self.listeners:
            li.on_eval(row)

    def event(self, w: "Worker", kind: str, **fields: Any) -> None:
        """A record for the state log (or the trace): kind plus plain-value fields. A kind of the strategy's
        own is checked here, where its author calls it (agents.sim.records.check_custom_record)."""
        if kind not in OWN_KINDS:
            check_custom_record(kind, fields)
        self.events.append((self._key(w.now, w), kind, w.name, fields))

    def drain(self) -> tuple[list, list, list]:
        """Hand over (and forget) the rows recorded so far."""
        u, e, ev = self.updates, self.evals, self.events
        self.updates, self.evals, self.events = [], [], []
        return u, e, ev


class Environment:
    """What a vworker reaches through ``self.env``; one per agent, built from the run's plan."""

    def __init__(self, kernel: Kernel, names: list[str], network: NetworkSpec, compute: ComputeSpec,
                 recorder: Recorder | None = None, workload: Any = None, seed: int = 0,
                 settings: dict[str, Any] | None = None, tracer: Any = None, statelog: Any = None,
                 threads: int = 1, faults: FaultSpec | None = None, waits_for_peers: bool = False):
        self.kernel = kernel
        self.names = names
        self.ids = {n: i for i, n in enumerate(names)}
        self.seed = seed
        self.workload = workload
        self.settings = settings or {}
        self.recorder = recorder or Recorder()
        self.stats = Stats()
        # wall seconds per (vworker, kind) of eager calls, for metrics.per_worker (AgentCore sets it to a dict)
        self.worker_wall_s: dict[tuple[str, str], float] | None = None
        self.tracer = tracer  # agents.observe.trace.Tracer, or None
        self.statelog = statelog  # agents.observe.statelog.StatelogSpec, or None
        self.faults = Faults(faults or FaultSpec(), seed)
        self.compute = ComputeModel(compute)
        self.compute.faults = self.faults if self.faults.stragglers else None
        # deferred, batched compute (DESIGN §4.2); ``measured`` needs each call's own wall time
        self.executor: Executor | None = None
        if compute.batch != "off" and compute.model != "measured":
            overlap = compute.overlap
            if overlap == "auto":
                # A background thread pays only where the agent's own thread would otherwise wait: an agent
                # process beside other agents waits for their windows. Alone (in-process, or one agent) that
                # thread never waits, and a second thread computing beside it contends for the GIL: measured on
                # 2 cores, 3 000 updates, in one process: +15 % wall on the MLP, no gain on the default CNN
                # (bench_batching.py --thread; docs/benchmarks.md, issue 11). And it needs a core to run on.
                overlap = waits_for_peers and usable_cpus() >= 2
            self.executor = Executor(ExecutorSpec(compute.batch, compute.max_batch, bool(overlap)),
                                     threads=threads)
        self.network: Any
        if network.tcp is not None:  # the tcp transport model (star only: validate refuses tcp with a topology)
            self.network = TcpNetwork(kernel, network, self)
        elif network.topology is not None:  # links and routes beyond the NICs (agents.sim.topology)
            from agents.sim.topology import TopologyNetwork

            self.network = TopologyNetwork(kernel, network, self)
        else:
            self.network = Network(kernel, network, self)

    def resolve(self, dst: str | int) -> int:
        if isinstance(dst, int):
            if not 0 <= dst < len(self.names):
                raise KeyError(f"no vworker with id {dst} (there are {len(self.names)})")
            return dst
        try:
            return self.ids[dst]
        except KeyError:
            raise KeyError(f"no vworker named {dst!r}") from None

    # ------------------------------------------------------------- faults
    def hold(self, w: "Worker", dst: int, payload: Any, nbytes: int | None, tag: Any,
             until: VirtualTime) -> SendHandle:
        """A send across a partition: it enters the network when the partition heals, at ``until``."""
        outer = SendHandle(self.kernel, None)
        self.kernel.schedule(until, PRIO_NET, w, self._release, (w, dst, payload, nbytes, tag, outer))
        return outer

    def _release(self, held: tuple) -> None:
        """The partition healed: a held send enters the network (a bound method and a tuple, not a closure,
        so that a checkpoint can save the pending event)."""
        w, dst, payload, nbytes, tag, outer = held
        inner = self.network.send(w, dst, payload, nbytes, tag)
        if inner.done_at is not None:
            outer.finish(inner.done_at)
        else:
            inner.then = outer

    def deliver(self, w: "Worker", msg: Any, tr: Transfer, t: VirtualTime) -> None:
        """Hand a message the network delivered to ``w``, unless a fault loses or duplicates it."""
        faults = self.faults
        copies = 1
        if faults.any:
            if faults.crashes and getattr(w, "on_crash", "freeze") == "restart" and faults.down(w.id, t):
                return  # a crashed process receives nothing
            copies = faults.drops(tr.src, tr.dst, tr.seq, tr.sent_at)
            if copies == 0:
                return
        self.on_deliver(w, tr, t)
        w.deliver(msg)
        if copies == 2:
            twin = type(msg)(msg.src, msg.dst, msg.tag, msg.payload, msg.nbytes, msg.sent_at, msg.seq)
            twin.delivered_at = msg.delivered_at
            w.deliver(twin)

    # hooks called by the kernel side; cheap when tracing is off
    def on_send(self, w: "Worker", tr: Transfer, remote: bool) -> None:
        s = self.stats
        if remote:
            s.messages_remote += 1
            s.bytes_remote += tr.nbytes
        else:
            s.messages_local += 1
            s.bytes_local += tr.nbytes
        if self.tracer is not None:
            self.tracer.send(w, tr)

    def on_deliver(self, w: "Worker", tr: Transfer, t: VirtualTime) -> None:
        if self.tracer is not None:
            self.tracer.deliver(w, tr, t)

    def on_compute(self, w: "Worker", kind: str, t0: VirtualTime, t1: VirtualTime, wall_s: float) -> None:
        s = self.stats
        s.compute_wall_s[kind] = s.compute_wall_s.get(kind, 0.0) + wall_s
        s.compute_virtual_ns[kind] = s.compute_virtual_ns.get(kind, 0) + (t1 - t0)
        if self.worker_wall_s is not None and wall_s:
            key = (w.name, kind)
            self.worker_wall_s[key] = self.worker_wall_s.get(key, 0.0) + wall_s
        if self.tracer is not None:
            self.tracer.compute(w, kind, t0, t1)

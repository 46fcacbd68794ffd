"""One agent's engine, independent of transport: a kernel, its vworkers, and window stepping.

The in-process launcher calls :class:`AgentCore` directly; the agent process
(``lockstep agent``) wraps the same object behind gRPC. Either way the
controller only calls :meth:`AgentCore.advance`.
"""
from __future__ import annotations

import logging

import torch
from dataclasses import dataclass, field
from typing import Any

from agents.sim.env import Environment, EvalRow, Recorder, Stats
from agents.sim.kernel import Kernel, RemoteEvent
from agents.common.plan import Plan
from agents.strategies import TrainingWorker, import_path
from agents.observe.trace import tracer_for
from agents.workloads.training import Training
from agents.sim.types import INFINITY, VirtualTime

__all__ = ["AgentCore", "Reached", "peak_memory", "process_cpu_s"]

log = logging.getLogger(__name__)


@dataclass
class Reached:
    """What an agent reports after a window (DESIGN §5 step 3)."""

    next_time: VirtualTime
    outbound: list[RemoteEvent]
    stop_time: VirtualTime | None
    horizon: VirtualTime  # Kernel.output_bound(): the earliest time it could act on another agent
    updates: list[tuple] = field(default_factory=list)
    evals: list[tuple] = field(default_factory=list)
    events: list[tuple] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)


def peak_memory(device: str | None = None) -> dict[str, int]:
    """This process's peak resident memory (bytes) and, on a GPU, the device's peak allocation."""
    import resource

    out = {"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
    if device is not None and device.startswith("cuda") and torch.cuda.is_available():
        out["gpu_peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(torch.device(device)))
    return out


def process_cpu_s() -> float:
    """CPU seconds this process has used so far, user and system, every thread."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


PARKED_SHOWN = 8
"""A run that ends with no event left names this many of its parked vworkers (the lowest ids)."""

COMPACT_FROM_VWORKERS = 1000
"""``memory=auto`` makes an agent's allocator compact from this many vworkers on (docs/engine.md, *Scale*)."""
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
COMPACT_MMAP_THRESHOLD = 128 * 1024
PASSING_MMAP_THRESHOLD = 64 << 20  # while a compact agent takes a checkpoint's pieces (passing_buffers)
PASSING_TRIM_THRESHOLD = 1 << 30


def use_memory(mode: str, vworkers: int) -> bool:
    """Apply ``memory=mode`` to this process's allocator; True when it is now compact.

    compact: every allocation of 128 KiB or more — every tensor worth returning — gets its own mapping and goes
    back to the OS when freed (``mallopt(M_MMAP_THRESHOLD, 128 KiB)``, which also stops glibc from raising the
    threshold after the first such free, exactly as ``MALLOC_MMAP_THRESHOLD_=131072`` does). Without it glibc
    serves later tensors from a heap whose freed middle is never given back: 10 000 ps_async vworkers peaked at
    8.46 GiB instead of 6.70 GiB (docs/benchmarks.md, issue 11). It costs a page fault per page of each fresh
    tensor (~17 % more CPU on the default CNN), so ``auto`` keeps glibc's default below
    ``COMPACT_FROM_VWORKERS`` vworkers per agent. ``fast`` leaves the allocator as it is. (A compact agent leaves
    compact only while it takes a restore's pieces: :func:`passing_buffers`.)
    """
    if mode == "fast" or (mode == "auto" and vworkers < COMPACT_FROM_VWORKERS):
        return False
    try:
        return bool(_libc().mallopt(M_MMAP_THRESHOLD, COMPACT_MMAP_THRESHOLD))
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to set
        log.warning("memory=%s: this C library has no mallopt; its allocator is left as it is", mode)
        return False


def _libc() -> Any:
    import ctypes
    import ctypes.util

    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def passing_buffers(on: bool) -> bool:
    """In a compact process: serve buffers of up to 64 MiB from the heap and keep the freed ones (on), or go back to
    compact and hand the heap's free memory back to the OS (off); True when the setting took.

    For what passes through a compact agent and is gone a moment later: the 4 MiB pieces of a checkpoint it
    restores, copied three times on their way from gRPC to the tensors they fill. In its own mapping each
    copy costs a page fault per 4 KiB page (64 pieces copied twice: 132 224 faults, against 1 979 this way;
    docs/benchmarks.md, "Restoring the agents side by side"); from the heap the next piece reuses the pages of the
    last. Only while nothing long-lived is allocated:
    a tensor allocated meanwhile would land in the heap and pin it (:func:`use_memory`)."""
    try:
        libc = _libc()
        if on:
            return bool(libc.mallopt(M_TRIM_THRESHOLD, PASSING_TRIM_THRESHOLD)
                        and libc.mallopt(M_MMAP_THRESHOLD, PASSING_MMAP_THRESHOLD))
        took = bool(libc.mallopt(M_MMAP_THRESHOLD, COMPACT_MMAP_THRESHOLD)
                    and libc.mallopt(M_TRIM_THRESHOLD, COMPACT_MMAP_THRESHOLD))
        libc.malloc_trim(0)
        return took
    except (OSError, AttributeError):  # not glibc: use_memory left the allocator as it is
        return False


class AgentCore:
    """Builds the vworkers placed on ``agent_id`` and runs them window by window."""

    def __init__(self, plan: Plan, agent_id: int, data: Any = None, tracer: Any = None,
                 recorder: Recorder | None = None, metrics: Any = None, own_process: bool = False):
        self.plan, self.agent_id = plan, agent_id
        self.metrics = metrics  # an agents.observe.metrics.Metrics of role "agent", or None
        if tracer is None:
            tracer = tracer_for(plan.trace)
        # one intra-op thread per agent: tiny per-vworker batches gain nothing from more, and
        # oversubscribed cores make PyTorch's spinning threads 50x slower (measured: 2.6 ms vs 149 ms)
        torch.set_num_threads(plan.workload.threads)
        self.kernel = Kernel()
        self.local = plan.local_ids(agent_id)
        wl = plan.workload
        self.compact_memory = use_memory(wl.memory, len(self.local))  # before the vworkers allocate anything
        self.window_cpu_s: float | None = None  # CPU seconds of the thread that ran the direct windows (agents/mesh.py)
        classes = {vid: import_path(plan.vworkers[vid].cls) for vid in self.local}
        needs_training = any(issubclass(c, TrainingWorker) for c in classes.values())
        self.training = Training(wl, plan.seed, data=data) if needs_training else None
        self.env = Environment(self.kernel, plan.names, plan.network, plan.compute,
                               recorder=recorder, workload=self.training, seed=plan.seed,
                               settings=plan.settings, tracer=tracer, statelog=plan.statelog,
                               threads=plan.workload.threads, faults=plan.faults,
                               waits_for_peers=own_process and plan.n_agents >= 2)
        if self.training is not None and self.env.compute.spec.model == "profiled":
            self.training.profile(self.env.compute, workers=len(wl.data_holders))
        ex = self.env.executor
        if ex is not None and self.training is not None and ex.spec.batch in ("auto", "vmap"):
            holders = set(wl.data_holders)
            self.training.prepare_batches(ex, self.env.compute, sum(plan.names[v] in holders for v in self.local),
                                          len(holders))
        self.workers = {}
        for vid in self.local:
            spec = plan.vworkers[vid]
            w = classes[vid](spec.name, vid, self.env, **spec.kwargs)
            self.workers[spec.name] = w
            self.kernel.add_worker(w, self.env.compute.start_at(vid))
            if self.env.faults:
                self.env.faults.install(self.kernel, w, spec.kwargs, self.env.network)
        if getattr(metrics, "per_worker", False):  # lockstep_worker_compute_seconds_total{vworker,kind}
            self.env.worker_wall_s = {}
            if self.env.executor is not None:
                self.env.executor.worker_wall_s = {}
        if plan.stop_virtual_time_ns is not None:
            self.kernel.stop_at(plan.stop_virtual_time_ns)
        lookahead = plan.lookahead()
        if plan.n_agents > 1 and 0 < lookahead < INFINITY:
            self.kernel.reply_lookahead = lookahead  # see controller.clock: per-agent window ends

    def next_time(self) -> VirtualTime:
        return self.kernel.next_time()

    def output_bound(self) -> VirtualTime:
        return self.kernel.output_bound()

    def advance(self, window_end: VirtualTime, inbound: list[RemoteEvent] = (),
                stop_at: VirtualTime | None = None, max_events: int | None = None) -> Reached:
        """Inject ``inbound``, run every event before ``window_end``, report (DESIGN §5)."""
        k = self.kernel
        if stop_at is not None:
            k.stop_at(stop_at)
        for ev in inbound:
            k.inject(ev)
        before = k.events_processed
        nxt = k.run_until(window_end, max_events=max_events)
        out, k.outbox = k.outbox, []
        updates, evals, events = self.env.recorder.drain()
        stats = self._stats_delta(k.events_processed - before)
        if self.metrics is not None:
            self._observe(stats)
        return Reached(nxt, out, k.stop_time if k.stop_time is not None and k.stop_time < INFINITY else None,
                       k.output_bound(), updates, evals, events, stats)

    def _observe(self, d: Stats) -> None:
        """Move the agent's Prometheus metrics by one window's stats (DESIGN §9)."""
        m = self.metrics
        m.set_virtual_time(self.kernel.now)
        m.add_events(d.events)
        m.add_messages(d.messages_local, d.bytes_local, remote=False)
        m.add_messages(d.messages_remote, d.bytes_remote, remote=True)
        for kind, wall in d.compute_wall_s.items():
            m.add_compute(kind, wall, d.compute_virtual_ns.get(kind, 0))
        if self.env.worker_wall_s is not None:
            walls, self.env.worker_wall_s = self.env.worker_wall_s, {}
            if self.env.executor is not None:
                for key, wall in self.env.executor.drain_worker_wall().items():
                    walls[key] = walls.get(key, 0.0) + wall
            for (name, kind), wall in sorted(walls.items()):
                m.add_worker_compute(name, kind, wall)

    def _stats_delta(self, events: int) -> Stats:
        """The counters of this window: hand over the environment's and start new ones (like rows)."""
        d, self.env.stats = self.env.stats, Stats()
        d.events = events
        if self.env.executor is not None:  # deferred tasks count their wall time when they run
            for kind, wall in self.env.executor.drain_wall().items():
                d.compute_wall_s[kind] = d.compute_wall_s.get(kind, 0.0) + wall
        return d

    def result_params(self):
        """Flat final parameters of the plan's result vworker, when it lives here."""
        w = self.workers.get(self.plan.result)
        if w is None or getattr(w, "model", None) is None:
            return None
        return self.training.flat(w.model)

    def info(self) -> dict[str, Any]:
        c = self.env.compute
        device = str(self.training.device) if self.training is not None else None
        ex = self.env.executor
        return {"profile_misses": c.profile_misses, "profile_fallbacks": c.profile_fallbacks,
                "reproducible": c.reproducible, "device": device,
                "executor": ex.info() if ex is not None else None, "parked": self.parked(),
                "memory": {**peak_memory(device), "compact": self.compact_memory}, "cpu_s": process_cpu_s(),
                "window_cpu_s": self.window_cpu_s,
                # the virtual time of the last event this agent ran (0: none): where a run that ran out of events
                # ended (controller.run.stall_sentence)
                "last_event_ns": self.kernel.now}

    def parked(self, first: int = PARKED_SHOWN) -> dict[str, Any]:
        """How many of this agent's vworkers are parked (in ``recv`` or ``wait``), and the ``first`` of them
        by vworker id with what each waits for: the controller merges them by id, so the names it shows
        do not depend on the placement."""
        parked = [(w.id, f"{w.name} in {on}") for w in sorted(self.workers.values(), key=lambda w: w.id)
                  if (on := w.parked_on()) is not None]
        return {"count": len(parked), "first": parked[:first]}

    def close(self) -> None:
        """Stop the executor's background thread (the vworkers are done)."""
        if self.env.executor is not None:
            self.env.executor.close()

    def final_eval(self, t: VirtualTime, iteration: int) -> tuple | None:
        """Observer: evaluate the result vworker's model at the end; an eval row, or None."""
        import time as _time

        w = self.workers.get(self.plan.result)
        if w is None or getattr(w, "model", None) is None:
            return None
        loss, acc = self.training.evaluate(w.model)
        wall = round(_time.perf_counter() - self.env.recorder.wall_start, 6)
        return EvalRow(t, t / 1e9, w.name, int(iteration), float(loss), float(acc), wall)

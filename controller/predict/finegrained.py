"""The fine-grained model: Algorithm 2.1 of "Predicting Throughput of Distributed SGD" over per-layer traces.

An SGD step is a graph of operations (§2.2): for each layer ``i`` (forward order) a
downlink of its parameters, its forward pass (after its downlink and the previous
forward), its backward pass (after the next layer's backward; the last after the last
forward), an uplink of its gradient (after its backward), and the PS's update. Each
operation runs on a resource: a worker's compute (``WORKER``), the PS's downlink or uplink
(shared by all workers), or the PS itself. A worker runs at most one operation per
resource at a time, in the order they became ready (``scheduler[w, r]``); an operation
progresses at the rate ``SHARE`` gives it:

* links: ``fcfs`` — the first active worker has the whole link; ``ps`` — the active
  workers share it equally; ``all_reduce`` — every worker has its whole link (ring);
  each flow additionally capped at ``flow_cap`` bytes/s (§4.4: 10 Gbit/s per flow on AWS);
* ``WORKER``: the whole device, or ``1 − allreduce_share`` of it while one of the
  worker's all-reduces runs (Tianshu §3.3: an all-reduce occupies 16 of a V100's 80 SMs).

Decentralised (ring) SGD skips the downlinks and turns each uplink into an all-reduce of
``2(K−1)/K · size/B`` (§3.2.2); synchronous SGD starts the next step only when every worker
has finished (line 36). Where the paper's pseudo-code is loose this implementation decides:

* a step is over when *all* its operations are done (line 31 checks only the ready
  queues, which are empty while operations still wait for dependencies);
* the PS applies one update at a time (FCFS), as lockstep's PS does, and a synchronous
  PS aggregates and applies once per round, after every uplink;
* a one-way latency ``L`` follows every link operation before its dependents may start
  (an all-reduce pays its ``2(K−1)`` latencies inside, as the ring's steps do); the paper has none.

Identical workers of a synchronous step under ``ps`` or ``all_reduce`` sharing stay in
lockstep, so one of them stands for all (``weight``): a 10 000-worker synchronous
prediction costs what one worker's does. Times are float nanoseconds.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field

__all__ = ["Trace", "SimWorker", "FineResult", "simulate", "LINK_MODELS"]

LINK_MODELS = ("fcfs", "ps", "all_reduce")
NS = 1e9

WORKER, DOWN, UP, PS, AR = "worker", "downlink", "uplink", "ps", "allreduce"


@dataclass(frozen=True)
class SimWorker:
    """One simulated worker (or ``weight`` identical ones): per-layer forward/backward ns, batch, NIC rates."""

    forward_ns: tuple[float, ...]
    backward_ns: tuple[float, ...]
    batch: int
    weight: int = 1


@dataclass(frozen=True)
class Trace:
    """What Algorithm 2.1 needs besides the workers: the architecture and the shared resources."""

    arch: str  # "ps" | "ring"
    mode: str  # "async" | "sync"
    link: str  # fcfs | ps | all_reduce
    layer_bytes: tuple[int, ...]  # parameter bytes per layer, forward order
    bandwidth_down: float  # bytes/s of the PS's egress (ring: each worker's link)
    bandwidth_up: float  # bytes/s of the PS's ingress
    latency_ns: float = 0.0
    update_ns: float = 0.0  # T_S: one optimizer step
    aggregate_ns: float = 0.0  # sync PS: one aggregation of K gradients; ring: one chunk addition
    workers_total: int = 1  # K (for the all-reduce's 2(K−1)/K)
    flow_cap: float | None = None  # bytes/s per flow
    allreduce_share: float = 0.0


@dataclass
class FineResult:
    update_times_ns: list[float]  # when each global update happened (async: each gradient applied)
    samples: list[int]  # samples of each update
    events: int
    steps: int  # steps simulated per worker
    ops: list[tuple[int, str, str, float, float]] = field(default_factory=list)  # (worker, res, op, start, end)

    def window(self, warmup: float = 0.25) -> tuple[float, float, int, int]:
        """(t0, t1, updates, samples) after the first ``warmup`` share of updates (a steady state)."""
        n = len(self.update_times_ns)
        skip = min(n - 2, max(0, int(n * warmup))) if n >= 2 else 0
        t0 = self.update_times_ns[skip - 1] if skip > 0 else 0.0
        t1 = self.update_times_ns[-1]
        return t0, t1, n - skip, sum(self.samples[skip:])

    @property
    def updates_per_s(self) -> float:
        t0, t1, u, _ = self.window()
        return u / ((t1 - t0) / NS) if t1 > t0 else 0.0

    @property
    def samples_per_s(self) -> float:
        t0, t1, _, s = self.window()
        return s / ((t1 - t0) / NS) if t1 > t0 else 0.0


class _Op:
    __slots__ = ("w", "res", "name", "remaining", "deps", "dependents", "after", "rate", "last", "version",
                 "start", "vfin")

    def __init__(self, w: int, res: str, name: str, remaining: float, after: float = 0.0):
        self.w, self.res, self.name, self.remaining, self.after = w, res, name, remaining, after
        self.deps = 0
        self.dependents: list[_Op] = []
        self.rate = 1.0
        self.last = 0.0
        self.version = 0
        self.start = 0.0
        self.vfin = 0.0


def _edge(a: _Op, b: _Op) -> None:
    a.dependents.append(b)
    b.deps += 1


class _Link:
    """One shared link (the PS's downlink or uplink): FCFS or processor sharing over the active workers."""

    def __init__(self, model: str, cap_frac: float, weights: list[int]):
        self.model, self.cap, self.weights = model, cap_frac, weights
        self.active: deque[int] = deque()  # workers in order of activation
        self.op: dict[int, _Op] = {}  # the op each active worker runs
        self.v = 0.0  # PS: the work every active op has received since the start
        self.heap: list[tuple[float, int, _Op]] = []
        self.load = 0  # Σ weights of the active workers
        self.last = 0.0
        self.seq = 0

    def rate(self) -> float:
        if self.model == "ps":
            return min(1.0 / self.load, self.cap) if self.load else 0.0
        return self.cap  # fcfs: the front; all_reduce never reaches a shared link

    def advance(self, t: float) -> None:
        dt = t - self.last
        if dt > 0:
            if self.model == "ps":
                if self.load:
                    self.v += self.rate() * dt
            elif self.active:
                self.op[self.active[0]].remaining -= self.cap * dt
        self.last = t

    def next_time(self) -> tuple[float, _Op] | None:
        if self.model == "ps":
            if not self.heap:
                return None
            vfin, _, op = self.heap[0]
            return self.last + max(0.0, vfin - self.v) / self.rate(), op
        if not self.active:
            return None
        op = self.op[self.active[0]]
        return self.last + max(0.0, op.remaining) / self.cap, op

    def start(self, op: _Op, t: float, newly_active: bool) -> None:
        self.advance(t)
        if newly_active:
            if self.model != "ps":  # FCFS: the order of activation; PS needs only the load
                self.active.append(op.w)
            self.load += self.weights[op.w]
        self.op[op.w] = op
        op.start = t
        if self.model == "ps":
            self.seq += 1
            op.vfin = self.v + op.remaining
            heapq.heappush(self.heap, (op.vfin, self.seq, op))

    def finish(self, op: _Op) -> None:
        if self.model == "ps":
            heapq.heappop(self.heap)
        del self.op[op.w]

    def deactivate(self, w: int) -> None:
        if self.model != "ps":
            self.active.remove(w)  # (the front: only the front finishes under FCFS)
        self.load -= self.weights[w]


def simulate(trace: Trace, workers: list[SimWorker], steps: int, record_ops: bool = False) -> FineResult:
    """Run Algorithm 2.1 for ``steps`` steps of every worker; the update times it produces."""
    if trace.link not in LINK_MODELS:
        raise ValueError(f"link model {trace.link!r}; accepted: {', '.join(LINK_MODELS)}")
    sim = _Sim(trace, workers, record_ops)
    return sim.run(steps)


class _Sim:
    def __init__(self, trace: Trace, workers: list[SimWorker], record_ops: bool):
        self.tr, self.ws = trace, workers
        self.record = record_ops
        weights = [w.weight for w in workers]
        cap = 1.0
        ring = trace.arch == "ring"
        self.links = {}
        if not ring:
            for res, bw in ((DOWN, trace.bandwidth_down), (UP, trace.bandwidth_up)):
                frac = min(1.0, trace.flow_cap / bw) if trace.flow_cap else cap
                self.links[res] = _Link(trace.link, frac, weights)
        self.heap: list[tuple[float, int, int, _Op | None, str]] = []  # (t, seq, version, op, kind)
        self.seq = 0
        self.t = 0.0
        self.events = 0
        self.queues: dict[tuple[int, str], deque[_Op]] = {}
        self.running: dict[tuple[int, str], _Op] = {}
        self.ar_active = [0] * len(workers)
        self.left = [0] * len(workers)  # ops of the current step not yet released
        self.done_steps = [0] * len(workers)
        self.ps_queue: deque[_Op] = deque()
        self.sync_done = 0
        self.updates: list[float] = []
        self.samples: list[int] = []
        self.ops_log: list[tuple[int, str, str, float, float]] = []

    # ------------------------------------------------------------------ steps
    def start_step(self, w: int) -> None:
        tr, sw = self.tr, self.ws[w]
        L = len(tr.layer_bytes)
        ops: list[_Op] = []
        fwd = [_Op(w, WORKER, f"fwd{i}", sw.forward_ns[i]) for i in range(L)]
        bwd = [_Op(w, WORKER, f"bwd{i}", sw.backward_ns[i]) for i in range(L)]
        for i in range(1, L):
            _edge(fwd[i - 1], fwd[i])
        _edge(fwd[L - 1], bwd[L - 1])
        for i in range(L - 1, 0, -1):
            _edge(bwd[i], bwd[i - 1])
        ops += fwd + bwd
        if tr.arch == "ring":
            k = tr.workers_total
            frac = min(1.0, tr.flow_cap / tr.bandwidth_down) if tr.flow_cap else 1.0
            upd = _Op(w, WORKER, "update", tr.update_ns)
            for i in range(L):
                xfer = 2 * (k - 1) / k * tr.layer_bytes[i] / tr.bandwidth_down * NS / frac
                fixed = 2 * (k - 1) * tr.latency_ns + (k - 1) * tr.aggregate_ns
                ar = _Op(w, AR, f"allreduce{i}", xfer + fixed if k > 1 else 0.0)
                _edge(bwd[i], ar)
                _edge(ar, upd)
                ops.append(ar)
            ops.append(upd)
        else:
            downs = [_Op(w, DOWN, f"down{i}", tr.layer_bytes[i] / tr.bandwidth_down * NS, tr.latency_ns)
                     for i in range(L)]
            ups = [_Op(w, UP, f"up{i}", tr.layer_bytes[i] / tr.bandwidth_up * NS, tr.latency_ns) for i in range(L)]
            for i in range(L):
                _edge(downs[i], fwd[i])
                _edge(bwd[i], ups[i])
            ops += downs + ups
            if tr.mode == "async":
                upd = _Op(w, PS, "update", tr.update_ns)
                for u in ups:
                    _edge(u, upd)
                ops.append(upd)
        self.left[w] = len(ops)
        for op in ops:
            if op.deps == 0:
                self.ready(op)

    def step_over(self, w: int) -> None:
        self.done_steps[w] += 1
        tr = self.tr
        if tr.mode == "async":
            self.updates.append(self.t)
            self.samples.append(self.ws[w].batch * self.ws[w].weight)
            if self.done_steps[w] < self.steps:
                self.start_step(w)
            return
        self.sync_done += 1
        if self.sync_done < len(self.ws):
            return
        self.sync_done = 0
        if tr.arch == "ps":  # the PS aggregates the K gradients and applies them, once
            self.push(self.t + tr.aggregate_ns + tr.update_ns, None, "round")
        else:
            self.round_over()

    def round_over(self) -> None:
        self.updates.append(self.t)
        self.samples.append(sum(w.batch * w.weight for w in self.ws))
        if self.done_steps[0] < self.steps:
            for w in range(len(self.ws)):
                self.start_step(w)

    # -------------------------------------------------------------- resources
    def push(self, t: float, op: _Op | None, kind: str) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, op.version if op is not None else 0, op, kind))

    def ready(self, op: _Op) -> None:
        key = (op.w, op.res)
        if op.res == PS:
            self.ps_queue.append(op)
            if len(self.ps_queue) == 1:
                self.begin(op)
            return
        if key in self.running:
            self.queues.setdefault(key, deque()).append(op)
        else:
            self.begin(op)

    def begin(self, op: _Op) -> None:
        t = self.t
        op.start = t
        if op.res in self.links:
            self.running[(op.w, op.res)] = op
            self.links[op.res].start(op, t, newly_active=True)  # a worker between ops is not active
            return
        if op.res != PS:
            self.running[(op.w, op.res)] = op
        if op.res == AR:
            self.ar_active[op.w] += 1
            self.rerate(op.w)
        op.rate = self.worker_rate(op.w) if op.res == WORKER else 1.0
        op.last = t
        self.push(t + op.remaining / op.rate, op, "op")

    def worker_rate(self, w: int) -> float:
        return 1.0 - self.tr.allreduce_share if self.ar_active[w] else 1.0

    def rerate(self, w: int) -> None:
        """An all-reduce of ``w`` started or ended: its running computation changes speed."""
        op = self.running.get((w, WORKER))
        if op is None or self.tr.allreduce_share == 0:
            return
        rate = self.worker_rate(w)
        if rate == op.rate:
            return
        op.remaining -= op.rate * (self.t - op.last)
        op.last, op.rate = self.t, rate
        op.version += 1
        self.push(self.t + max(0.0, op.remaining) / rate, op, "op")

    def finish(self, op: _Op) -> None:
        t, w, res = self.t, op.w, op.res
        if self.record:
            self.ops_log.append((w, res, op.name, op.start, t))
        key = (w, res)
        if res == PS:
            self.ps_queue.popleft()
            if self.ps_queue:
                self.begin(self.ps_queue[0])
        else:
            del self.running[key]
            link = self.links.get(res)
            if link is not None:
                link.finish(op)
            q = self.queues.get(key)
            if q:
                nxt = q.popleft()
                if link is not None:
                    self.running[key] = nxt
                    nxt.start = t
                    link.start(nxt, t, newly_active=False)
                else:
                    self.begin(nxt)
            elif link is not None:
                link.deactivate(w)
        if res == AR:
            self.ar_active[w] -= 1
            self.rerate(w)
        if op.after > 0:
            self.push(t + op.after, op, "release")
        else:
            self.release(op)

    def release(self, op: _Op) -> None:
        for d in op.dependents:
            d.deps -= 1
            if d.deps == 0:
                self.ready(d)
        self.left[op.w] -= 1
        if self.left[op.w] == 0:
            self.step_over(op.w)

    # ------------------------------------------------------------------- loop
    def run(self, steps: int) -> FineResult:
        self.steps = steps
        for w in range(len(self.ws)):
            self.start_step(w)
        links = list(self.links.values())
        while True:
            best_t, best = None, None
            while self.heap:
                t, _, version, op, kind = self.heap[0]
                if kind == "op" and op.version != version:
                    heapq.heappop(self.heap)  # superseded by a change of rate
                    continue
                best_t, best = t, ("heap", None)
                break
            for link in links:
                nxt = link.next_time()
                if nxt is not None and (best_t is None or nxt[0] < best_t):
                    best_t, best = nxt[0], ("link", (link, nxt[1]))
            if best is None:
                break
            self.events += 1
            self.t = max(self.t, best_t)
            for link in links:
                link.advance(self.t)
            if best[0] == "link":
                self.finish(best[1][1])
                continue
            _, _, _, op, kind = heapq.heappop(self.heap)
            if kind == "op":
                self.finish(op)
            elif kind == "release":
                self.release(op)
            else:  # a synchronous PS's round: aggregation and update done
                self.round_over()
        return FineResult(self.updates, self.samples, self.events, steps, self.ops_log)

"""The network model (DESIGN §4.1): NIC egress and ingress queues plus per-pair latency.

A message of S bytes sent at t from a to b passes two stations in series,
each with its own discipline:

* **egress** at a (on a's agent): ``fifo`` serialises a's transfers
  (``e0 = max(t, egress_free[a]); e1 = e0 + S/B_out(a)``), ``fair`` shares
  ``B_out(a)`` equally among a's active transfers (processor sharing; e1 is
  known only when the transfer finishes), ``unlimited`` gives every transfer
  the whole NIC (``e0 = t``).
* **ingress** at b (on b's agent): the first byte arrives at ``e0 + L(a, b)``.
  ``fifo``: ``i0 = max(e0 + L, ingress_free[b]); done = i0 + S/B_in(b)``;
  ``fair``: processor sharing of ``B_in(b)`` among b's active receptions, each
  also capped by its sender's rate ``B_out(a)`` (max-min / water-filling);
  ``unlimited``: ``done = e0 + L + S/B_in(b)``.

Delivery is at ``max(done, e1 + L)``: the last byte cannot arrive before it
left plus the latency. Uncontended, that is ``t + L + S/min(B_out, B_in)``.
This decomposition keeps every station's state on the agent hosting its
vworker: the receiver learns of a transfer at ``e0 + L >= window end`` (the
lookahead is the minimum cross-agent latency), and with a ``fair`` egress a
second "tail" event announces ``e1 + L``. Under ``fair`` at both ends a
synchronous PS round takes exactly Eq. 7 of the throughput-prediction paper
(plus 2 L), under ``fifo`` exactly its Eq. 8 — tests pin both.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from agents.sim import keyed
from agents.sim.kernel import PRIO_NET, Kernel, Timer
from agents.sim.types import NS_PER_S, VirtualTime
from agents.sim.worker import Message, SendHandle

if TYPE_CHECKING:  # pragma: no cover
    from agents.sim.env import Environment
    from agents.sim.tcp import TcpSpec
    from agents.sim.worker import Worker

__all__ = [
    "DISCIPLINES", "NetworkSpec", "Network", "Transfer", "transfer_ns",
    "LatencyModel", "ConstantLatency", "MatrixLatency", "DistributionLatency", "payload_nbytes",
    "latency_to_dict", "latency_from_dict",
]

DISCIPLINES = ("fifo", "fair", "unlimited")


def transfer_ns(nbytes: float, rate: float) -> VirtualTime:
    """Time to push ``nbytes`` at ``rate`` bytes/s, in integer ns."""
    if nbytes <= 0 or math.isinf(rate):
        return 0
    return int(round(nbytes * NS_PER_S / rate))


def payload_nbytes(payload: Any) -> int:
    """Bytes of the tensors in a payload (tensor, ndarray, or nested list/tuple/dict of them)."""
    if payload is None:
        return 0
    nbytes = getattr(payload, "nbytes", None)
    if nbytes is not None and not callable(nbytes):
        return int(nbytes)
    if hasattr(payload, "element_size") and hasattr(payload, "numel"):  # torch.Tensor
        return int(payload.element_size() * payload.numel())
    if isinstance(payload, dict):
        return sum(payload_nbytes(v) for v in payload.values())
    if isinstance(payload, (list, tuple)):
        return sum(payload_nbytes(v) for v in payload)
    return 0  # ints, strings and other small control values cost nothing on the wire


# --------------------------------------------------------------- latency
class LatencyModel:
    """L(src, dst) in ns. ``sample`` is keyed by the sender's message counter."""

    def sample(self, src: int, dst: int, msg_seq: int) -> VirtualTime:
        raise NotImplementedError  # pragma: no cover - abstract

    def lower_bound(self, src: int, dst: int) -> VirtualTime:
        """A latency no sample between src and dst can be below (the window lookahead)."""
        raise NotImplementedError  # pragma: no cover - abstract


@dataclass(frozen=True)
class ConstantLatency(LatencyModel):
    ns: VirtualTime

    def sample(self, src: int, dst: int, msg_seq: int) -> VirtualTime:
        return self.ns

    def lower_bound(self, src: int, dst: int) -> VirtualTime:
        return self.ns


@dataclass(frozen=True)
class MatrixLatency(LatencyModel):
    """A matrix over groups (regions); ``group_of[vworker]`` maps each vworker to its row."""

    matrix_ns: tuple[tuple[int, ...], ...]
    group_of: tuple[int, ...]

    def sample(self, src: int, dst: int, msg_seq: int) -> VirtualTime:
        return self.matrix_ns[self.group_of[src]][self.group_of[dst]]

    def lower_bound(self, src: int, dst: int) -> VirtualTime:
        return self.sample(src, dst, 0)


@dataclass(frozen=True)
class DistributionLatency(LatencyModel):
    """A keyed per-message sample in seconds; negative samples (and those below ``min_s``) are redrawn.

    ``kind``: ``normal`` (mean, std), ``lognormal`` (mu, sigma of log-seconds),
    ``weibull`` (scale λ, shape k, loc).
    """

    kind: str
    params: tuple[float, ...]
    seed: int
    min_s: float = 0.0

    def _draw(self, *key: object) -> float:
        g = keyed.generator(*key)
        if self.kind == "normal":
            return float(g.normal(self.params[0], self.params[1]))
        if self.kind == "lognormal":
            return float(g.lognormal(self.params[0], self.params[1]))
        if self.kind == "weibull":
            lam, k, loc = self.params
            return float(loc + lam * g.weibull(k))
        raise ValueError(f"unknown latency distribution {self.kind!r}")

    def sample(self, src: int, dst: int, msg_seq: int) -> VirtualTime:
        for attempt in range(1000):
            s = self._draw(self.seed, "latency", src, dst, msg_seq, attempt)
            if s >= self.min_s and s >= 0:
                return int(round(s * NS_PER_S))
        raise ValueError(f"latency distribution {self.kind}{self.params} gave 1000 samples below {self.min_s} s")

    def lower_bound(self, src: int, dst: int) -> VirtualTime:
        return int(math.ceil(self.min_s * NS_PER_S))


# ---------------------------------------------------------------- spec
@dataclass(frozen=True)
class NetworkSpec:
    """The resolved network of a run: plain numbers, identical on every agent."""

    latency: LatencyModel
    bandwidth_out: tuple[float, ...]  # bytes/s per vworker id (ideal: efficiency applied; tcp: the line rate)
    bandwidth_in: tuple[float, ...]
    egress: str = "fair"
    ingress: str = "fair"
    tcp: "TcpSpec | None" = None  # set: the ``tcp`` transport model (agents/sim/tcp.py) moves the bytes
    topology: Any = None  # agents.sim.routes.TopologySpec: links and routes beyond the NICs (None: star)

    def __post_init__(self) -> None:
        for side in (self.egress, self.ingress):
            if side not in DISCIPLINES:
                raise ValueError(f"network discipline {side!r}; accepted: {', '.join(DISCIPLINES)}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (the plan travels to agents as JSON)."""
        from dataclasses import asdict

        d = {"latency": latency_to_dict(self.latency), "bandwidth_out": list(self.bandwidth_out),
             "bandwidth_in": list(self.bandwidth_in), "egress": self.egress, "ingress": self.ingress,
             "tcp": None if self.tcp is None else asdict(self.tcp)}
        if self.topology is not None:
            d["topology"] = self.topology.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NetworkSpec":
        from agents.sim.tcp import TcpSpec  # only the tcp model's runs need it (and tcp imports this module)

        topology = None
        if d.get("topology") is not None:
            from agents.sim.routes import TopologySpec

            topology = TopologySpec.from_dict(d["topology"])
        tcp = d.get("tcp")
        return cls(latency_from_dict(d["latency"]), tuple(float(b) for b in d["bandwidth_out"]),
                   tuple(float(b) for b in d["bandwidth_in"]), d["egress"], d["ingress"],
                   None if tcp is None else TcpSpec(**tcp), topology)


def latency_to_dict(m: LatencyModel) -> dict[str, Any]:
    if isinstance(m, ConstantLatency):
        return {"kind": "constant", "ns": m.ns}
    if isinstance(m, MatrixLatency):
        return {"kind": "matrix", "matrix_ns": [list(r) for r in m.matrix_ns], "group_of": list(m.group_of)}
    if isinstance(m, DistributionLatency):
        return {"kind": m.kind, "params": list(m.params), "seed": m.seed, "min_s": m.min_s}
    raise TypeError(f"no plain form for latency model {type(m).__name__}")


def latency_from_dict(d: dict[str, Any]) -> LatencyModel:
    kind = d["kind"]
    if kind == "constant":
        return ConstantLatency(int(d["ns"]))
    if kind == "matrix":
        return MatrixLatency(tuple(tuple(int(x) for x in row) for row in d["matrix_ns"]),
                             tuple(int(g) for g in d["group_of"]))
    return DistributionLatency(kind, tuple(float(x) for x in d["params"]), int(d["seed"]), float(d.get("min_s", 0.0)))


# ------------------------------------------------------------ transfers
class Transfer:
    """One message in flight. Crosses agents inside ``arrive`` events (payload serialised there)."""

    __slots__ = ("src", "dst", "src_name", "dst_name", "seq", "tag", "payload", "nbytes",
                 "sent_at", "e0", "latency", "tail", "cap", "done")

    def __init__(self, src: int, dst: int, src_name: str, dst_name: str, seq: int, tag: Any,
                 payload: Any, nbytes: int, sent_at: VirtualTime, e0: VirtualTime,
                 latency: VirtualTime, tail: VirtualTime | None, cap: float):
        self.src, self.dst, self.src_name, self.dst_name = src, dst, src_name, dst_name
        self.seq, self.tag, self.payload, self.nbytes = seq, tag, payload, nbytes
        self.sent_at, self.e0, self.latency, self.tail, self.cap = sent_at, e0, latency, tail, cap
        self.done: VirtualTime | None = None  # ingress finished (receiver side)


class SharedFlows:
    """Flows sharing capacity as virtual time passes (agents/sim/topology.py; the reference link of
    tests/engine/test_shared_link.py): the subclass has ``kernel``,
    ``flows`` (each with ``remaining`` bytes, ``rate`` and ``left_ns()``), ``last`` (when they were last
    brought up to date), ``timer`` (the next completion) and ``_reschedule()``."""

    __slots__ = ()

    def _advance(self) -> None:
        now = self.kernel.now
        dt = now - self.last
        if dt:
            for f in self.flows:
                f.remaining -= f.rate * dt / NS_PER_S
        self.last = now

    def _finish(self) -> list:
        """On the completion timer: bring the flows up to now, drop and return those done, reschedule."""
        self.timer = None
        self._advance()
        done = [f for f in self.flows if f.left_ns() == 0]
        self.flows = [f for f in self.flows if f.left_ns() != 0]
        self._reschedule()
        return done


# A link holds its flows as columns: Python lists while it has few, float64 arrays from VECTOR_FROM flows on
# (back to lists below VECTOR_FROM // 2). Both do the same IEEE-754 operations in the same order on each
# flow (numpy's elementwise +, -, *, / and rint round exactly as Python's floats and round() do), so a run's
# times do not depend on the switch; tests/engine/test_shared_link.py checks both against a flow-by-flow
# reference. Below ~40 flows numpy's per-call cost is more than the loop it saves
# (python benchmarks/bench_shared_link.py).
VECTOR_FROM = 40
_INF = math.inf


def _even_share(capacity: float, cap: float, n: int) -> float | None:
    """The one share of ``n`` flows with the same cap that none of them reaches: ``capacity / n``; None when
    the cap is below it (then :func:`_capped_shares`)."""
    share = capacity / n
    return None if cap < share else share


@functools.lru_cache(maxsize=256)
def _capped_shares(capacity: float, cap: float, n: int) -> tuple[float, ...]:
    """:func:`_shares` for ``n`` flows with the same cap, in their order, when the cap is below ``capacity / n``."""
    return tuple(_shares(capacity, [cap] * n))


@functools.lru_cache(maxsize=64)
def _capped_shares_array(capacity: float, cap: float, n: int) -> np.ndarray:
    a = np.array(_capped_shares(capacity, cap, n), dtype=np.float64)
    a.flags.writeable = False
    return a


def _shares(capacity: float, caps: list[float]) -> list[float]:
    """Max-min fair shares with per-flow caps (water-filling): smallest cap first (ties in arrival order), a flow
    whose cap is below the fair share of what is left keeps its cap; the others all get that fair share, the
    same float (as the bottleneck's flows do in agents/sim/topology.py)."""
    rates = [0.0] * len(caps)
    left, n = capacity, len(caps)
    order = sorted(range(len(caps)), key=caps.__getitem__)
    for j, i in enumerate(order):
        share = left / n
        if not caps[i] < share:
            for k in order[j:]:
                rates[k] = share
            break
        rates[i] = caps[i]
        left -= caps[i]
        n -= 1
    return rates


class _SharedLink:
    """Processor sharing of one NIC direction among active flows, each optionally capped.

    Every arrival and departure re-shares the link (max-min, water-filling) and replaces the completion
    timer. The per-event work is a few passes over the flows' columns, vectorised on a busy link (a PS's
    NIC with thousands of senders), with the shares of a link whose flows all have the same cap (the usual
    case) computed once per (capacity, cap, count)."""

    __slots__ = ("kernel", "owner", "capacity", "left", "caps", "items", "rates", "even", "last", "timer",
                 "on_done")

    def __init__(self, kernel: Kernel, owner: "Worker", capacity: float,
                 on_done: Callable[[Any], None]):
        self.kernel, self.owner, self.capacity, self.on_done = kernel, owner, capacity, on_done
        self.left: list[float] | np.ndarray = []  # bytes each flow still has to move, in arrival order
        self.caps: list[float] | np.ndarray = []  # each flow's cap (its sender's rate; inf on an egress)
        # each flow's current share; on columns, one float when every flow has the same share
        self.rates: tuple[float, ...] | list[float] | np.ndarray | float = ()
        self.items: list[Any] = []
        self.even = True  # every flow has the same cap
        self.last: VirtualTime = 0
        self.timer: Timer | None = None  # the next completion; replaced at every arrival or departure

    def add(self, nbytes: float, cap: float, item: Any) -> None:
        self._advance()
        if self.items and cap != self.caps[0]:
            self.even = False
        if isinstance(self.left, list):
            self.left.append(float(nbytes))
            self.caps.append(cap)
            if len(self.left) >= VECTOR_FROM:
                self.left, self.caps = np.array(self.left), np.array(self.caps)
        else:
            self.left = np.concatenate((self.left, (float(nbytes),)))
            self.caps = np.concatenate((self.caps, (cap,)))
        self.items.append(item)
        self._reschedule()

    def _advance(self) -> None:
        now = self.kernel.now
        dt = now - self.last
        if dt and self.items:
            if isinstance(self.left, list):
                left = self.left
                for i, r in enumerate(self.rates):
                    left[i] -= r * dt / NS_PER_S
            else:
                step = self.rates * dt
                step /= NS_PER_S
                self.left -= step
        self.last = now

    def _left_ns(self) -> list[int] | np.ndarray:
        """Each flow's time to finish at its current share: ``transfer_ns(max(left, 0), rate)``, flow by flow
        (as floats of whole ns in the vectorised form)."""
        if isinstance(self.left, list):
            ns = []
            for b, r in zip(self.left, self.rates):
                ns.append(0 if b <= 0 or r == _INF else int(round(b * NS_PER_S / r)))
            return ns
        ns = np.maximum(self.left, 0.0)  # a flow's rate is never 0 (bandwidths and slow-link factors are > 0)
        ns *= NS_PER_S
        ns /= self.rates
        return np.rint(ns, out=ns)

    def _share(self) -> None:
        n = len(self.items)
        vector = not isinstance(self.left, list)
        if self.even:
            cap = float(self.caps[0])
            share = _even_share(self.capacity, cap, n)
            if share is not None:  # one float for every flow: a scalar that numpy broadcasts, no pass per count
                self.rates = share if vector else (share,) * n
            else:
                self.rates = (_capped_shares_array if vector else _capped_shares)(self.capacity, cap, n)
        else:
            self.rates = np.array(_shares(self.capacity, self.caps.tolist())) if vector else _shares(
                self.capacity, self.caps)

    def _reschedule(self) -> None:
        if self.timer is not None:
            self.timer.cancel()  # superseded by this arrival or departure
            self.timer = None
        if not self.items:
            return
        self._share()
        ns = self._left_ns()
        dt = min(ns) if isinstance(ns, list) else int(ns.min())
        self.timer = self.kernel.timer(self.kernel.now + dt, PRIO_NET, self.owner, self._tick)

    def _tick(self) -> None:
        """The completion timer: bring the flows up to now, drop those done (in arrival order), re-share."""
        self.timer = None
        self._advance()
        ns = self._left_ns()
        if isinstance(ns, list):
            gone = [i for i, t in enumerate(ns) if t == 0]
            if len(gone) == len(ns):  # the usual on a vworker's egress: its one message is out
                done, self.items, self.left, self.caps = self.items, [], [], []
            else:
                done = [self.items[i] for i in gone]
                for i in reversed(gone):
                    del self.items[i], self.left[i], self.caps[i]
        else:
            keep = ns != 0
            gone = np.flatnonzero(~keep).tolist()
            done = [self.items[i] for i in gone]
            for i in reversed(gone):
                del self.items[i]
            self.left, self.caps = self.left[keep], self.caps[keep]
            if len(self.items) < VECTOR_FROM // 2:
                self.left, self.caps = self.left.tolist(), self.caps.tolist()
        if not self.items:
            self.even = True
        elif not self.even:
            self.even = (all(c == self.caps[0] for c in self.caps) if isinstance(self.caps, list)
                         else bool((self.caps == self.caps[0]).all()))
        self._reschedule()
        for item in done:
            self.on_done(item)


class _Nic:
    __slots__ = ("egress_free", "ingress_free", "egress_link", "ingress_link")

    def __init__(self) -> None:
        self.egress_free: VirtualTime = 0
        self.ingress_free: VirtualTime = 0
        self.egress_link: _SharedLink | None = None
        self.ingress_link: _SharedLink | None = None


class Network:
    """The NIC state of one agent's vworkers and the send/arrive/tail/deliver events."""

    def __init__(self, kernel: Kernel, spec: NetworkSpec, env: "Environment"):
        self.kernel, self.spec, self.env = kernel, spec, env
        self._nics: dict[int, _Nic] = {}
        self._await_tail: dict[tuple[int, int], Transfer] = {}
        kernel.on_remote("arrive", self._on_arrive, self._arrive_effect)
        kernel.on_remote("tail", self._on_tail)
        kernel.on_remote("notify", self._on_notify)

    def _nic(self, vid: int) -> _Nic:
        nic = self._nics.get(vid)
        if nic is None:
            nic = self._nics[vid] = _Nic()
        return nic

    # ------------------------------------------------------------ sender
    def send(self, w: "Worker", dst: int, payload: Any, nbytes: int | None, tag: Any) -> SendHandle:
        k, spec = self.kernel, self.spec
        size = payload_nbytes(payload) if nbytes is None else int(nbytes)
        if size < 0:
            raise ValueError(f"{w.name}: send with negative nbytes {size}")
        now = k.now
        w.msg_seq += 1
        lat = spec.latency.sample(w.id, dst, w.msg_seq)
        b_out = spec.bandwidth_out[w.id]
        nic = self._nic(w.id)
        slow = self.env.faults.slow
        if slow and w.id in slow:  # a slow NIC (faults): the rate when its transfer starts
            b_out *= self.env.faults.bandwidth_factor(w.id, max(now, nic.egress_free)
                                                       if spec.egress == "fifo" else now)
        if spec.egress == "fair" and size > 0:
            e0, e1 = now, None
        elif spec.egress == "fifo":
            e0 = max(now, nic.egress_free)
            e1 = nic.egress_free = e0 + transfer_ns(size, b_out)
        else:  # unlimited, or an empty message under fair
            e0, e1 = now, now + transfer_ns(size, b_out)
        tr = Transfer(w.id, dst, w.name, self.env.names[dst], w.msg_seq, tag, payload, size, now,
                      e0, lat, None if e1 is None else e1 + lat, b_out)
        handle = SendHandle(k, e1)
        if e1 is None:
            if nic.egress_link is None:
                nic.egress_link = _SharedLink(k, w, b_out, self._egress_done)
            nic.egress_link.add(size, math.inf, (tr, handle))
        self.env.on_send(w, tr, remote=not k.is_local(dst))
        k.post(e0 + lat, PRIO_NET, w, dst, "arrive", tr, self._arrive_effect(tr, e0 + lat))
        return handle

    def rescale(self, vid: int) -> None:
        """A slow-link fault starts or ends now: the shared (fair) links of ``vid``'s NIC re-share."""
        nic = self._nics.get(vid)
        if nic is None:
            return
        f = self.env.faults.bandwidth_factor(vid, self.kernel.now)
        for link, base in ((nic.egress_link, self.spec.bandwidth_out[vid]),
                           (nic.ingress_link, self.spec.bandwidth_in[vid])):
            if link is not None:
                link._advance()
                link.capacity = base * f
                link._reschedule()

    def _egress_done(self, item: tuple[Transfer, SendHandle]) -> None:
        tr, handle = item
        now = self.kernel.now
        handle.complete(now)
        src = self.kernel.workers[tr.src]
        self.kernel.post(now + tr.latency, PRIO_NET, src, tr.dst, "tail", (tr.src, tr.seq, now + tr.latency))

    def notify(self, w: "Worker", owner: int, name: str) -> None:
        if owner == w.id:
            w.ring(name)
            return
        w.msg_seq += 1
        lat = self.spec.latency.sample(w.id, owner, w.msg_seq)
        self.kernel.post(self.kernel.now + lat, PRIO_NET, w, owner, "notify", (owner, name))

    # ---------------------------------------------------------- receiver
    def _arrive_effect(self, tr: Transfer, t: VirtualTime) -> VirtualTime:
        """The earliest delivery of a transfer whose first byte arrives at ``t``.

        Under every discipline the last byte is in no earlier than ``S / min(B_out, B_in)``
        after the first (ingress at most ``B_in``, capped by the sender; the tail left the
        sender at ``e1 >= e0 + S/B_out``), and nothing else happens on arrival that could
        resume a vworker sooner: a new flow only slows the others down. Less 2 ns: the
        stations round each step to the nearest ns, and a flow completes with under half a
        nanosecond's worth of bytes left.
        """
        return max(t, t + transfer_ns(tr.nbytes, min(tr.cap, self.spec.bandwidth_in[tr.dst])) - 2)

    def _on_arrive(self, tr: Transfer) -> None:
        k, spec = self.kernel, self.spec
        now = k.now
        b_in = spec.bandwidth_in[tr.dst]
        nic = self._nic(tr.dst)
        slow = self.env.faults.slow
        if slow and tr.dst in slow:  # a slow NIC (faults): the rate when the reception starts
            b_in *= self.env.faults.bandwidth_factor(tr.dst, max(now, nic.ingress_free)
                                                      if spec.ingress == "fifo" else now)
        if tr.tail is None:
            self._await_tail[(tr.src, tr.seq)] = tr
        if spec.ingress == "fifo":
            i0 = max(now, nic.ingress_free)
            tr.done = nic.ingress_free = i0 + transfer_ns(tr.nbytes, b_in)
            self._maybe_deliver(tr)
        elif spec.ingress == "unlimited" or tr.nbytes == 0:
            tr.done = now + transfer_ns(tr.nbytes, b_in)
            self._maybe_deliver(tr)
        else:
            if nic.ingress_link is None:
                nic.ingress_link = _SharedLink(k, k.workers[tr.dst], b_in, self._ingress_done)
            nic.ingress_link.add(tr.nbytes, tr.cap, tr)

    def _ingress_done(self, tr: Transfer) -> None:
        tr.done = self.kernel.now
        self._maybe_deliver(tr)

    def _on_tail(self, data: tuple[int, int, VirtualTime]) -> None:
        src, seq, t = data
        tr = self._await_tail.pop((src, seq))
        tr.tail = t
        self._maybe_deliver(tr)

    def _maybe_deliver(self, tr: Transfer) -> None:
        if tr.done is None or tr.tail is None:
            return
        self.kernel.schedule(max(tr.done, tr.tail), PRIO_NET, self.kernel.workers[tr.dst], self._deliver, tr)

    def _deliver(self, tr: Transfer) -> None:
        now = self.kernel.now
        msg = Message(tr.src_name, tr.dst_name, tr.tag, tr.payload, tr.nbytes, tr.sent_at, tr.seq)
        msg.delivered_at = now
        self.env.deliver(self.kernel.workers[tr.dst], msg, tr, now)

    def _on_notify(self, data: tuple[int, str]) -> None:
        owner, name = data
        self.kernel.workers[owner].ring(name)

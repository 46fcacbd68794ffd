"""Faults as configuration (DESIGN §11): what the ``faults:`` list does inside the engine.

Every fault is a pure function of the plan and a keyed draw, decided on the
agent that hosts the vworker concerned, so a fault experiment reruns
bit-identically and gives the same outputs however vworkers are placed.
Times are virtual ns; an interval is ``[start, end)``. docs/faults.md has the
user's view; the keys of the draws:

* ``loss`` / ``duplicate``: ``(seed, "fault", index, src, dst, msg_seq)`` per message sent in the interval,
  decided where it is delivered (it crossed the network: its bytes used both NICs);
* ``straggler``: ``(seed, "fault", index, vworker, compute_seq)`` per compute call;
* ``byzantine`` noise: ``(seed, "fault", index, vworker, compute_seq)`` seeds the Gaussian;
* ``fraction`` (which workers a fault hits): ``(seed, "fault", index)``, resolved by the controller.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from agents.sim import keyed
from agents.sim.kernel import HALTED, PRIO_NET, Kernel
from agents.sim.types import INFINITY, VirtualTime

__all__ = ["FAULT_KINDS", "FAULT_RECORDS", "BYZANTINE_MODES", "Fault", "FaultSpec", "Faults"]

FAULT_KINDS = ("crash", "partition", "loss", "duplicate", "slow_link", "straggler", "byzantine")
BYZANTINE_MODES = ("sign_flip", "noise", "scale")
# the state-log records a crash writes (statelog.jsonl), and the types of their fields: an agent's
# report is checked against them before the controller writes it (controller/checks.py)
FAULT_RECORDS: dict[str, dict[str, tuple[type, ...]]] = {
    "fault.crash": {"until": (int, type(None)), "restart": (bool,)},  # until: None = never recovers
    "fault.recover": {},
}


@dataclass(frozen=True)
class Fault:
    """One resolved fault: vworker ids, ns. ``index`` is its place in ``faults:`` (part of every key)."""

    index: int
    kind: str
    start: VirtualTime
    end: VirtualTime  # INFINITY: never heals / recovers
    vworkers: tuple[int, ...] = ()  # crash, straggler, byzantine, slow_link; loss/duplicate: senders (() = all)
    groups: tuple[tuple[int, ...], ...] = ()  # partition
    probability: float = 1.0
    factor: float = 1.0
    mode: str = "sign_flip"
    std: float = 0.0

    def active(self, t: VirtualTime) -> bool:
        return self.start <= t < self.end


@dataclass(frozen=True)
class FaultSpec:
    """The faults of a run, as the plan carries them (plain JSON data)."""

    faults: tuple[Fault, ...] = ()

    def to_dict(self) -> list[dict[str, Any]]:
        return [asdict(f) for f in self.faults]

    @classmethod
    def from_dict(cls, d: list[dict[str, Any]] | None) -> "FaultSpec":
        out = []
        for f in d or []:
            f = dict(f)
            f["vworkers"] = tuple(f.get("vworkers", ()))
            f["groups"] = tuple(tuple(g) for g in f.get("groups", ()))
            out.append(Fault(**f))
        return cls(tuple(out))

    def of_kind(self, *kinds: str) -> list[Fault]:
        return [f for f in self.faults if f.kind in kinds]


class Faults:
    """The engine's view of a run's faults: cheap questions asked by the network, compute and kernel."""

    def __init__(self, spec: FaultSpec, seed: int):
        self.spec, self.seed = spec, seed
        self.crashes: dict[int, list[Fault]] = {}
        self.stragglers: dict[int, list[Fault]] = {}
        self.byzantine: dict[int, list[Fault]] = {}
        self.slow: dict[int, list[Fault]] = {}
        for f in spec.faults:
            table = {"crash": self.crashes, "straggler": self.stragglers, "byzantine": self.byzantine,
                     "slow_link": self.slow}.get(f.kind)
            if table is not None:
                for v in f.vworkers:
                    table.setdefault(v, []).append(f)
        self.partitions = spec.of_kind("partition")
        self._side = [{v: g for g, group in enumerate(f.groups) for v in group} for f in self.partitions]
        self.lossy = spec.of_kind("loss", "duplicate")
        self.any = bool(spec.faults)  # (an attribute, not __bool__: the delivery path tests it per message)

    def __bool__(self) -> bool:
        return self.any

    # ------------------------------------------------------------ crashes
    def down(self, vid: int, t: VirtualTime) -> bool:
        """Whether vworker ``vid`` is crashed at ``t``."""
        for f in self.crashes.get(vid, ()):
            if f.active(t):
                return True
        return False

    # ------------------------------------------------------------ network
    def heals_at(self, src: int, dst: int, t: VirtualTime) -> VirtualTime | None:
        """When a message sent at ``t`` from ``src`` to ``dst`` may leave: the end of the latest partition
        that separates them then (partitions chain), or None when none does."""
        heal = None
        moved = True
        while moved:  # a partition that heals into another one that separates them holds the message on
            moved = False
            at = t if heal is None else heal
            for f, side in zip(self.partitions, self._side):
                if f.active(at):
                    a, b = side.get(src), side.get(dst)
                    if a is not None and b is not None and a != b and (heal is None or f.end > heal):
                        heal, moved = f.end, True
        return heal

    def drops(self, src: int, dst: int, seq: int, t: VirtualTime) -> int:
        """How many copies of a message sent at ``t`` are delivered: 0 (lost), 1, or 2 (duplicated).

        ``src``/``dst``/``seq`` key the draws."""
        copies = 1
        for f in self.lossy:
            if not f.active(t) or f.probability <= 0.0 or (f.vworkers and src not in f.vworkers):
                continue
            if f.probability < 1.0 and keyed.uniform(self.seed, "fault", f.index, src, dst, seq) >= f.probability:
                continue
            if f.kind == "loss":
                return 0
            copies = 2
        return copies

    def bandwidth_factor(self, vid: int, t: VirtualTime) -> float:
        """The share of its NIC rate vworker ``vid`` has at ``t`` (slow links multiply)."""
        out = 1.0
        for f in self.slow.get(vid, ()):
            if f.active(t):
                out *= f.factor
        return out

    def rate_changes(self, vid: int) -> list[VirtualTime]:
        """The times at which ``vid``'s NIC rate changes (a fair link re-shares there)."""
        ts: set[int] = set()
        for f in self.slow.get(vid, ()):
            ts.add(f.start)
            if f.end < INFINITY:
                ts.add(f.end)
        return sorted(ts)

    # ------------------------------------------------------------ compute
    def compute_factor(self, vid: int, seq: int, t: VirtualTime) -> float:
        """Slowdown of vworker ``vid``'s compute call number ``seq`` starting at ``t`` (stragglers)."""
        out = 1.0
        for f in self.stragglers.get(vid, ()):
            if f.active(t) and (f.probability >= 1.0 or
                                keyed.uniform(self.seed, "fault", f.index, vid, seq) < f.probability):
                out *= f.factor
        return out

    def corrupt(self, vid: int, seq: int, t: VirtualTime, grad: Any) -> Any:
        """A Byzantine worker's gradient: sign-flipped, scaled, or with keyed Gaussian noise added."""
        for f in self.byzantine.get(vid, ()):
            if not f.active(t):
                continue
            if f.mode == "sign_flip":
                grad = -grad
            elif f.mode == "scale":
                grad = grad * f.factor
            else:
                import torch

                g = torch.Generator().manual_seed(keyed.key_int(self.seed, "fault", f.index, vid, seq) >> 1)
                grad = grad + f.std * torch.randn(grad.shape, generator=g, dtype=grad.dtype).to(grad.device)
        return grad

    # ------------------------------------------------------------ events
    def install(self, kernel: Kernel, worker: Any, kwargs: dict[str, Any], network: Any) -> None:
        """Schedule the crash, recovery and NIC-rate events of a vworker just added to ``kernel``.

        A vworker class says what a crash does to it (``Worker.on_crash``): ``restart`` — its coroutine
        is closed, messages to it are lost while it is down, and it starts ``run()`` afresh (a new
        process, ``restarted`` set) at recovery; ``freeze`` — it runs nothing while down, messages wait
        in its mailbox, and it continues where it was at recovery (a member of a collective that
        elastic training restores from its peers' state)."""
        for f in self.crashes.get(worker.id, ()):
            restart = getattr(worker, "on_crash", "freeze") == "restart"
            kernel.schedule(f.start, PRIO_NET, worker, _crash, (kernel, worker, f.end, restart))
            if restart and f.end < INFINITY:
                kernel.schedule(f.end, PRIO_NET, worker, _recover, (self, kernel, worker, kwargs))
        for t in self.rate_changes(worker.id):
            kernel.schedule(t, PRIO_NET, worker, _rescale, (network, worker.id))


def _crash(data: tuple) -> None:
    kernel, worker, until, restart = data
    _log(worker, "fault.crash", until=None if until >= INFINITY else int(until), restart=bool(restart))
    if restart or until >= INFINITY:
        kernel.halt(worker)
    else:
        kernel.freeze(worker, until)


def _recover(data: tuple) -> None:
    faults, kernel, worker, kwargs = data
    if worker.coro is not HALTED or faults.down(worker.id, kernel.now):
        return  # overlapping crashes: the process comes back once, when the last of them ends
    counters = (worker.origin_seq, worker.msg_seq, worker.compute_seq, worker.incarnation)
    worker.__init__(worker.name, worker.id, worker.env, **kwargs)  # a new process: the state is gone
    worker.origin_seq, worker.msg_seq, worker.compute_seq, worker.incarnation = counters
    worker.attach(kernel)
    worker.restarted = True
    _log(worker, "fault.recover")
    kernel.restart(worker)


def _log(worker: Any, kind: str, **fields: Any) -> None:
    """A state-log record (statelog.jsonl) when the state log is on."""
    s = worker.env.statelog
    if s is not None and s.enabled:
        worker.env.recorder.event(worker, kind, **fields)


def _rescale(data: tuple) -> None:
    network, vid = data
    network.rescale(vid)

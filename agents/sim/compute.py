"""Compute-time models (DESIGN §4.2): how long a real ``compute`` call takes in virtual time.

``d = speed(vworker) × jitter × base`` where ``base`` comes from one of

* ``profiled`` — median of k timed runs of the same (kind, function, input
  shapes, dtype, device kind), measured once and kept in a profile database on
  disk (the ahead-of-time idea of Tianshu), reused by later runs;
* ``measured`` — the wall-clock time of this very call (the 2019 hybrid
  simulator); the run is marked non-reproducible;
* ``constant`` — one configured duration per kind (gradient, update, aggregate);
* ``distribution`` — a keyed sample, e.g. log-normal(μ=0.165, σ=0.8632) s
  (the FL-timing thesis' fit of client compute time);
* ``analytic`` — FLOPs / device peak FLOP/s (FLOPs from ``cost=`` or counted
  once per signature with ``torch.utils.flop_counter``).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import platform
import statistics
import time
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from agents.common.files import write_atomic
from agents.sim import keyed
from agents.sim.types import NS_PER_S, VirtualTime

if TYPE_CHECKING:  # pragma: no cover
    from agents.sim.worker import Worker

__all__ = ["MODELS", "KINDS", "ComputeSpec", "ComputeModel", "ProfileDB", "signature", "device_kind",
           "default_profile_db", "resolve_device", "timing_misses"]

_TIME_MISSES = False  # inside timing_misses(): a call the database lacks is profiled, not taken at its one time


@contextlib.contextmanager
def timing_misses():
    """Within it, a ``profiled`` call the database lacks is timed as :meth:`ComputeModel.profile` times one
    (a warm-up, then the median of ``compute.runs``, called again on the same arguments) rather than taken at
    the time of its one call. ``lockstep profile`` runs the experiment briefly so, to reach every call its
    strategy makes; the run's values do not matter there, only its calls' signatures and times."""
    global _TIME_MISSES
    before, _TIME_MISSES = _TIME_MISSES, True
    try:
        yield
    finally:
        _TIME_MISSES = before

MODELS = ("profiled", "measured", "constant", "distribution", "analytic")
KINDS = ("gradient", "update", "aggregate")


def default_profile_db() -> Path:
    env = os.environ.get("LOCKSTEP_PROFILE_DB")
    if env:
        return Path(env)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "lockstep" / "profiles.json"


def resolve_device(requested: str) -> str:
    """The device an agent really uses: ``cuda`` falls back to ``cpu`` (with a warning) without a GPU."""
    import torch

    if requested.startswith("cuda") and not torch.cuda.is_available():
        logging.getLogger(__name__).warning(
            "device=%s requested but this agent has no CUDA device; computing on the CPU", requested)
        return "cpu"
    return requested


def device_kind(device: str = "cpu") -> str:
    """What makes timings comparable: the device model and, on CPU, the thread count."""
    import torch

    if device.startswith("cuda"):
        return "cuda:" + torch.cuda.get_device_name(torch.device(device))

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return f"cpu:{cpu}:threads={torch.get_num_threads()}"


_MODULES: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()  # a module's description


def _describe(a: Any) -> str:
    shape = getattr(a, "shape", None)
    dtype = getattr(a, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{str(dtype).replace('torch.', '')}{tuple(shape)}"
    params = getattr(a, "parameters", None)
    if callable(params):  # an nn.Module: its class and parameter shapes (kept: a vworker's model keeps its shapes)
        desc = _MODULES.get(a)
        if desc is None:
            shapes = ",".join("x".join(map(str, p.shape)) for p in params())
            desc = _MODULES[a] = f"{type(a).__name__}[{shapes}]"
        return desc
    if isinstance(a, (list, tuple)):
        return "[" + ",".join(_describe(x) for x in a) + "]"
    if isinstance(a, (int, float, str, bool)) or a is None:
        return repr(a)
    return type(a).__name__


def signature(kind: str, fn: Callable[..., Any], args: tuple) -> str:
    """The profile-database key of a call, device kind excluded."""
    name = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', type(fn).__name__)}"
    owner = getattr(fn, "__self__", None)
    if owner is not None and hasattr(owner, "profile_name"):  # e.g. the model behind Training.gradient_at
        name += f"@{owner.profile_name}"
    return f"{kind}|{name}|" + ";".join(_describe(a) for a in args)


class ProfileDB:
    """A JSON file {device_kind: {signature: seconds}}; concurrent writers are serialised with flock."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._cache: dict[str, dict[str, float]] | None = None

    def _load(self) -> dict[str, dict[str, float]]:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except json.JSONDecodeError as e:
            raise ValueError(f"profile database {self.path} is not valid JSON ({e}); delete it to re-profile") from e

    def get(self, device: str, sig: str) -> float | None:
        if self._cache is None:
            self._cache = self._load()
        return self._cache.get(device, {}).get(sig)

    def put(self, device: str, sig: str, seconds: float) -> float:
        """Store ``seconds`` unless another process stored a value first; return the stored value."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self._load()
            existing = data.get(device, {}).get(sig)
            if existing is None:
                data.setdefault(device, {})[sig] = seconds
                write_atomic(self.path, json.dumps(data, indent=1, sort_keys=True))
                existing = seconds
            self._cache = data
        return existing


@dataclass(frozen=True)
class ComputeSpec:
    """The resolved compute model of a run (plain values, identical on every agent)."""

    model: str = "profiled"
    constant_s: dict[str, float] = field(default_factory=dict)  # per kind
    dist: str = "lognormal"
    dist_params: tuple[float, ...] = (0.165, 0.8632)
    dist_kinds: tuple[str, ...] = ("gradient",)
    peak_flops: float = 1e12
    profile_db: str = ""
    profile_runs: int = 5
    speed: tuple[float, ...] = ()  # per vworker id; empty = all 1.0
    jitter: float = 0.0  # σ of a keyed log-normal multiplier per call (0 = none)
    start_spread_ns: int = 0  # each vworker starts after a keyed uniform delay in [0, start_spread_ns)
    start_offsets_ns: dict[int, int] = field(default_factory=dict)  # vworker id -> fixed delay added to it
    stragglers: dict[int, float] = field(default_factory=dict)  # vworker id -> extra factor
    straggle_p: float = 0.0  # probability that a call straggles (keyed per vworker and call)
    straggle_factor: float = 1.0  # slowdown of a straggling call
    device: str = "cpu"
    seed: int = 0
    batch: str = "loop"  # off | loop | vmap | auto: deferred, batched execution (agents.sim.executor)
    max_batch: int = 64
    overlap: bool | str = "auto"  # deferred tasks early on a background thread (auto: agent processes, >= 2 CPUs)
    # profiled with a named device profile (conf/profiles/<name>.json): the emulated machine's durations by
    # signature, carried by the plan so every agent and host uses the same ones ("" / {}: time this host)
    profile_name: str = ""
    profile: dict[str, float] = field(default_factory=dict)
    estimators: dict[str, Any] = field(default_factory=dict)  # the profile's fitted estimators (agents.sim.estimator)
    layerwise: bool = False  # layer-wise overlap (docs/predict.md)
    forward_fraction: float = 1 / 3
    allreduce_share: float = 0.0  # Tianshu: the device share an all-reduce takes from overlapping computation
    layers: tuple[dict[str, Any], ...] = ()  # layerwise: {name, params (indices), nbytes, forward, backward} shares

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (the plan travels to agents as JSON)."""
        d = asdict(self)
        d["stragglers"] = {str(k): v for k, v in self.stragglers.items()}
        d["start_offsets_ns"] = {str(k): v for k, v in self.start_offsets_ns.items()}
        if not self.start_offsets_ns:  # (absent without offsets: plan.json of other runs stays as it was)
            del d["start_offsets_ns"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ComputeSpec":
        d = dict(d)
        d["stragglers"] = {int(k): float(v) for k, v in d.get("stragglers", {}).items()}
        d["start_offsets_ns"] = {int(k): int(v) for k, v in d.get("start_offsets_ns", {}).items()}
        for key in ("dist_params", "dist_kinds", "speed", "layers"):
            if key in d:
                d[key] = tuple(d[key])
        return cls(**d)


class ComputeModel:
    """Turns a real call into a virtual duration; one per agent."""

    def __init__(self, spec: ComputeSpec):
        if spec.model not in MODELS:
            raise ValueError(f"compute model {spec.model!r}; accepted: {', '.join(MODELS)}")
        self.spec = spec
        self.db = ProfileDB(Path(spec.profile_db) if spec.profile_db else default_profile_db())
        self._device: str | None = None
        self._flops: dict[str, float] = {}
        self.profile_misses = 0
        self.profile_fallbacks = 0  # calls a named device profile lacked, timed on this host instead
        self.reproducible = spec.model != "measured"
        self.faults = None  # agents.sim.faults.Faults with stragglers, set by the environment

    def start_at(self, vid: int) -> VirtualTime:
        """When vworker ``vid`` starts: its fixed ``start_offsets`` delay plus a keyed uniform delay in
        [0, start_spread) (0 without either)."""
        spread = self.spec.start_spread_ns
        drawn = int(keyed.uniform(self.spec.seed, "start", vid) * spread) if spread else 0
        return self.spec.start_offsets_ns.get(vid, 0) + drawn

    @property
    def device(self) -> str:
        if self._device is None:
            self._device = device_kind(resolve_device(self.spec.device))
        return self._device

    def duration(self, w: "Worker", kind: str, fn: Callable[..., Any], args: tuple,
                 wall_s: float, cost: float | None) -> VirtualTime:
        """Virtual duration (ns) of a call that took ``wall_s`` for real."""
        return self._scaled(w, self._base_seconds(w, kind, fn, args, wall_s, cost))

    def ahead(self, w: "Worker", kind: str, fn: Callable[..., Any], args: tuple,
              cost: float | None) -> VirtualTime | None:
        """The virtual duration of a call not yet run, or None when it needs the call's wall time
        (``measured``, a profile miss, FLOPs not counted yet): such a call runs eagerly."""
        m = self.spec.model
        if m == "measured":
            return None
        if m == "profiled":  # as _base_seconds, without timing this call
            sig = signature(kind, fn, args)
            if self.spec.profile_name:
                named = self.spec.profile.get(sig)
                if named is not None:
                    return self._scaled(w, named)
            base = self.db.get(self.device, sig)
            if base is None:
                return None  # eager: _base_seconds counts the fallback and the miss
            if self.spec.profile_name:
                self.profile_fallbacks += 1
            return self._scaled(w, base)
        if m == "analytic" and cost is None and signature(kind, fn, args) not in self._flops:
            return None
        return self._scaled(w, self._base_seconds(w, kind, fn, args, 0.0, cost))

    def _scaled(self, w: "Worker", base: float) -> VirtualTime:
        factor = self.spec.speed[w.id] if self.spec.speed else 1.0
        factor *= self.spec.stragglers.get(w.id, 1.0)
        if self.spec.straggle_p > 0 and keyed.uniform(self.spec.seed, "straggle", w.id, w.compute_seq) \
                < self.spec.straggle_p:
            factor *= self.spec.straggle_factor
        if self.faults is not None:
            factor *= self.faults.compute_factor(w.id, w.compute_seq, w.now)
        if self.spec.jitter > 0:
            g = keyed.generator(self.spec.seed, "jitter", w.id, w.compute_seq)
            factor *= float(g.lognormal(0.0, self.spec.jitter))
        return int(round(base * factor * NS_PER_S))

    def _base_seconds(self, w: "Worker", kind: str, fn: Callable[..., Any], args: tuple,
                      wall_s: float, cost: float | None) -> float:
        m = self.spec.model
        if m == "constant" or (m == "distribution" and kind not in self.spec.dist_kinds):
            try:
                return self.spec.constant_s[kind]
            except KeyError:
                raise KeyError(f"compute=constant has no duration for kind {kind!r}; "
                               f"set compute.{kind}=<seconds> (known: {sorted(self.spec.constant_s)})") from None
        if m == "measured":
            return wall_s
        if m == "distribution":
            g = keyed.generator(self.spec.seed, "compute", w.id, w.compute_seq, kind)
            return self._sample(g)
        if m == "analytic":
            flops = cost if cost is not None else self._count_flops(kind, fn, args)
            return flops / self.spec.peak_flops
        # profiled
        sig = signature(kind, fn, args)
        if self.spec.profile_name:
            named = self.spec.profile.get(sig)
            if named is not None:
                return named
            self.profile_fallbacks += 1
        got = self.db.get(self.device, sig)
        if got is None:
            # not profiled ahead of time: this call's own time becomes the profile (counted)
            self.profile_misses += 1
            got = self.profile(kind, fn, args) if _TIME_MISSES else self.db.put(self.device, sig, wall_s)
        return got

    def _sample(self, g: Any) -> float:
        d, p = self.spec.dist, self.spec.dist_params
        for _ in range(1000):
            if d == "lognormal":
                s = float(g.lognormal(p[0], p[1]))
            elif d == "normal":
                s = float(g.normal(p[0], p[1]))
            elif d == "weibull":
                s = float(p[2] + p[0] * g.weibull(p[1])) if len(p) > 2 else float(p[0] * g.weibull(p[1]))
            elif d == "exponential":
                s = float(g.exponential(p[0]))
            else:
                raise ValueError(f"compute distribution {d!r}; accepted: lognormal, normal, weibull, exponential")
            if s >= 0:
                return s
        raise ValueError(f"compute distribution {d}{p} gave 1000 negative samples")

    def _count_flops(self, kind: str, fn: Callable[..., Any], args: tuple) -> float:
        sig = signature(kind, fn, args)
        flops = self._flops.get(sig)
        if flops is None:
            from torch.utils.flop_counter import FlopCounterMode

            with FlopCounterMode(display=False) as counter:
                fn(*args)
            flops = self._flops[sig] = float(counter.get_total_flops())
        return flops

    def profile(self, kind: str, fn: Callable[..., Any], args: tuple, make_args: Callable[[], tuple] | None = None,
                warmup: int = 1) -> float:
        """Ahead-of-time profile of ``fn`` (median of k timed runs) unless the database has it.

        ``make_args`` returns fresh arguments for each run when ``fn`` mutates its inputs.
        """
        sig = signature(kind, fn, args)
        named = self.spec.profile.get(sig) if self.spec.profile_name else None
        if named is not None:
            return named
        got = self.db.get(self.device, sig)
        if got is not None:
            return got
        clock = _profile_clock(self.spec.device)
        times = []
        for i in range(warmup + self.spec.profile_runs):
            a = make_args() if make_args else args
            t0 = clock()
            fn(*a)
            if i >= warmup:
                times.append(clock() - t0)
        return self.db.put(self.device, sig, statistics.median(times))


def _profile_clock(device: str) -> Callable[[], float]:
    """The clock ahead-of-time profiles read: this thread's CPU time for a single-threaded CPU agent.

    On a busy machine a call's wall time includes the time other processes held the core; its CPU time
    does not, so a profile made on a shared host still says how long the call takes on this CPU. A GPU
    runs asynchronously (and several torch threads run in parallel): those are timed on the wall clock.
    """
    import torch

    if device == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter

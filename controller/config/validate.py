"""Validate a composed config once, into the typed :class:`RunConfig` the controller and the plan use.

Every problem becomes one sentence naming the key, the value and what is
accepted (STYLE: errors), and all of them are collected before anything
starts. Simple fields are checked generically from their schema
(:mod:`controller.config.schema`: type, bounds, choices, units); the rules
that span keys (batch sizes per worker, bandwidth forms, speed classes, what a
strategy and a data set allow) are written out below.
"""
from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import math
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from functools import lru_cache
from typing import Any, Callable

from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from agents.common.units import UnitError, parse_duration, parse_rate, parse_size
from agents.sim import keyed
from agents.sim.compute import KINDS
from agents.sim.tcp import TcpSpec
from agents.sim.types import seconds_to_ns
from controller.config import schema as S

__all__ = ["ConfigError", "RunConfig", "validate", "config_hash", "accepted_text", "field_at", "did_you_mean",
           "LatencySetting", "BandwidthSetting", "NetworkSettings", "ComputeSettings", "TraceSettings",
           "FaultSetting"]

# the parameters of each keyed distribution, as the engine draws them (agents/sim/compute.py, network.py, plan)
DRAW_PARAMS = {"lognormal": ("mu", "sigma"), "normal": ("mean", "std"), "weibull": ("scale", "shape", "loc"),
               "exponential": ("scale",)}
LATENCY_DISTRIBUTIONS = {k: DRAW_PARAMS[k] for k in ("normal", "lognormal", "weibull")}
BANDWIDTH_DISTRIBUTIONS = {k: DRAW_PARAMS[k] for k in ("weibull", "normal", "lognormal")}
MAX_DURATION_S = (1 << 63) / 1e9  # virtual time is int64 nanoseconds: about 292 years
TOO_LONG = f"a duration below {MAX_DURATION_S:.3g} s (virtual time is int64 nanoseconds: about 292 years)"
MAX_WORKERS = 1 << 20  # far beyond any data set's samples, which bound it again below
SPEED_DISTRIBUTIONS = {"lognormal": ("mu", "sigma"), "normal": ("mean", "std"), "uniform": ("low", "high")}


class ConfigError(ValueError):
    """One or more invalid config values; ``problems`` holds one sentence each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


# ------------------------------------------------------------ typed results
@dataclass(frozen=True)
class LatencySetting:
    """``network.latency`` resolved: ``kind`` constant (``ns``), matrix (``matrix_ns``, ``groups``) or a
    distribution (``params`` in seconds, ``min_s``)."""

    kind: str
    ns: int = 0
    matrix_ns: tuple[tuple[int, ...], ...] = ()
    groups: tuple[int, ...] | None = None
    params: tuple[float, ...] = ()
    min_s: float = 0.0


@dataclass(frozen=True)
class BandwidthSetting:
    """A NIC rate resolved to bytes/s: one ``rate``, one per worker (``per_worker``) or a keyed
    ``distribution`` with ``params`` in ``unit_bps``."""

    rate: float | None = None
    per_worker: tuple[float, ...] | None = None
    distribution: str | None = None
    params: tuple[float, ...] = ()
    unit_bps: float = 1.0


@dataclass(frozen=True)
class NetworkSettings:
    latency: LatencySetting
    bandwidth: BandwidthSetting
    bandwidth_in: BandwidthSetting | None  # None: the same draws as ``bandwidth``
    efficiency: float
    egress: str
    ingress: str
    tcp: TcpSpec | None = None  # network.model=tcp: the transport's parameters
    topology: Any = "star"  # a preset name or a custom mapping (controller.topology builds it)
    links: Any = None  # S.TopologyLinksConfig


@dataclass(frozen=True)
class ComputeSettings:
    """``compute`` resolved (seconds); per-worker ``speed`` and named ``stragglers`` become ids in the plan."""

    model: str
    constant_s: dict[str, float]
    dist: str
    dist_params: tuple[float, ...]
    dist_kinds: tuple[str, ...]
    peak_flops: float
    profile_db: str
    profile_runs: int
    profile_name: str
    profile: dict[str, float]
    estimators: dict[str, Any]
    speed_workers: tuple[float, ...] | None
    stragglers: dict[str, float]
    straggle_p: float
    straggle_factor: float
    jitter: float
    batch: str  # off | loop | vmap | auto (docs/batching.md)
    max_batch: int
    overlap: bool | str  # True | False | "auto"
    layerwise: bool = False
    forward_fraction: float = 1 / 3
    allreduce_share: float = 0.0
    start_spread_s: float = 0.0
    start_offsets_s: dict[str, float] = field(default_factory=dict)  # vworker name -> fixed start delay


@dataclass(frozen=True)
class FaultSetting:
    """One ``faults:`` entry resolved: vworker names (a ``fraction`` drawn), times in ns (``end`` None: never)."""

    index: int
    kind: str
    start_ns: int
    end_ns: int | None
    workers: tuple[str, ...] = ()
    groups: tuple[tuple[str, ...], ...] = ()
    probability: float = 1.0
    factor: float = 1.0
    mode: str = "sign_flip"
    std: float = 0.0


@dataclass(frozen=True)
class TraceSettings:
    mode: str
    sample_every: int
    window_s: tuple[float, float] | None
    max_events: int | None


@dataclass(frozen=True)
class MetricsSettings:
    port: int | None
    host: str
    agent_port: int
    per_worker: bool
    linger_s: float


@dataclass(frozen=True)
class RunConfig:
    """The validated config: typed values, units resolved. ``raw`` is what ``config.yaml`` records."""

    raw: dict[str, Any]
    run_id: str | None
    seed: int
    workers: int
    agents: int
    placement: str
    batch_size: tuple[int, ...]
    lr: float
    momentum: float
    optimizer: str
    device: str
    threads: int
    memory: str  # auto | compact | fast: the agents' allocator (agents/core.py)
    strategy: str  # dotted path of the Strategy class
    strategy_name: str
    strategy_settings: dict[str, Any]
    model: dict[str, Any]
    stop_updates: int | None
    stop_virtual_time_ns: int | None
    eval_every: int
    eval_samples: int
    data_root: str | None
    partition: str
    partition_kw: dict[str, Any]
    network: NetworkSettings
    compute: ComputeSettings
    launcher: S.LauncherConfig
    controller: S.ControllerConfig
    trace: TraceSettings
    metrics: MetricsSettings
    statelog: S.StatelogConfig
    outputs: S.OutputsConfig
    recovery: S.RecoveryConfig
    progress: bool
    log_level: str
    predict: bool = False
    data: S.DataConfig = field(default_factory=S.DataConfig)
    predictor: S.PredictorConfig = field(default_factory=S.PredictorConfig)
    flow_cap: float | None = None  # predictor.flow_cap in bytes/s
    faults: tuple[FaultSetting, ...] = ()


# top-level keys that change neither what a run computes nor what it writes: its id, Hydra's own, where the
# outputs go, how it recovers, the progress bar and the log level (config_hash, recovery.resume=auto's check)
NOT_THE_EXPERIMENT = ("run_id", "hydra", "outputs", "recovery", "progress", "log_level")


def config_hash(raw: dict[str, Any]) -> str:
    """A short stable hash of the resolved config, without :data:`NOT_THE_EXPERIMENT`'s keys."""
    d = {k: v for k, v in raw.items() if k not in NOT_THE_EXPERIMENT}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]


# ------------------------------------------------- schema-driven messages
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) is typing.Union and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return tp, False


def _bounds(meta: dict[str, Any]) -> str:
    def num(x: float) -> str:
        return str(x) if isinstance(x, int) else f"{x:g}"

    parts = []
    if meta.get("lo") is not None:
        parts.append(("> " if meta.get("lo_open") else ">= ") + num(meta["lo"]))
    if meta.get("hi") is not None:
        parts.append(("< " if meta.get("hi_open") else "<= ") + num(meta["hi"]))
    return " and ".join(parts)


# a list of mappings in a sentence: an example of one, and where the rest is documented
_LIST_EXAMPLES: dict[type, str] = {S.FaultConfig: "[{kind: crash, workers: [w1], at: 1s}]"}
_LIST_DOCS: dict[type, str] = {S.FaultConfig: "docs/faults.md"}


def accepted_text(cls: type, name: str) -> str:
    """What ``cls.name`` accepts, in words (used by every sentence about that key)."""
    f = next(f for f in fields(cls) if f.name == name)
    tp, optional = _unwrap_optional(_hints(cls)[name])
    meta = dict(f.metadata)
    b = _bounds(meta)
    if meta.get("choices"):
        text = " | ".join(meta["choices"])
    elif isinstance(tp, type) and issubclass(tp, Enum):
        text = " | ".join(m.value for m in tp)
    elif meta.get("unit") == "duration":
        text = "a duration" + (f" {b}" if b else "") + " (seconds, or a string like 1ms, 250us, 2s)"
    elif tp is bool:
        text = "true | false"
    elif tp is int:
        text = "an integer" + (f" {b}" if b else "")
    elif tp is float:
        text = "a number" + (f" {b}" if b else "")
    elif tp is str:
        text = "a string"
    elif is_dataclass(tp):
        text = "a mapping with keys " + ", ".join(x.name for x in fields(tp))
    elif typing.get_origin(tp) is list and typing.get_args(tp) and is_dataclass(typing.get_args(tp)[0]):
        # what the key takes, not what it is for (its help): faults={kind: crash} was told "injected faults, ..."
        item = typing.get_args(tp)[0]
        text = "a list of mappings" + (f", e.g. {_LIST_EXAMPLES[item]}" if item in _LIST_EXAMPLES else
                                       " with keys " + ", ".join(x.name for x in fields(item)))
        text += " ([] = none" + (f"; {_LIST_DOCS[item]})" if item in _LIST_DOCS else ")")
    elif typing.get_origin(tp) is list and typing.get_args(tp) and typing.get_args(tp)[0] in (int, float, str):
        what = {int: "integers", float: "numbers", str: "strings"}[typing.get_args(tp)[0]]
        text = f"a list of {what}"
    else:
        text = meta.get("help") or "see docs/configuration.md"
    return text + (" or null" if optional else "")


def field_at(root: type, path: str, node_types: dict[str, type] | None = None) -> tuple[type, str] | None:
    """The (schema class, field name) of a dotted key, following nested dataclasses; None if unknown.

    ``node_types`` names the schema of group nodes typed ``Any`` at the top (strategy, launcher, model).
    """
    parts = path.split(".")
    cls: Any = root
    for i, part in enumerate(parts):
        if node_types and i == 1 and parts[0] in node_types:
            cls = node_types[parts[0]]
        if not (isinstance(cls, type) and is_dataclass(cls)):
            return None
        names = {f.name for f in fields(cls)}
        if part not in names:
            return None
        if i == len(parts) - 1:
            return cls, part
        tp, _ = _unwrap_optional(_hints(cls)[part])
        cls = tp
    return None


def did_you_mean(key: str, options: list[str]) -> str:
    close = difflib.get_close_matches(key, options, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _within(v: float, meta: dict[str, Any]) -> bool:
    lo, hi = meta.get("lo"), meta.get("hi")
    if lo is not None and (v <= lo if meta.get("lo_open") else v < lo):
        return False
    if hi is not None and (v >= hi if meta.get("hi_open") else v > hi):
        return False
    return True


class _Problems:
    def __init__(self, written: dict[str, str] | None = None) -> None:
        self.items: list[str] = []
        self.written = written or {}  # key -> the value as the user typed it on the command line
        self.keys: set[str] = set()  # keys with a bad value already said: one sentence each

    def bad(self, key: str, value: Any, accepted: str) -> None:
        if key in self.keys:  # e.g. network.latency=nan: the field's check and the section's
            return
        self.keys.add(key)
        shown = self.written.get(key, _show(value))
        self.items.append(f"{key}={shown} is not valid; accepted: {accepted}.")

    def add(self, sentence: str) -> None:
        self.items.append(sentence)


def _show(value: Any) -> str:
    """A value as the user wrote it: null for None, strings quoted."""
    if isinstance(value, Enum):
        value = value.value
    return "null" if value is None else repr(value)


@lru_cache(maxsize=None)
def _containers(cls: type) -> dict[str, type]:
    """The fields of a schema class declared as a list or a dict: name -> list | dict."""
    out = {}
    for name, hint in typing.get_type_hints(cls).items():
        origin = typing.get_origin(hint)
        if origin is typing.Union:  # Optional[List[...]]
            origin = next((typing.get_origin(a) for a in typing.get_args(hint) if typing.get_origin(a)), None)
        if origin in (list, dict):
            out[name] = origin
    return out


def _check_fields(obj: Any, prefix: str, p: _Problems) -> None:
    """Generic checks of one schema object's fields (bounds, choices, units), recursing into sections."""
    cls = type(obj)
    containers = _containers(cls)
    for f in fields(cls):
        if f.name.startswith("_"):
            continue
        v = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        meta = f.metadata
        if is_dataclass(v):
            _check_fields(v, key + ".", p)
            continue
        if v is None:
            continue
        want = containers.get(f.name)
        if want is not None and not isinstance(v, want):  # e.g. compute.params=${workers}: an int
            p.bad(key, v, f"{'a list' if want is list else 'a mapping'} ({accepted_text(cls, f.name)})")
            setattr(obj, f.name, want())  # reported; later checks see an empty one
            continue
        if meta.get("unit") == "duration":
            try:
                s = parse_duration(v, key)
            except UnitError:
                p.bad(key, v, accepted_text(cls, f.name))
                continue
            if not math.isfinite(s) or not _within(s, meta):
                p.bad(key, v, accepted_text(cls, f.name))
            elif s >= MAX_DURATION_S:
                p.bad(key, v, TOO_LONG)
        elif meta.get("choices") and v not in meta["choices"]:
            p.bad(key, v, accepted_text(cls, f.name))
        elif _is_num(v) and not _within(v, meta):
            p.bad(key, v, accepted_text(cls, f.name))
        elif isinstance(v, float) and not math.isfinite(v):
            p.bad(key, v, accepted_text(cls, f.name))


BUILT_IN_TARGETS = frozenset({
    *("agents.workloads.models." + m for m in ("MLP", "ThesisCNN", "SmallResNet", "Flat")),
})


def _user_target(node: DictConfig) -> bool:
    """A node whose ``_target_`` names a user's class: its keys are that class's business."""
    from agents.strategies import STRATEGIES

    target = node.get("_target_") if "_target_" in node else None
    return isinstance(target, str) and target not in BUILT_IN_TARGETS and target not in STRATEGIES.values()


def _unknown_keys(node: DictConfig, prefix: str, p: _Problems) -> None:
    """Keys added with ``+`` to a node that has a schema: rejected with a suggestion.

    A strategy or model node naming a user's class (``strategy._target_=my.Strategy``) takes any key.
    """
    cls = OmegaConf.get_type(node)
    if cls is None or not is_dataclass(cls) or _user_target(node):
        return
    names = [f.name for f in fields(cls)]
    for k in list(node.keys()):
        k = str(k)
        if k not in names:
            opts = [x for x in names if not x.startswith("_")]
            accepted = ", ".join(opts) or (f"no key besides _target_; a class of your own "
                                           f"({prefix}_target_=my.Module) takes its constructor's arguments"
                                           if "_target_" in names else "none")
            p.add(f"{prefix}{k} is not a key of {prefix.rstrip('.') or 'the config'}"
                  f"{did_you_mean(k, names)} (accepted: {accepted}).")
            with _open(node):
                del node[k]
        else:
            child = node._get_node(k)  # noqa: SLF001 - the typed child node, not its value
            if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():  # noqa: SLF001
                _unknown_keys(child, f"{prefix}{k}.", p)


class _open:
    def __init__(self, node: DictConfig):
        self.node = node

    def __enter__(self) -> None:
        from omegaconf import open_dict

        self.ctx = open_dict(self.node)
        self.ctx.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.ctx.__exit__(*exc)


# --------------------------------------------------------------- validate
def validate(cfg: DictConfig | dict, check_data: bool = True, written: dict[str, str] | None = None) -> RunConfig:
    """Check every key of a composed config; raise ConfigError listing each problem, else a RunConfig.

    ``written`` (key -> text) lets a sentence quote a command-line value as the user typed it.
    """
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    cfg = cfg.copy()
    with _open(cfg):
        cfg.pop("hydra", None)
    p = _Problems(written)
    try:
        raw = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    except InterpolationResolutionError as e:  # e.g. batch_size=${nope}, or ${workers} where an enum is due
        raise ConfigError([f"{getattr(e, 'full_key', None) or 'a value'}: the interpolation cannot be resolved "
                           f"({str(e).splitlines()[0]}); accepted: a value, or ${{key}} naming a key of the "
                           "config that has a value of the right type."]) from None
    _unknown_keys(cfg, "", p)
    missing = sorted(OmegaConf.missing_keys(cfg))
    for key in missing:
        p.add(f"{key} is not set (??? in the config); set it, e.g. on the command line: {key}=<value>.")
    if missing:
        raise ConfigError(p.items)
    typed = OmegaConf.to_object(cfg)
    root = typed if isinstance(typed, S.LockstepConfig) else None
    if root is None:  # a config composed without base_config (e.g. a plain dict): type it now
        root = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(S.LockstepConfig), cfg))
    _check_fields(root, "", p)  # recurses into every section and typed group node
    return _resolve(root, raw, p, check_data)


def _resolve(c: S.LockstepConfig, raw: dict[str, Any], p: _Problems, check_data: bool) -> RunConfig:
    """Cross-key rules, and the typed RunConfig. Strategy and model settings are taken as written (``raw``):
    a user's class may take keys its option's schema does not know."""
    workers, agents = c.workers, c.agents
    good_workers = workers if isinstance(workers, int) and workers >= 1 else None
    if good_workers and good_workers > MAX_WORKERS:  # before anything is sized by it (found by fuzzing)
        p.bad("workers", workers, f"an integer >= 1 and <= {MAX_WORKERS}")
        good_workers = None
    if not (c.device in ("cpu", "cuda") or (c.device.startswith("cuda:") and c.device[5:].isdecimal())):
        p.bad("device", c.device, "cpu | cuda | cuda:N (N a device index >= 0)")
    if c.run_id is not None and not c.run_id.replace("-", "").replace("_", "").isalnum():
        p.bad("run_id", c.run_id, "letters, digits, '-' and '_'")

    strategy = dict(raw["strategy"])
    strategy_path = strategy.get("_target_")
    strategy_name = strategy.get("name") or strategy_path
    strategy_cls = None
    from agents.strategies import STRATEGIES, load_strategy
    from agents.strategies.base import layout_of

    try:
        strategy_cls = load_strategy(strategy_path)
    except Exception as e:  # noqa: BLE001 - any import problem is a config error here
        p.add(f"strategy={strategy_name!r} (strategy._target_={strategy_path!r}) cannot be loaded ({e}); "
              f"accepted: {' | '.join(STRATEGIES)} or a dotted path to a Strategy subclass.")
    settings = {k: v for k, v in strategy.items() if k not in ("_target_", "name")}

    bs = c.batch_size
    batch_size: tuple[int, ...] = ()
    if isinstance(bs, int) and not isinstance(bs, bool) and bs >= 1 and good_workers:
        batch_size = (bs,) * good_workers
    elif isinstance(bs, list) and good_workers and len(bs) == good_workers and all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in bs):
        batch_size = tuple(bs)
    elif good_workers:  # (an invalid `workers` is reported once, not again through batch_size)
        p.bad("batch_size", bs, f"an integer >= 1, or a list of {good_workers} such integers (one per worker)")

    stop_vt = None if c.stop.virtual_time is None else _seconds(c.stop.virtual_time)
    if c.data.placement == "local" and c.data.cache != "none":
        p.bad("data.cache", c.data.cache, "none with data.placement=local (a cache holds samples that travel: "
              "data.placement=end_devices)")
    for name, unread, why in (  # data keys another data setting leaves unread: refused, not ignored
            ("end_devices", c.data.placement == "local", "with data.placement=local"),
            ("sample_bytes", c.data.placement == "local", "with data.placement=local, where no sample travels"),
            ("cache_size", c.data.cache == "none", "with data.cache=none"),
            ("alpha", c.data.partition.value != "dirichlet", "unless data.partition=dirichlet, its concentration"),
            ("major", c.data.partition.value != "non_iid", "unless data.partition=non_iid, its share of two classes")):
        default = S.default_of(S.DataConfig, name)
        if unread and getattr(c.data, name) != default:
            p.bad(f"data.{name}", getattr(c.data, name), f"{_show(default)} {why} (it changed nothing)")
    if c.stop.updates is None and c.stop.virtual_time is None:
        p.add("stop.updates and stop.virtual_time are both null; set at least one "
              "(e.g. stop.updates=1000 or stop.virtual_time=60s).")

    partition = c.data.partition.value
    partition_kw: dict[str, Any] = {}
    if partition == "dirichlet":
        partition_kw = {"alpha": c.data.alpha}
    elif partition == "non_iid":
        partition_kw = {"major": c.data.major}
    if c.data.per_client is not None:  # shards of this many samples drawn for each client (they may overlap)
        if partition != "iid":
            p.bad("data.per_client", c.data.per_client, "null unless data.partition=iid")
        else:
            partition_kw = {"per_client": c.data.per_client}

    model = dict(raw["model"])
    if not isinstance(model.get("_target_"), str):
        p.bad("model", model, "mlp | cnn | resnet, or a config with _target_ naming an nn.Module class")

    network = _network(c.network, good_workers, p)
    compute = _compute(c.compute, good_workers, c.seed, p)
    _unread_compute(p, c.compute)
    launcher = c.launcher
    if not isinstance(launcher, S.LauncherConfig):
        p.bad("launcher", _plain(launcher).get("name"), "inprocess | local | kubernetes | ray")
    elif isinstance(launcher, S.KubernetesLauncherConfig) and importlib.util.find_spec("kubernetes") is None:
        p.add("launcher=kubernetes needs the Kubernetes client, which is not installed: "
              "pip install 'lockstep[kubernetes]'.")
    elif isinstance(launcher, S.RayLauncherConfig):
        _ray_launcher(launcher, c, p)
    ctl = c.controller
    if ctl.agent_timeout_s < 2 * ctl.heartbeat_s:
        p.bad("controller.agent_timeout_s", ctl.agent_timeout_s,
              f"at least twice controller.heartbeat_s ({ctl.heartbeat_s:g} s)")
    if not ctl.host:
        p.bad("controller.host", ctl.host, "an address to listen on, e.g. 127.0.0.1 or 0.0.0.0")
    _tls(ctl.tls, isinstance(launcher, S.LocalLauncherConfig), p, check_files=check_data)
    trace = _trace(c.trace, p)
    metrics = _metrics(c, p)
    if c.outputs.upload is not None and "://" not in c.outputs.upload:
        p.bad("outputs.upload", c.outputs.upload, "null or an fsspec URL such as s3://bucket/prefix, gs://bucket/prefix "
              "or file:///path")
    elif c.outputs.upload is not None and "::" not in c.outputs.upload:  # (a chained URL: fsspec's to parse)
        _upload_protocol(p, c.outputs.upload, check_data)
    if isinstance(launcher, (S.InprocessLauncherConfig, S.LocalLauncherConfig)) and check_data \
            and c.compute.model == S.ComputeModelName.profiled:  # the agents write the profile database here
        from agents.sim.compute import default_profile_db
        from controller.outputs import unwritable

        why = unwritable(c.compute.db or default_profile_db())
        if why:
            p.bad("compute.db", c.compute.db, f"a file the agents can write the profiles to ({why})")

    if "segment" in settings:
        _check_segment(p, settings)
    if strategy_cls is not None and strategy_path in STRATEGIES.values():
        _unread_settings(p, strategy_name, settings)
    if strategy_path == STRATEGIES["sgd"] and good_workers and good_workers != 1:  # summary.json said 4 workers
        p.bad("workers", workers, "1 with strategy=sgd, which trains one learner (w0); strategy=ps_sync or another "
              "strategy trains several workers")
    _unread_network(p, c.network, _paces_by_egress(strategy_cls, c.compute.layerwise))
    if c.optimizer == S.Optimizer.adam and getattr(strategy_cls, "server_cls", None) in ("FedServer",
                                                                                          "FedAsyncServer"):
        p.bad("optimizer", "adam", f"sgd with strategy {strategy_name}: each client trains its round with a fresh SGD "
              "(McMahan et al.) and the server mixes models, so no one would use Adam (it changed nothing)")
    if c.momentum and c.optimizer == S.Optimizer.adam:
        p.bad("momentum", c.momentum, "0 with optimizer=adam (momentum is SGD's; Adam keeps its own moments), or "
              "optimizer=sgd")
    if c.compute.profile is not None and c.compute.model != S.ComputeModelName.profiled:
        p.bad("compute.profile", c.compute.profile, f"null with compute={c.compute.model.value} (a device profile is "
              "read by compute=profiled only)")

    flow_cap = None if c.predictor.flow_cap is None else _rate(p, "predictor.flow_cap", c.predictor.flow_cap)
    n_tensors = None
    if not p.items and model is not None:
        n_tensors = _check_model(p, model, c.seed, c.data.root if check_data else False)
    # the vworkers, laid out once (100 000 FedAvg clients: 0.4 s a layout)
    layout = None
    if not p.items and strategy_cls is not None:
        try:
            layout = layout_of(strategy_cls, workers, settings)
        except ValueError as e:  # a strategy's own sentence (strategy.degree=4 ... for 4 workers; accepted: ...)
            p.add(str(e).rstrip(".") + ".")
    if layout is not None and n_tensors is not None:
        _check_shards(p, strategy_cls, settings, n_tensors, c.compute.layerwise)
    if layout is not None and c.compute.layerwise is True:
        _check_layerwise(p, strategy_cls, strategy_name, settings)
    if layout is not None and check_data:
        _check_data(p, c.data.root, partition, partition_kw, layout, workers, batch_size, c.seed, c.eval.samples)
    faults: tuple[FaultSetting, ...] = ()
    if not p.items and layout is not None:
        n_vworkers = len(layout)
        if agents > n_vworkers:
            p.bad("agents", agents, f"at most the number of vworkers ({n_vworkers})")
        elif c.placement.value == "ps_alone" and all(v.holds_data for v in layout):
            p.bad("placement", "ps_alone", f"round_robin | block: strategy {strategy_name} has no vworker without "
                                           "data (a PS) to put alone on agent 0, which would host nothing")
        for key, named in (("compute.stragglers", compute.stragglers),
                           ("compute.start_offsets", compute.start_offsets_s)):
            unknown = sorted(set(named) - {v.name for v in layout})
            if unknown:
                p.bad(key, dict(named), f"vworker names of this run ({layout[0].name} .. "
                      f"{layout[-1].name}); {', '.join(unknown)} is not one")
        from controller.plan import with_data_servers

        everyone = with_data_servers(layout, c.data)
        _check_topology(p, network, everyone, agents)
        groups = network.latency.groups
        if network.latency.kind == "matrix" and groups is not None and len(groups) != len(everyone):
            p.bad("network.latency.groups", list(groups), f"null, or {len(everyone)} region indices, one per vworker "
                  f"({everyone[0].name} .. {everyone[-1].name}: workers first, then servers)")
        _check_round_timeout(p, strategy_cls, settings, network.latency)
        if c.statelog.snapshot_every and not _has_parameter_server(layout):
            p.bad("statelog.snapshot_every", c.statelog.snapshot_every,
                  f"0 with strategy {strategy_name}: snapshots are a parameter server's versions (ps_sync, ps_async, "
                  "ssp), and no vworker of this strategy is one (it wrote none, without a word)")
        faults = _faults(p, c, layout, strategy_cls.result_for(workers, settings), strategy_cls, settings)
    elif c.faults:
        for i, f in enumerate(c.faults):
            _check_fields(f, f"faults[{i}].", p)
    if p.items:
        raise ConfigError(p.items)
    return RunConfig(
        raw=raw, run_id=c.run_id, seed=c.seed, workers=workers, agents=agents, placement=c.placement.value,
        batch_size=batch_size, lr=c.lr, momentum=c.momentum, optimizer=c.optimizer.value, device=c.device,
        threads=c.threads, memory=c.memory, strategy=f"{strategy_cls.__module__}.{strategy_cls.__qualname__}",
        strategy_name=strategy_name, strategy_settings=settings, model=model, stop_updates=c.stop.updates,
        stop_virtual_time_ns=None if stop_vt is None else seconds_to_ns(stop_vt), eval_every=c.eval.every,
        eval_samples=c.eval.samples, data_root=c.data.root, partition=partition, partition_kw=partition_kw,
        network=network, compute=compute, launcher=launcher, controller=ctl, trace=trace, metrics=metrics,
        statelog=c.statelog, outputs=c.outputs, recovery=c.recovery, progress=c.progress,
        log_level=c.log_level.value, predict=c.predict, predictor=c.predictor, flow_cap=flow_cap, data=c.data,
        faults=faults)


def _upload_protocol(p: _Problems, url: str, installed: bool) -> None:
    """``outputs.upload``: a protocol fsspec knows (checked before the run, not after it) and, where the run's
    controller is this process (``installed``), whose package is here."""
    import fsspec

    protocol = url.split("://", 1)[0]
    try:
        fsspec.get_filesystem_class(protocol)
    except ValueError:
        p.bad("outputs.upload", url, f"an fsspec URL with a protocol fsspec knows (file, s3, gs, ...); {protocol!r} "
              "is not one")
    except ImportError as e:
        if installed:
            p.add(f"outputs.upload={url} needs a package that is not installed ({e}); pip install 'lockstep[upload]' "
                  "brings s3fs and gcsfs.")


def _tls(tls: S.TLSConfig, local: bool, p: _Problems, check_files: bool = True) -> None:
    """``controller.tls``: when on, the controller's files must be there (and the agents' too with
    launcher=local, whose agents read them on this machine); ``check_files`` False (like ``check_data``)
    checks a config meant for another machine, e.g. the chart's pod, without looking at this one's files."""
    if not tls.enabled:
        return
    import os

    for key in ("cert", "key", "ca", "agent_cert", "agent_key"):
        v = getattr(tls, key)
        if v is None:
            if key in ("cert", "key", "ca"):
                p.bad(f"controller.tls.{key}", v, "a PEM file (controller.tls.enabled=true needs cert, key and ca)")
        elif check_files and (key in ("cert", "key", "ca") or local) and not os.path.isfile(v):
            p.bad(f"controller.tls.{key}", v, "a readable PEM file (it does not exist)")
    if not check_files:
        return
    from agents.common.trust import check_pair

    pairs = [("cert", "key")] + ([("agent_cert", "agent_key")] if local and tls.agent_cert else [])
    for c, k in pairs:
        files = [tls.ca, getattr(tls, c), getattr(tls, k) or getattr(tls, c)]
        if not all(f is not None and os.path.isfile(f) for f in files):
            continue  # said above
        wrong = check_pair(*files)
        if wrong is None:
            continue
        at, why = wrong
        if at == "key":
            p.bad(f"controller.tls.{k}", getattr(tls, k),
                  f"the private key of controller.tls.{c}={getattr(tls, c)} (loading the pair failed: {why})")
        else:
            p.bad("controller.tls.ca", tls.ca,
                  f"the CA that signed controller.tls.{c}={getattr(tls, c)} (verifying it failed: {why})")


def _plain(node: Any) -> dict[str, Any]:
    """A group node (a schema object or a plain mapping) as a dict of plain values."""
    if is_dataclass(node):
        return {f.name: _enum_value(getattr(node, f.name)) for f in fields(node)}
    if isinstance(node, (DictConfig, ListConfig)):
        return OmegaConf.to_container(node, resolve=True, enum_to_str=True)  # type: ignore[return-value]
    return dict(node or {})


# a built-in strategy's key that another of its settings leaves unread, set to anything but its schema's default:
# refused rather than ignored (strategy, its schema, key, when it is unread, why)
_UNREAD_SETTINGS: tuple[tuple[str, type, str, Callable[[dict[str, Any]], bool], str], ...] = (
    ("gossip", S.GossipConfig, "degree", lambda s: s.get("topology") == "ring",
     "with strategy.topology=ring, whose graph is the ring (degree is strategy.topology=random's)"),
    ("gossip", S.GossipConfig, "graph_seed", lambda s: s.get("topology") == "ring",
     "with strategy.topology=ring (graph_seed keys strategy.topology=random's graph)"),
    ("fedavg", S.FedAvgConfig, "local_epochs", lambda s: s.get("local_steps") is not None,
     "with strategy.local_steps set, which counts the round's steps instead"),
    ("fedasync", S.FedAsyncConfig, "local_epochs", lambda s: s.get("local_steps") is not None,
     "with strategy.local_steps set, which counts the round's steps instead"),
    ("fedasync", S.FedAsyncConfig, "a", lambda s: s.get("staleness") == "constant",
     "with strategy.staleness=constant, whose weight is alpha alone"),
    ("fedasync", S.FedAsyncConfig, "b", lambda s: s.get("staleness") != "hinge",
     "unless strategy.staleness=hinge, the only staleness function with a b"),
)


def _unread_settings(p: _Problems, strategy: str, settings: dict[str, Any]) -> None:
    """Settings of a built-in strategy that others leave unread (``_UNREAD_SETTINGS``)."""
    for name, schema, key, unread, why in _UNREAD_SETTINGS:
        default = S.default_of(schema, key)
        if name == strategy and key in settings and settings[key] != default and unread(settings):
            p.bad(f"strategy.{key}", settings[key], f"{_show(default)} {why} (it changed nothing)")


# the compute keys that only some compute models read (agents/sim/compute.py; controller/predict/costs.py, whose
# predictions time what the profile database lacks for compute=measured too): (key, who reads it, whether it is
# unread); one set to anything but its schema's default where it is unread is refused rather than ignored
_PROFILED, _MEASURED = S.ComputeModelName.profiled, S.ComputeModelName.measured
_DISTRIBUTION, _ANALYTIC = S.ComputeModelName.distribution, S.ComputeModelName.analytic
_UNREAD_COMPUTE: tuple[tuple[str, str, Callable[[S.ComputeConfig], bool]], ...] = (
    *((kind, "compute=constant, and by compute=distribution for a kind not in compute.kinds",
       lambda c, kind=kind: c.model in (_PROFILED, _MEASURED, _ANALYTIC) or (
           c.model == _DISTRIBUTION and kind in c.kinds)) for kind in KINDS),
    *((key, "compute=distribution", lambda c: c.model != _DISTRIBUTION) for key in ("distribution", "params", "kinds")),
    ("peak_flops", "compute=analytic", lambda c: c.model != _ANALYTIC),
    ("runs", "compute=profiled, and by compute=measured's predictions (predict=true, lockstep predict), which time "
             "the calls the profile database lacks", lambda c: c.model not in (_PROFILED, _MEASURED)),
    ("db", "compute=profiled, by compute=measured's predictions, and by compute.batch=auto, which keeps its probe's "
           "timings there",
     lambda c: c.model not in (_PROFILED, _MEASURED) and c.batch != S.BatchMode.auto),
)


def _unread_compute(p: _Problems, c: S.ComputeConfig) -> None:
    """Keys of ``compute`` that its model leaves unread (``_UNREAD_COMPUTE``): a compute.gradient with
    compute=profiled changed nothing, without a word."""
    preset = _compute_preset(c.model.value)
    for key, readers, unread in _UNREAD_COMPUTE:
        value, default = _enum_value(getattr(c, key)), S.default_of(S.ComputeConfig, key)
        if value == default or value == preset.get(key, default) or not unread(c):
            continue  # (the preset's own value: compute=distribution's update, unread once kinds draws it)
        where = f"compute={c.model.value}"
        if key in KINDS and c.model == _DISTRIBUTION:
            where += f" and compute.kinds={_show(list(c.kinds))}, which draws {key} from compute.distribution"
        elif key == "db":
            where += f" and compute.batch={c.batch.value}"
        p.bad(f"compute.{key}", value, f"{_show(default)} with {where} (compute.{key} is read by {readers}; it changed "
              "nothing)")


@lru_cache(maxsize=None)
def _compute_preset(model: str) -> dict[str, Any]:
    """The values conf/compute/<model>.yaml sets (``{}`` where there is no such preset): a user who did not set
    them is not told they changed nothing."""
    from pathlib import Path

    from controller.config.load import CONF_DIR

    path = Path(CONF_DIR) / "compute" / f"{model}.yaml"
    if not path.is_file():
        return {}
    d = OmegaConf.to_container(OmegaConf.load(path))
    return {k: v for k, v in d.items() if k != "defaults"} if isinstance(d, dict) else {}


# the keys of network.links each preset topology reads (controller/topology.py); star (the per-NIC model) and a
# custom topology, whose links carry their own bandwidth and latency, read none
_LINKS_READ = {"tree": ("bandwidth", "latency", "edges", "ends_per_edge"),
               "fat_tree": ("bandwidth", "latency", "hosts_per_leaf", "spines", "oversubscription")}


def _paces_by_egress(strategy_cls: Any, layerwise: Any) -> bool:
    """Whether a run reads its egress discipline whatever the topology: a parameter server's per-layer sends
    (compute.layerwise) go out one layer at a time under fair, all at once otherwise
    (agents/strategies/layerwise.py)."""
    from agents.strategies.ps import _PS

    return layerwise is True and isinstance(strategy_cls, type) and issubclass(strategy_cls, _PS)


def _same(value: Any, default: Any, unit: str) -> bool:
    """Whether a network.links value is its default, however spelt (125e6 is 1Gbit/s, 0.0001 is 100us)."""
    if value == default:
        return True
    try:
        if unit == "rate":
            return math.isclose(parse_rate(value), parse_rate(default), rel_tol=1e-12)
        return seconds_to_ns(parse_duration(value)) == seconds_to_ns(parse_duration(default))
    except (UnitError, TypeError, ValueError, OverflowError):
        return False


def _unread_network(p: _Problems, n: S.NetworkConfig, egress_read: bool) -> None:
    """Keys of ``network`` that its topology leaves unread: another topology's ``network.links`` keys, and with
    links beyond the NICs the star's disciplines (agents/sim/topology.py shares every link, NICs included, max-min);
    ``egress_read``: a layer-wise parameter server paces its sends by the egress's discipline all the same."""
    topology = n.topology
    if isinstance(topology, (DictConfig, dict)):
        kind, where = "custom", "a custom network.topology"
    elif topology in (None, "star", *_LINKS_READ):
        kind = topology or "star"
        where = f"network.topology={kind}"
    else:
        return  # not a topology: said by _check_topology
    reads = _LINKS_READ.get(kind, ())
    for f in fields(S.TopologyLinksConfig):
        value, default = getattr(n.links, f.name), S.default_of(S.TopologyLinksConfig, f.name)
        unit = {"bandwidth": "rate", "latency": "duration"}.get(f.name)
        if f.name in reads or (_same(value, default, unit) if unit else value == default):
            continue
        said = (f"reads network.links.{', '.join(reads[:-1])} and {reads[-1]} (it changed nothing)" if reads else
                "reads no network.links key (they are the tree and fat_tree presets' links; it changed nothing)")
        p.bad(f"network.links.{f.name}", value, f"{_show(default)} with {where}, which {said}")
    if n.model != S.NetworkModel.tcp:  # the tcp transport's parameters, read by network.model=tcp alone
        for f in fields(S.TcpConfig):
            value, default = getattr(n.tcp, f.name), S.default_of(S.TcpConfig, f.name)
            unit = "duration" if f.metadata.get("unit") == "duration" else None
            if not (_same(value, default, unit) if unit else value == default):
                p.bad(f"network.tcp.{f.name}", value, f"{_show(default)} with network.model={n.model.value}, which "
                      "reads no network.tcp key (they are the tcp transport's; it changed nothing), or "
                      "network.model=tcp")
    if kind == "star" or n.model != S.NetworkModel.ideal:  # (tcp: its own sentences, on its disciplines and links)
        return
    share = (f"with {where}, whose flows share every link of their routes, NICs included, max-min fairly (the "
             "disciplines are read with network.topology=star, and the egress by a parameter server with "
             "compute.layerwise=true; it changed nothing)")
    for key, unread in (("discipline", n.discipline != S.Discipline.fair and not (egress_read and n.egress is None)),
                        ("egress", n.egress is not None and not egress_read), ("ingress", n.ingress is not None)):
        if unread:
            p.bad(f"network.{key}", getattr(n, key), f"{_show(S.default_of(S.NetworkConfig, key))} {share}")


def _has_parameter_server(layout: list[Any]) -> bool:
    """Whether a vworker of ``layout`` runs a parameter server, the only vworker that logs versions (and so
    writes statelog.snapshot_every's snapshots)."""
    from agents.strategies import import_path
    from agents.strategies.ps import ParameterServer

    for v in layout:
        try:
            cls = import_path(v.cls)
        except (ImportError, AttributeError):
            continue
        if isinstance(cls, type) and issubclass(cls, ParameterServer):
            return True
    return False


def _check_segment(p: _Problems, settings: dict[str, Any]) -> None:
    """``strategy.segment``: null (whole chunks) or a size of at least one float32, read by the ideal collective
    only (a string crashed a worker mid-run; -5, 1.5 or true ran with 4-byte segments, 95 virtual s a step)."""
    seg = settings.get("segment")
    if seg is None:
        return
    accepted = "null (whole chunks) or bytes per segment >= 4 (one float32), as a number or a size like 1MB"
    try:
        n = None if isinstance(seg, bool) else parse_size(seg, "strategy.segment")
    except UnitError:
        n = None
    if n is None or not math.isfinite(n) or n < 4 or (isinstance(seg, (int, float)) and n != int(n)):
        p.bad("strategy.segment", seg, accepted)
    elif settings.get("collective") == "gloo":
        p.bad("strategy.segment", seg, "null with strategy.collective=gloo, whose ring cuts its own segments (at "
              "most 1 MiB); a segment of your choosing is the ideal collective's")


def _least_latency_s(lat: LatencySetting) -> float:
    """The least one-way latency ``network.latency`` can give (seconds; 0 when a draw may be 0)."""
    if lat.kind == "constant":
        return lat.ns / 1e9
    if lat.kind == "matrix":
        return min(min(r) for r in lat.matrix_ns) / 1e9
    return lat.min_s


def _check_round_timeout(p: _Problems, strategy_cls: Any, settings: dict[str, Any], lat: LatencySetting) -> None:
    """A FedAvg round can take in an update no sooner than the model's way to a client and the update's way
    back: a ``round_timeout`` no longer than twice the least latency ends every round empty, for ever."""
    timeout = settings.get("round_timeout")
    if getattr(strategy_cls, "server_cls", None) != "FedServer" or timeout is None:
        return
    s, least = _seconds(timeout), 2 * _least_latency_s(lat)
    if s is not None and least > 0 and s <= least:
        p.bad("strategy.round_timeout", timeout,
              f"a duration longer than {least * 1e6:g} us: a client's update needs the model's way to it and its "
              f"own way back, at least twice network.latency, so every round would end without an update and "
              f"the model would never change")


def _enum_value(v: Any) -> Any:
    return v.value if isinstance(v, Enum) else v


def _seconds(value: Any) -> float | None:
    """Seconds of a duration field; None when it is malformed (``_check_fields`` reported it already)."""
    try:
        return parse_duration(value)
    except UnitError:
        return None


# ---------------------------------------------------------------- sections
def _ray_launcher(r: S.RayLauncherConfig, c: S.LockstepConfig, p: _Problems) -> None:
    """``launcher=ray`` (docs/ray.md): Ray installed, resources Ray accepts, an address it can use."""
    from controller.launchers import ray as ray_launcher  # imports Ray only when a run starts its agents

    if not ray_launcher.available():
        p.add(f"launcher=ray needs Ray, which is not installed; accepted: {ray_launcher.INSTALL_HINT}, "
              "or launcher=local | inprocess | kubernetes.")
    if r.address is not None and r.address != "auto" and ray_launcher.split_address(r.address) is None:
        p.bad("launcher.address", r.address, "null (a private Ray cluster for the run), auto (the cluster `ray start "
              "--head` runs on this machine), HOST:PORT of a running cluster's head, or ray://HOST:PORT")
    g = r.gpus_per_agent
    if g > 1 and g != int(g):
        p.bad("launcher.gpus_per_agent", g, "a number of GPUs >= 0: a fraction up to 1 (0.25 puts four agents on one "
              "GPU) or a whole number")
    if g == 0 and (c.device == "cuda" or c.device.startswith("cuda:")):
        p.bad("launcher.gpus_per_agent", g, f"a share of a GPU > 0 (e.g. 0.25) with device={c.device}: Ray hides the "
              "GPUs from actors that reserve none")
    for key, res in (("launcher.resources_per_agent", r.resources_per_agent),
                     ("launcher.local.resources", r.local.resources)):
        if res is not None and not (isinstance(res, dict) and all(
                isinstance(k, str) and k not in ("CPU", "GPU", "memory") and _is_num(v) and v >= 0
                for k, v in res.items())):
            p.bad(key, res, "null or a mapping from a custom resource name to an amount >= 0, e.g. {lab_node: 1} "
                  "(CPU, GPU and memory have keys of their own)")
    if r.strategy == S.RayStrategy.STRICT_SPREAD and r.address is None and c.agents > 1:
        p.bad("launcher.strategy", r.strategy, "PACK | SPREAD | STRICT_PACK with launcher.address=null: the private "
              "cluster has one node, and STRICT_SPREAD needs a node per agent")
    if r.runtime_env is not None and not isinstance(r.runtime_env, dict):
        p.bad("launcher.runtime_env", r.runtime_env, "null or a Ray runtime_env mapping (pip, env_vars, working_dir, "
              "...)")
    elif r.runtime_env and "LOCKSTEP_TOKEN" in (r.runtime_env.get("env_vars") or {}):
        p.add("launcher.runtime_env.env_vars must not hold LOCKSTEP_TOKEN: Ray shows a runtime_env to anyone who "
              "reads its dashboard or state API; lockstep hands the agents the token itself.")
    ca = r.controller_address
    if ca is not None and (ray_launcher.split_address(ca) is None or ca.startswith("ray:")):
        p.bad("launcher.controller_address", ca, "null or HOST:PORT that the agents' nodes reach")
    if not r.namespace:
        p.bad("launcher.namespace", r.namespace, "a Ray namespace name")



def _trace(t: S.TraceConfig, p: _Problems) -> TraceSettings:
    window = None
    w = t.window
    if w is not None or t.mode == S.TraceMode.window:
        ok = isinstance(w, list) and len(w) == 2
        span: list[float | None] = []
        if ok:
            for i, x in enumerate(w):
                try:
                    span.append(parse_duration(x, f"trace.window[{i}]"))
                except UnitError:
                    span.append(None)
        if not ok or None in span or span[0] > span[1] or span[0] < 0:  # type: ignore[operator]
            p.bad("trace.window", w, "[start, end] virtual times (seconds or strings like 2s) with 0 <= start <= end"
                  + ("; trace.mode=window needs it" if t.mode == S.TraceMode.window else ""))
        else:
            window = (span[0], span[1])
    # the keys another mode reads: set anyway, each changed nothing (a full trace with trace.window set)
    mode = f"trace.mode={t.mode.value}"
    if window is not None and t.mode != S.TraceMode.window:
        p.bad("trace.window", w, f"null with {mode} (trace.window is read by trace.mode=window; it changed nothing)")
    if t.sample_every != S.default_of(S.TraceConfig, "sample_every") and t.mode != S.TraceMode.sample:
        p.bad("trace.sample_every", t.sample_every, f"{S.default_of(S.TraceConfig, 'sample_every')} with {mode} "
              "(trace.sample_every is read by trace.mode=sample; it changed nothing)")
    if t.max_events != S.default_of(S.TraceConfig, "max_events") and t.mode == S.TraceMode.off:
        p.bad("trace.max_events", t.max_events, f"{S.default_of(S.TraceConfig, 'max_events')} with {mode}, which "
              "writes no trace (it changed nothing)")
    return TraceSettings(t.mode.value, t.sample_every, window, t.max_events)  # type: ignore[arg-type]


def _metrics(c: S.LockstepConfig, p: _Problems) -> MetricsSettings:
    m = c.metrics
    if not m.host:
        p.bad("metrics.host", m.host, "an address to bind such as 127.0.0.1 or 0.0.0.0")
    if m.agent_port and isinstance(c.launcher, S.LocalLauncherConfig) and c.agents > 1:
        p.bad("metrics.agent_port", m.agent_port, "0 with launcher=local and several agents (they share one host, "
              "so each needs its own free port)")
    linger = 0.0
    try:
        linger = parse_duration(m.linger_s or 0)
    except UnitError:
        pass  # reported by _check_fields
    return MetricsSettings(m.port, m.host, m.agent_port, m.per_worker, linger)


def _network(n: S.NetworkConfig, workers: int | None, p: _Problems) -> NetworkSettings:
    disc = n.discipline.value
    bw = _bandwidth(p, "network.bandwidth", n.bandwidth, workers)
    bw_in = None if n.bandwidth_in is None else _bandwidth(p, "network.bandwidth_in", n.bandwidth_in, workers)
    tcp = None
    if n.model == S.NetworkModel.tcp:
        if n.efficiency != 1.0 and isinstance(n.efficiency, (int, float)) and 0 < n.efficiency <= 1:
            p.bad("network.efficiency", n.efficiency, "1.0 with network.model=tcp, which derives the goodput from "
                  "network.tcp.mtu, header_bytes and frame_bytes")
        tcp = _tcp(n.tcp, p)
        for key, v in (("discipline", None if disc == "fair" else n.discipline), ("egress", n.egress),
                       ("ingress", n.ingress)):
            if v is not None:  # the packets' model has no discipline: the same results, without a word
                p.add(f"network.{key}={p.written.get(f'network.{key}', v.value)} is not used by network.model=tcp, "
                      "whose NICs send their packets in order and whose flows share a link through TCP's own "
                      f"congestion control; accepted: network.{key}={'fair' if key == 'discipline' else 'null'} "
                      "with tcp, or network=ideal, where the disciplines apply.")
    topology = n.topology
    if isinstance(topology, (DictConfig, dict)):
        topology = _plain(topology)
    if n.model == S.NetworkModel.tcp and topology != "star":
        shown = p.written.get("network.topology", _show(topology)) if isinstance(topology, str) else "{links: ...}"
        p.add(f"network.topology={shown} is not valid with network.model=tcp; accepted: star (the tcp model has no "
              "links beyond the NICs; tree, fat_tree and custom topologies run on network=ideal).")
    return NetworkSettings(latency=_latency(p, n.latency), bandwidth=bw, bandwidth_in=bw_in,
                           efficiency=n.efficiency, egress=n.egress.value if n.egress else disc,
                           ingress=n.ingress.value if n.ingress else disc, tcp=tcp, topology=topology, links=n.links)


def _tcp(t: S.TcpConfig, p: _Problems) -> TcpSpec | None:
    """``network.tcp`` as the engine's TcpSpec (durations in ns); None when a value is bad (reported)."""
    ns = {}
    for key in ("rto_min", "host_latency", "host_jitter", "ack_delay", "delack", "host_rtt_min", "host_rtt_max"):
        s = _duration(p, f"network.tcp.{key}", getattr(t, key))
        if s is None:
            return None
        ns[key + "_ns"] = int(round(s * 1e9))
    if ns["host_rtt_max_ns"] < ns["host_rtt_min_ns"]:
        p.bad("network.tcp.host_rtt_max", t.host_rtt_max,
              f"a duration >= network.tcp.host_rtt_min ({t.host_rtt_min})")
        return None
    try:
        return TcpSpec(mtu=t.mtu, header_bytes=t.header_bytes, frame_bytes=t.frame_bytes,
                       initial_window=t.initial_window, gso_max_bytes=t.gso_max_bytes,
                       nic_burst_bytes=t.nic_burst_bytes, clock_hz=t.clock_hz, tsq_limit_bytes=t.tsq_limit_bytes,
                       wmem_max_bytes=t.wmem_max_bytes,
                       slow_start_after_idle=t.slow_start_after_idle, hystart_delay=t.hystart_delay,
                       hystart_ack_train=t.hystart_ack_train, small_messages_first=t.small_messages_first,
                       delayed_ack=t.delayed_ack, **ns)
    except ValueError as e:
        p.add(f"network.tcp is not valid: {e}.")
        return None


def _rate(p: _Problems, key: str, v: Any) -> float | None:
    try:
        r = parse_rate(v, key)
    except UnitError:
        p.bad(key, v, "bytes/s as a number or a string like 10Gbit/s, 1Gbps, 100MB/s")
        return None
    if not r > 0 or not math.isfinite(r):
        p.bad(key, v, "a bandwidth > 0 (bytes/s or a string like 10Gbit/s)")
        return None
    return r


# how often a draw must be usable: each draw is redrawn up to 1000 times while it falls below its floor
# (a negative compute time, a non-positive rate, a latency below network.latency.min), so at 5 % a run of
# millions of draws never gives up (0.95**1000 ~ 5e-23)
MIN_USABLE_SHARE = 0.05


def usable_share(kind: str, params: tuple[float, ...], floor: float) -> float | str:
    """The share of a distribution's draws at or above ``floor`` (0 for a bandwidth, which must be > 0, is the
    same: the continuous ones put no mass on it), or a sentence saying which parameter is out of range.

    ``weibull``: ``loc + scale * W`` with W ~ Weibull(shape); ``lognormal``: mu and sigma of the log."""
    if not all(math.isfinite(x) for x in params):
        return "finite numbers"
    if kind in ("lognormal", "normal"):
        centre, spread = params[0], params[1]
        if spread < 0:
            return f"{DRAW_PARAMS[kind][1]} >= 0"
        if kind == "lognormal":
            if floor <= 0:
                return 1.0
            floor = math.log(floor)
        if spread == 0:
            return 1.0 if centre >= floor else 0.0
        return 0.5 * math.erfc((floor - centre) / (spread * math.sqrt(2)))
    if kind == "weibull":
        scale, shape, loc = params
        if scale <= 0 or shape <= 0:
            return "scale > 0 and shape > 0"
        w = (floor - loc) / scale
        return 1.0 if w <= 0 else math.exp(-w ** shape)
    if params[0] < 0:  # exponential
        return "scale >= 0"
    return 1.0


def _draws(p: _Problems, key: str, kind: str, params: tuple[float, ...], floor: float, what: str) -> bool:
    """Whether a keyed distribution's parameters give usable draws (reported in ``p`` when not)."""
    names = DRAW_PARAMS[kind]
    shown = f"{kind}({', '.join(f'{n}={x:g}' for n, x in zip(names, params))})"
    share = usable_share(kind, params, floor)
    if isinstance(share, str):
        p.add(f"{key}: {shown} is not a distribution; accepted: {share}.")
        return False
    if share < MIN_USABLE_SHARE:
        p.add(f"{key}: {shown} draws {what} only {share:.2%} of the time (each draw is redrawn until it is); "
              f"accepted: parameters that draw {what} at least {MIN_USABLE_SHARE:.0%} of the time.")
        return False
    return True


def _bandwidth(p: _Problems, key: str, v: Any, workers: int | None) -> BandwidthSetting:
    """A rate (bytes/s), a list of rates (one per worker; servers get the largest) or a keyed distribution.

    A distribution is ``{distribution: weibull, scale, shape, loc, unit: Mbit/s}``
    (the FL-timing thesis' throughput fit); each vworker gets the draw
    ``(seed, "bandwidth", vworker id)``, redrawn while not positive.
    """
    if isinstance(v, list):
        rates = [_rate(p, f"{key}[{i}]", x) for i, x in enumerate(v)]
        if workers and len(v) != workers:
            p.bad(key, v, f"a list of {workers} rates (one per worker)")
        return BandwidthSetting(per_worker=tuple(r or 1.0 for r in rates))
    if isinstance(v, dict):
        kind = v.get("distribution")
        if kind not in BANDWIDTH_DISTRIBUTIONS:
            p.bad(f"{key}.distribution", kind, " | ".join(BANDWIDTH_DISTRIBUTIONS))
            return BandwidthSetting(rate=1.0)
        names = BANDWIDTH_DISTRIBUTIONS[kind]
        params = [v.get(x, 0.0 if x == "loc" else None) for x in names]
        extra = sorted(set(v) - {"distribution", "unit", *names})
        if extra or not all(_is_num(x) for x in params):
            p.bad(key, v, f"{{distribution: {kind}, " + ", ".join(names) + ", unit: Mbit/s}")
            return BandwidthSetting(rate=1.0)
        unit = _rate(p, f"{key}.unit", "1" + str(v.get("unit", "Mbit/s"))) or 1.0
        if not _draws(p, key, kind, tuple(float(x) for x in params), 0.0, "a rate > 0"):
            return BandwidthSetting(rate=1.0)
        return BandwidthSetting(distribution=kind, params=tuple(float(x) for x in params), unit_bps=unit)
    return BandwidthSetting(rate=_rate(p, key, v) or 1.0)


def _latency(p: _Problems, lat: Any) -> LatencySetting:
    none = LatencySetting("constant")
    if isinstance(lat, dict):
        kind = lat.get("distribution")
        allowed = ({"matrix", "groups"} if "matrix" in lat else
                   {"distribution", "min", *LATENCY_DISTRIBUTIONS.get(kind, ())} if kind in LATENCY_DISTRIBUTIONS
                   else None)
        extra = sorted(str(k) for k in set(lat) - allowed) if allowed is not None else []
        if extra:  # (network.latency.group=[...], a typo, changed nothing)
            p.add(f"network.latency.{extra[0]} is not a key of network.latency{did_you_mean(extra[0], sorted(allowed))}"
                  f" (accepted: {', '.join(sorted(allowed))}).")
            return none
        if "matrix" in lat:
            m = lat["matrix"]
            if not (isinstance(m, list) and m and all(isinstance(r, list) and len(r) == len(m) for r in m)):
                p.bad("network.latency.matrix", m, "a square list of lists of durations")
                return none
            rows = [[_duration(p, f"network.latency.matrix[{i}][{j}]", x) for j, x in enumerate(r)]
                    for i, r in enumerate(m)]
            if any(x is None for r in rows for x in r):
                return none
            groups = lat.get("groups")
            if groups is not None and not (isinstance(groups, list) and all(
                    isinstance(g, int) and not isinstance(g, bool) and 0 <= g < len(m) for g in groups)):
                p.bad("network.latency.groups", groups, f"null, or a list of region indices 0..{len(m) - 1}")
                groups = None
            return LatencySetting("matrix", matrix_ns=tuple(tuple(seconds_to_ns(x) for x in r) for r in rows),
                                  groups=None if groups is None else tuple(groups))
        kind = lat.get("distribution")
        if kind not in LATENCY_DISTRIBUTIONS:
            p.bad("network.latency.distribution", kind, " | ".join(LATENCY_DISTRIBUTIONS))
            return none
        params = []
        for name in LATENCY_DISTRIBUTIONS[kind]:
            v = lat.get(name, 0.0 if name == "loc" else None)
            if not _is_num(v):
                p.bad(f"network.latency.{name}", v, "a number (seconds; log-seconds for lognormal mu)")
                return none
            params.append(float(v))
        min_s = _duration(p, "network.latency.min", lat.get("min", 0.0)) or 0.0
        if not _draws(p, "network.latency", kind, tuple(params), min_s,
                      f"a latency >= {min_s:g} s" + (" (network.latency.min)" if min_s else "")):
            return none
        return LatencySetting(kind, params=tuple(params), min_s=min_s)
    s = _duration(p, "network.latency", lat)
    return LatencySetting("constant", ns=0 if s is None else seconds_to_ns(s))


def _duration(p: _Problems, key: str, v: Any, positive: bool = False) -> float | None:
    try:
        s = parse_duration(v, key)
    except UnitError:
        p.bad(key, v, "seconds as a number or a string like 1ms, 250us, 2s")
        return None
    if s < 0 or (positive and s == 0) or not math.isfinite(s):
        p.bad(key, v, "a duration " + ("> 0" if positive else ">= 0"))
        return None
    if s >= MAX_DURATION_S:  # (network.tcp.host_latency=1.8e299 was an OverflowError, found by the fuzzer)
        p.bad(key, v, TOO_LONG)
        return None
    return s


def _compute(c: S.ComputeConfig, workers: int | None, seed: int, p: _Problems) -> ComputeSettings:
    model = c.model.value
    constant_s: dict[str, float] = {}
    for kind in KINDS:
        v = getattr(c, kind)
        needed = model == "constant" or (model == "distribution" and kind not in c.kinds)
        if v is None:
            if needed:
                p.add(f"compute.{kind} is not set; compute={model} needs a duration for kind {kind!r}: "
                      f"compute.{kind}=<seconds>.")
            continue
        try:
            constant_s[kind] = parse_duration(v)
        except UnitError:
            pass  # reported by _check_fields
    if model == "distribution":
        dist, params = c.distribution.value, tuple(c.params)
        counts = {"weibull": (2, 3)}.get(dist, (len(DRAW_PARAMS[dist]),))
        if len(params) not in counts:
            names = DRAW_PARAMS[dist] if dist != "weibull" else ("scale", "shape", "[loc]")
            p.bad("compute.params", list(params), f"[{', '.join(names)}] for compute.distribution={dist} (seconds"
                  f"{'; mu and sigma of the log' if dist == 'lognormal' else ''})")
        else:
            _draws(p, "compute.params", dist, params + ((0.0,) if len(params) == 2 and dist == "weibull" else ()),
                   0.0, "a time >= 0")
    unknown_kinds = [k for k in c.kinds if not isinstance(k, str) or k not in KINDS]  # [[1, 2]] is not hashable
    if unknown_kinds:
        p.bad("compute.kinds", c.kinds, "a list of " + " | ".join(KINDS))
    straggle = c.straggle
    if not (isinstance(c.overlap, bool) or c.overlap == "auto"):
        p.bad("compute.overlap", c.overlap,
              "auto (on in an agent process beside other agents, with at least 2 usable CPUs) | true | false")
    return ComputeSettings(
        model=model, constant_s=constant_s, dist=c.distribution.value, dist_params=tuple(c.params),
        dist_kinds=tuple(c.kinds), peak_flops=c.peak_flops, profile_db=c.db or "", profile_runs=c.runs,
        **_device_profile(p, c.profile if model == "profiled" else None),
        speed_workers=_speed(p, c.speed, workers, seed), stragglers=_stragglers(p, c.stragglers),
        straggle_p=straggle.probability, straggle_factor=straggle.factor if straggle.probability > 0 else 1.0,
        jitter=c.jitter, batch=c.batch.value, max_batch=c.max_batch,
        overlap=c.overlap if isinstance(c.overlap, bool) else "auto", layerwise=c.layerwise,
        forward_fraction=c.forward_fraction, allreduce_share=c.allreduce_share,
        start_spread_s=_seconds(c.start_spread) or 0.0, start_offsets_s=_start_offsets(p, c.start_offsets))


def _device_profile(p: _Problems, name: str | None) -> dict[str, Any]:
    """``compute.profile``: a shipped name (conf/profiles/<name>.json) or a path, read whole into the plan."""
    if not name:
        return {"profile_name": "", "profile": {}, "estimators": {}}
    from controller.config.profiles import ProfileError, read_profile

    try:
        prof = read_profile(name)
    except ProfileError as e:
        p.add(str(e))
        return {"profile_name": "", "profile": {}, "estimators": {}}
    return {"profile_name": prof.name, "profile": dict(prof.signatures), "estimators": dict(prof.estimators)}


def _speed(p: _Problems, speed: Any, workers: int | None, seed: int) -> tuple[float, ...] | None:
    """Per-worker slowdown factors from a list, classes or a keyed distribution (DESIGN §4.2)."""
    if speed is None or not workers:
        return None
    if isinstance(speed, list):
        if len(speed) == workers and all(_is_num(s) and s > 0 for s in speed):
            return tuple(float(s) for s in speed)
        p.bad("compute.speed", speed, f"null, a list of {workers} numbers > 0 (one slowdown factor per worker), "
              "{classes: [{fraction: 0.5, factor: 2.0}, ...]} or {distribution: lognormal|normal|uniform, ...}")
        return None
    if isinstance(speed, dict) and "classes" in speed:
        classes = speed["classes"]
        if not (isinstance(classes, list) and all(isinstance(k, dict) and _is_num(k.get("fraction")) and
                                                  _is_num(k.get("factor")) and k["factor"] > 0 and
                                                  0 <= k["fraction"] <= 1 for k in classes)
                and sum(k["fraction"] for k in classes) <= 1 + 1e-9):
            p.bad("compute.speed.classes", classes, "a list of {fraction: 0..1, factor: > 0} whose fractions sum "
                  "to at most 1 (the remaining workers run at factor 1.0)")
            return None
        # classes take consecutive workers in order: "half 2x slower" = the first half has factor 2
        out, start = [1.0] * workers, 0
        for k in classes:
            n = int(round(k["fraction"] * workers))
            for i in range(start, min(workers, start + n)):
                out[i] = float(k["factor"])
            start += n
        return tuple(out)
    if isinstance(speed, dict) and "distribution" in speed:
        kind = speed["distribution"]
        if kind not in SPEED_DISTRIBUTIONS or not all(_is_num(speed.get(x)) for x in SPEED_DISTRIBUTIONS[kind]):
            p.bad("compute.speed", speed, "{distribution: lognormal, mu, sigma} | {distribution: normal, mean, std} "
                  "| {distribution: uniform, low, high}")
            return None
        a, b = (float(speed[x]) for x in SPEED_DISTRIBUTIONS[kind])
        draws = []
        for i in range(workers):  # keyed by (seed, "speed", worker): the same whatever the placement
            for attempt in range(1000):
                g = keyed.generator(seed, "speed", i, attempt)
                v = float(g.lognormal(a, b) if kind == "lognormal" else g.normal(a, b) if kind == "normal"
                          else g.uniform(a, b))
                if v > 0:
                    break
            else:
                p.bad("compute.speed", speed, "a distribution with positive samples")
                return None
            draws.append(v)
        return tuple(draws)
    p.bad("compute.speed", speed, f"null, a list of {workers} numbers > 0, {{classes: [...]}} or {{distribution: ...}}")
    return None


def _stragglers(p: _Problems, st: Any) -> dict[str, float]:
    """``compute.stragglers: {w3: 4.0}``: fixed extra slowdown factors by vworker name."""
    st = st or {}
    if not isinstance(st, dict) or not all(isinstance(k, str) and _is_num(v) and v > 0 for k, v in st.items()):
        p.bad("compute.stragglers", st, "a mapping from vworker name to a slowdown factor > 0, e.g. {w3: 4.0}")
        return {}
    return {k: float(v) for k, v in st.items()}


def _start_offsets(p: _Problems, so: Any) -> dict[str, float]:
    """``compute.start_offsets: {ps0: 2ms, w3: 12ms}``: fixed start delays (seconds) by vworker name."""
    so = so or {}
    out = {k: _seconds(v) for k, v in so.items()} if isinstance(so, dict) else {None: None}
    if all(isinstance(k, str) and v is not None and v >= 0 for k, v in out.items()):
        return out
    p.bad("compute.start_offsets", so, "a mapping from vworker name to a duration >= 0, e.g. {ps0: 2ms, w3: 12ms}")
    return {}


# ------------------------------------------------------------------ faults
_NEEDS_WORKERS = ("crash", "slow_link", "straggler", "byzantine")
# what each kind of fault reads besides at/until (agents/sim/faults.py); a key it does not read, set to
# anything but its schema's default, is refused rather than ignored (a crash with probability 0 crashed anyway)
_FAULT_READS = {"crash": ("workers", "fraction"), "partition": ("groups",),
                "loss": ("workers", "fraction", "probability"), "duplicate": ("workers", "fraction", "probability"),
                "slow_link": ("workers", "fraction", "factor"),
                "straggler": ("workers", "fraction", "factor", "probability"),
                "byzantine": ("workers", "fraction", "mode")}
_BYZANTINE_MODE_READS = {"noise": ("std",), "scale": ("factor",)}


def _fault_reads(f: Any, kind: str) -> tuple[str, ...]:
    return _FAULT_READS[kind] + (_BYZANTINE_MODE_READS.get(_enum_value(f.mode), ()) if kind == "byzantine" else ())


def _unread_fault_key(f: Any, kind: str) -> tuple[str, Any, Any] | None:
    """The first key of a ``faults:`` entry that its kind does not read and that is not at its default:
    (name, value, default); None if there is none."""
    reads = _fault_reads(f, kind)
    for name in ("workers", "fraction", "groups", "probability", "factor", "mode", "std"):
        value, default = _enum_value(getattr(f, name)), S.default_of(S.FaultConfig, name)
        if name not in reads and value != default:
            return name, list(value) if isinstance(value, (list, tuple)) else value, default
    return None


def _faults(p: _Problems, c: S.LockstepConfig, layout: list[Any], result: str, strategy_cls: type,
            settings: dict[str, Any]) -> tuple[FaultSetting, ...]:
    """``faults:`` (docs/faults.md): each entry checked against this run's vworkers, ``fraction`` drawn."""
    names = [v.name for v in layout]
    known = set(names)
    holders = [v.name for v in layout if v.holds_data]
    shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
    out = []
    for i, f in enumerate(c.faults):
        key = f"faults[{i}]"
        before = len(p.items)
        _check_fields(f, key + ".", p)
        if len(p.items) > before:
            continue
        kind = f.kind.value
        unread = _unread_fault_key(f, kind)
        if unread:
            name, value, default = unread
            p.bad(f"{key}.{name}", value, f"{_show(default)} for kind {kind}, which reads "
                  f"{', '.join(('at', 'until', *_fault_reads(f, kind)))} (docs/faults.md)")
            continue
        start = seconds_to_ns(parse_duration(f.at))
        end = None if f.until is None else seconds_to_ns(parse_duration(f.until))
        if end is not None and end <= start:
            p.bad(f"{key}.until", f.until, f"null (never) or a time after {key}.at ({f.at!r})")
            continue
        workers: tuple[str, ...] = ()
        if f.workers is not None and f.fraction is not None:
            p.add(f"{key} sets both workers and fraction; accepted: one of them.")
            continue
        if f.workers is not None:
            unknown = [w for w in f.workers if w not in known]
            if unknown or not f.workers:
                p.bad(f"{key}.workers", f.workers, f"a non-empty list of this run's vworkers ({shown})")
                continue
            workers = tuple(dict.fromkeys(f.workers))
        elif f.fraction is not None:
            pool = [h for h in holders if h != result]
            m = max(1, int(round(f.fraction * len(holders))))
            if not pool or m > len(pool):
                p.bad(f"{key}.fraction", f.fraction, f"a share of at most {len(pool)} of the {len(holders)} training "
                      f"workers (never the result vworker {result})")
                continue
            picks = keyed.generator(c.seed, "fault", i).choice(len(pool), m, replace=False)
            workers = tuple(pool[j] for j in sorted(int(x) for x in picks))
        elif kind in _NEEDS_WORKERS:
            p.add(f"{key} (kind {kind}) names no vworkers; accepted: {key}.workers=[w1, ...] or "
                  f"{key}.fraction=0.1 (a keyed share of the training workers).")
            continue
        groups: tuple[tuple[str, ...], ...] = ()
        if kind == "partition":
            gs = f.groups or []
            flat = [w for g in gs for w in g]
            if len(gs) < 2 or any(not g for g in gs) or len(set(flat)) != len(flat) or set(flat) - known:
                p.bad(f"{key}.groups", f.groups, f"two or more non-empty, disjoint lists of this run's vworkers "
                      f"({shown})")
                continue
            groups = tuple(tuple(g) for g in gs)
        if kind == "crash":
            if c.compute.layerwise:
                p.add(f"{key} (kind crash) is not supported with compute.layerwise=true (a restarted worker "
                      f"rejoins with whole-model messages); accepted: compute.layerwise=false.")
                continue
            bad = [w for w in workers if w not in holders or w == result]
            if bad:
                p.bad(f"{key}.workers", list(workers), f"training workers ({', '.join(holders[:4])}, ...), not a "
                      f"server and not {result}, which holds the result model (docs/faults.md)")
                continue
            if getattr(strategy_cls, "server_cls", None) == "FedServer" and settings.get("round_timeout") is None:
                p.add(f"{key} crashes clients of {strategy_cls.name}, whose server would wait for ever for their "
                      f"updates; set strategy.round_timeout (e.g. strategy.round_timeout=10s).")
                continue
        if kind == "slow_link":
            if not 0 < f.factor < 1:  # 1 (factor's default) left the NIC as it was: a fault that did nothing
                p.bad(f"{key}.factor", f.factor, "the share of the NIC rate left, in (0, 1) for slow_link (1 changes "
                      "nothing), e.g. factor: 0.1")
                continue
            if c.network.model == S.NetworkModel.tcp or c.network.topology != "star":
                p.add(f"{key} (kind slow_link) is not supported with network.model=tcp or a network.topology other "
                      f"than star; accepted: network.model=ideal with network.topology=star, or a straggler, loss or "
                      f"partition fault.")
                continue
        if kind == "straggler" and f.factor <= 1:  # 1 (factor's default): calls as slow as they were
            p.bad(f"{key}.factor", f.factor, "a slowdown > 1 for straggler (1 changes nothing), e.g. factor: 4")
            continue
        if kind == "byzantine" and f.mode == S.ByzantineMode.noise and f.std <= 0:
            p.bad(f"{key}.std", f.std, "a standard deviation > 0 for byzantine mode noise")
            continue
        if kind == "byzantine" and f.mode == S.ByzantineMode.scale and f.factor == 1:  # factor's default: g as it was
            p.bad(f"{key}.factor", f.factor, "a multiplier other than 1 for byzantine mode scale (1 changes nothing), "
                  "e.g. factor: -4")
            continue
        out.append(FaultSetting(i, kind, start, end, workers, groups, f.probability, f.factor, f.mode.value, f.std))
    return tuple(out)
def _check_topology(p: _Problems, net: NetworkSettings, vworkers: list[Any], agents: int) -> None:
    """A topology must route every pair (controller.topology says why not) and, sharing links, run on one agent."""
    if net.topology in (None, "star"):
        return
    from controller.topology import TopologyError, topology_spec

    try:
        topology_spec(net.topology, net.links, vworkers)
    except TopologyError as e:
        p.add(str(e))
        return
    if agents > 1:
        p.bad("agents", agents, "1 with network.topology other than star (flows crossing a link share it at every "
              "instant, wherever their senders run)")


# -------------------------------------------------- model and data checks
def _check_model(p: _Problems, model: dict[str, Any], seed: int, root: str | None | bool = False) -> int | None:
    """Build the model once; its number of parameter tensors (None: it cannot be built, said in ``p``).

    ``root``: the data set's (``data.root``), whose images the model must take; False: not this machine's
    data (``check_data`` off), so only the parameters are checked."""
    from agents.workloads.models import build_model

    try:
        built = build_model(model, seed)
    except (ValueError, TypeError, ImportError) as e:
        why = str(e)  # build_model's sentences name model._target_ themselves
        p.add(why if why.startswith("model") else f"model._target_={model.get('_target_')!r} is not usable: {why}")
        return None
    image, classes = None, None
    if root is not False:
        from agents.workloads.data import DataNotFoundError

        try:
            data = _dataset(root)
            if len(data.train_y):  # (none: said by _check_data) the classes the test set has too: a model with
                # fewer outputs failed at the first evaluation (IndexError: target out of bounds)
                top = max(int(data.train_y.max()), int(data.test_y.max()) if len(data.test_y) else 0)
                image, classes = tuple(data.train_x.shape[1:]), top + 1
        except (DataNotFoundError, ValueError):
            pass  # said by _check_data
    return _check_module(p, built, model.get("_target_"), image, classes)


def _check_module(p: _Problems, module: Any, target: Any, image: tuple[int, ...] | None,
                  classes: int | None) -> int | None:
    """A model lockstep can train: parameters and, given the data's ``image`` shape, logits [B, >= classes]
    for a batch of its images (one forward pass of two blank ones); its number of parameter tensors (None:
    said in ``p``)."""
    import torch

    shape = [2, *image] if image else None
    accepted = ("accepted: a torch.nn.Module with parameters" + (
        f" that maps a batch of the data's images [B, {', '.join(map(str, image))}] to logits [B, C] for the "
        f"{classes} classes (C >= {classes})" if image else ""))
    n = len(list(module.parameters()))
    if n == 0:
        p.add(f"model._target_={target!r} has no parameters to train; {accepted}.")
        return None
    if shape is None:
        return n
    try:
        with torch.no_grad():
            out = module(torch.zeros(shape))
    except Exception as e:  # noqa: BLE001 - a user's module: whatever its forward raises is the sentence
        why = " ".join(str(e).split())[:200].rstrip(" .")
        p.add(f"model._target_={target!r} cannot take a batch of images {shape} ({type(e).__name__}: {why}); "
              f"{accepted}.")
        return None
    if not isinstance(out, torch.Tensor) or out.dim() != 2 or out.shape[0] != 2 or out.shape[1] < classes:
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        p.add(f"model._target_={target!r} maps images {shape} to {got}; {accepted}.")
        return None
    return n


def _check_layerwise(p: _Problems, strategy_cls: Any, name: str, settings: dict[str, Any]) -> None:
    """``compute.layerwise=true`` where a strategy sends per-layer messages; elsewhere it changed nothing."""
    from agents.strategies.ps import _PS
    from agents.strategies.ring_allreduce import RingAllReduce

    if not (isinstance(strategy_cls, type) and issubclass(strategy_cls, (_PS, RingAllReduce))):
        p.add(f"compute.layerwise=true is not supported by strategy {name}, which sends whole models (it would change "
              "nothing); accepted: strategy ps_sync, ps_async, ssp or ring_allreduce, or compute.layerwise=false.")
    elif issubclass(strategy_cls, _PS) and settings.get("collective", "ideal") == "gloo":
        p.add("strategy.collective=gloo is not supported with compute.layerwise=true (the per-layer messages of a "
              "PS are not gloo's send/recv); accepted: strategy.collective=ideal, or compute.layerwise=false.")


def _check_shards(p: _Problems, strategy_cls: Any, settings: dict[str, Any], n_tensors: int, layerwise: bool) -> None:
    """A sharded PS owns whole parameter tensors: at most one shard per tensor, and whole-model messages."""
    from agents.strategies.ps import _PS

    shards = settings.get("shards") or 1
    if not (isinstance(strategy_cls, type) and issubclass(strategy_cls, _PS)) or not isinstance(shards, int) \
            or shards <= 1:
        return
    if shards > n_tensors:
        p.bad("strategy.shards", shards, f"an integer >= 1 and <= {n_tensors}: each shard owns whole parameter "
                                         f"tensors, and the model has {n_tensors}")
    if layerwise:
        p.add(f"strategy.shards={shards} is not supported with compute.layerwise=true (the layer-wise messages go "
              "to one PS); accepted: strategy.shards=1, or compute.layerwise=false.")


@lru_cache(maxsize=4)
def _dataset(root: str | None) -> Any:
    from agents.workloads.data import load_fashion_mnist

    return load_fashion_mnist(root)


def _check_data(p: _Problems, root: str | None, partition: str, kw: dict[str, Any], layout: list[Any],
                workers: int, batch_size: tuple[int, ...], seed: int, eval_samples: int | None = None) -> None:
    from agents.workloads.data import DataNotFoundError
    from agents.workloads.partition import partition as make_partition

    holders = [v.name for v in layout if v.holds_data]
    if not holders:
        return
    try:
        data = _dataset(root)
    except (DataNotFoundError, ValueError) as e:
        p.add(f"data.root={root!r}: {e}")
        return
    if not len(data.train_y) or not len(data.test_y):  # a traceback from the model's check
        p.add(f"data.root={root!r} holds {len(data.train_y)} training and {len(data.test_y)} test samples; accepted: "
              "a data set with at least one of each.")
        return
    if isinstance(eval_samples, int) and eval_samples > len(data.test_y):  # it quietly evaluated on all of them
        p.bad("eval.samples", eval_samples, f"at most the {len(data.test_y)} test samples")
    if kw.get("per_client") is not None:
        if kw["per_client"] > len(data.train_y):
            p.bad("data.per_client", kw["per_client"], f"at most the {len(data.train_y)} training samples")
            return
    elif len(holders) > len(data.train_y):
        p.bad("workers", workers, f"at most the {len(data.train_y)} training samples, or set data.per_client "
              "(samples drawn for each client; shards may overlap)")
        return
    scheme = {"non_iid": "two_class_non_iid"}.get(partition, partition)
    try:
        shards = make_partition(scheme, data.train_y.numpy(), len(holders), seed, **kw)
    except ValueError as e:  # e.g. non_iid over more parts than two classes per part can give (a traceback)
        p.add(f"data.partition={partition} cannot split the {len(data.train_y)} training samples of "
              f"{'data.root=' + repr(root) if root else 'the data set'} over {len(holders)} workers "
              f"({str(e).rstrip('.')}); accepted: fewer workers, or another data.partition.")
        return
    shard_sizes = getattr(shards, "sizes", None) or [len(s) for s in shards]  # sampled shards know theirs
    sizes = batch_size if len(batch_size) == len(holders) else (batch_size[0],) * len(holders)
    for name, size, b in zip(holders, shard_sizes, sizes):
        if b > size:
            fix = ("a larger data.per_client" if kw.get("per_client") is not None  # (its shards do not
                   else "fewer workers")  # depend on the number of workers)
            p.add(f"batch_size={b} is larger than the shard of vworker {name} ({size} samples with "
                  f"data.partition={partition} over {len(holders)} workers); accepted: a batch_size <= "
                  f"{size}, or {fix}.")
            return


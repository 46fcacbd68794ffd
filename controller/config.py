"""Validate the whole config before anything starts, and resolve it into plain typed values.

Every problem becomes one sentence naming the key, the value and what is
accepted (STYLE: errors). ``validate`` collects them all so a user fixes a
config in one go; the CLI prints them and exits with status 2.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from agents.sim.compute import KINDS, MODELS
from agents.sim.network import DISCIPLINES
from agents.common.units import UnitError, parse_duration, parse_rate

__all__ = ["ConfigError", "RunConfig", "validate", "config_hash", "PLACEMENTS", "PARTITIONS", "LAUNCHERS"]

PLACEMENTS = ("round_robin", "block", "ps_alone")
PARTITIONS = ("iid", "dirichlet", "non_iid")
LAUNCHERS = ("inprocess", "local", "kubernetes")  # ray: DESIGN §10, not built yet
LATENCY_DISTRIBUTIONS = {"normal": ("mean", "std"), "lognormal": ("mu", "sigma"), "weibull": ("scale", "shape", "loc")}


class ConfigError(ValueError):
    """One or more invalid config values; ``problems`` holds one sentence each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


@dataclass
class RunConfig:
    """The validated config: plain Python values, units resolved (seconds, bytes/s)."""

    raw: dict[str, Any]
    seed: int
    workers: int
    agents: int
    placement: str
    batch_size: list[int]
    lr: float
    momentum: float
    device: str
    strategy: str  # dotted path of the Strategy class
    strategy_name: str
    strategy_settings: dict[str, Any]
    model: dict[str, Any]
    stop_updates: int | None
    stop_virtual_time_s: float | None
    eval_every: int
    eval_samples: int
    data_root: str | None
    partition: str
    partition_kw: dict[str, Any]
    network: dict[str, Any]  # latency (plan form), bandwidth_out/in (bytes/s), egress, ingress
    compute: dict[str, Any]  # ComputeSpec fields (without seed)
    launcher: dict[str, Any]
    run_id: str | None
    trace: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    statelog: dict[str, Any] = field(default_factory=dict)
    progress: bool = True
    log_level: str = "INFO"
    threads: int = 1
    optimizer: str = "sgd"
    controller: dict[str, Any] = field(default_factory=dict)  # host, port, max_message_bytes, heartbeat_s, ...


def config_hash(raw: dict[str, Any]) -> str:
    """A short stable hash of the resolved config (without run_id and hydra)."""
    d = {k: v for k, v in raw.items() if k not in ("run_id", "hydra")}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]


class _Checker:
    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.problems: list[str] = []

    def get(self, key: str, default: Any = None) -> Any:
        node: Any = self.cfg
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def bad(self, key: str, value: Any, accepted: str) -> None:
        self.problems.append(f"{key}={value!r} is not valid; accepted: {accepted}.")

    def integer(self, key: str, lo: int | None = None, optional: bool = False) -> int | None:
        v = self.get(key)
        if v is None and optional:
            return None
        accepted = "an integer" + (f" >= {lo}" if lo is not None else "") + (" or null" if optional else "")
        if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo):
            self.bad(key, v, accepted)
            return None
        return v

    def number(self, key: str, lo: float | None = None, lo_open: bool = False, hi: float | None = None,
               hi_open: bool = False, optional: bool = False) -> float | None:
        v = self.get(key)
        if v is None and optional:
            return None
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if ok and lo is not None:
            ok = v > lo if lo_open else v >= lo
        if ok and hi is not None:
            ok = v < hi if hi_open else v <= hi
        if not ok:
            rng = []
            if lo is not None:
                rng.append(("> " if lo_open else ">= ") + f"{lo:g}")
            if hi is not None:
                rng.append(("< " if hi_open else "<= ") + f"{hi:g}")
            self.bad(key, v, "a number" + (" " + " and ".join(rng) if rng else "") + (" or null" if optional else ""))
            return None
        return float(v)

    def choice(self, key: str, options: tuple[str, ...]) -> str | None:
        v = self.get(key)
        if v not in options:
            self.bad(key, v, " | ".join(options))
            return None
        return v

    def duration(self, key: str, value: Any = None, positive: bool = False) -> float | None:
        v = self.get(key) if value is None else value
        try:
            s = parse_duration(v, key)
        except UnitError:
            self.bad(key, v, "seconds as a number or a string like 1ms, 250us, 2s")
            return None
        if s < 0 or (positive and s == 0) or not math.isfinite(s):
            self.bad(key, v, "a duration " + ("> 0" if positive else ">= 0"))
            return None
        return s

    def rate(self, key: str, value: Any = None) -> float | None:
        v = self.get(key) if value is None else value
        try:
            r = parse_rate(v, key)
        except UnitError:
            self.bad(key, v, "bytes/s as a number or a string like 10Gbit/s, 1Gbps, 100MB/s")
            return None
        if not r > 0 or not math.isfinite(r):
            self.bad(key, v, "a bandwidth > 0 (bytes/s or a string like 10Gbit/s)")
            return None
        return r


def _plain(cfg: DictConfig | dict) -> dict[str, Any]:
    if isinstance(cfg, (DictConfig, ListConfig)):
        d = OmegaConf.to_container(cfg, resolve=True)
    else:
        d = dict(cfg)
    d.pop("hydra", None)
    return d  # type: ignore[return-value]


def validate(cfg: DictConfig | dict, check_data: bool = True) -> RunConfig:
    """Check every key; raise ConfigError listing each problem, else return the RunConfig."""
    raw = _plain(cfg)
    c = _Checker(raw)
    seed = c.integer("seed", 0)
    workers = c.integer("workers", 1)
    agents = c.integer("agents", 1)
    placement = c.choice("placement", PLACEMENTS)
    lr = c.number("lr", 0, lo_open=True)
    momentum = c.number("momentum", 0, hi=1, hi_open=True)
    threads = c.integer("threads", 1)
    optimizer = c.choice("optimizer", ("sgd", "adam"))
    device = c.get("device")
    if not isinstance(device, str) or not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
        c.bad("device", device, "cpu | cuda | cuda:N")

    # strategy
    strategy_path = c.get("strategy._target_")
    strategy_name = c.get("strategy.name") or strategy_path
    strategy_cls = None
    try:
        from agents.strategies import STRATEGIES, load_strategy

        strategy_cls = load_strategy(strategy_path)
    except Exception as e:  # noqa: BLE001 - any import problem is a config error here
        from agents.strategies import STRATEGIES

        c.problems.append(f"strategy={strategy_name!r} (strategy._target_={strategy_path!r}) cannot be loaded "
                          f"({e}); accepted: {' | '.join(STRATEGIES)} or a dotted path to a Strategy subclass.")
    strategy_settings = {k: v for k, v in (c.get("strategy") or {}).items() if k not in ("_target_", "name")}

    # batch sizes, one per data-holding worker
    bs = c.get("batch_size")
    batch_size: list[int] = []
    if isinstance(bs, int) and not isinstance(bs, bool) and bs >= 1 and workers:
        batch_size = [bs] * workers
    elif isinstance(bs, list) and workers and len(bs) == workers and all(
            isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in bs):
        batch_size = list(bs)
    elif workers:  # (an invalid `workers` is reported once, not again through batch_size)
        c.bad("batch_size", bs, f"an integer >= 1, or a list of {workers} such integers (one per worker)")

    # stop
    stop_updates = c.integer("stop.updates", 1, optional=True)
    vt = c.get("stop.virtual_time")
    stop_vt = None if vt is None else c.duration("stop.virtual_time", positive=True)
    if c.get("stop.updates") is None and vt is None:
        c.problems.append("stop.updates and stop.virtual_time are both null; set at least one "
                          "(e.g. stop.updates=1000 or stop.virtual_time=60s).")
    eval_every = c.integer("eval.every", 0)
    eval_samples = c.integer("eval.samples", 1)

    # data
    partition = c.choice("data.partition", PARTITIONS)
    partition_kw: dict[str, Any] = {}
    if partition == "dirichlet":
        alpha = c.number("data.alpha", 0, lo_open=True)
        partition_kw = {"alpha": alpha}
    elif partition == "non_iid":
        partition_kw = {"major": c.number("data.major", 0, lo_open=True, hi=1)}
    data_root = c.get("data.root")

    # model
    model = c.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("_target_"), str):
        c.bad("model", model, "mlp | cnn | resnet, or a config with _target_ naming an nn.Module class")
        model = None

    network = _network(c, workers)
    compute = _compute(c, workers)
    launcher = c.get("launcher") or {}
    if launcher.get("name") not in LAUNCHERS:
        c.bad("launcher", launcher.get("name"), " | ".join(LAUNCHERS))
    controller = _controller(c)
    trace = _trace(c)
    metrics = _metrics(c)
    statelog = _statelog(c)
    log_level = c.get("log_level", "INFO")
    if log_level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        c.bad("log_level", log_level, "DEBUG | INFO | WARNING | ERROR")
    run_id = c.get("run_id")
    if run_id is not None and (not isinstance(run_id, str) or not run_id.replace("-", "").replace("_", "").isalnum()):
        c.bad("run_id", run_id, "letters, digits, '-' and '_'")

    if not c.problems and model is not None:
        _check_model(c, model, seed)
    if not c.problems and check_data and strategy_cls is not None:
        _check_data(c, data_root, partition, partition_kw, strategy_cls, workers, batch_size, seed, strategy_settings)
    if not c.problems and agents and strategy_cls is not None:
        n_vworkers = len(strategy_cls.layout(workers, strategy_settings))
        if agents > n_vworkers:
            c.bad("agents", agents, f"at most the number of vworkers ({n_vworkers})")
    if c.problems:
        raise ConfigError(c.problems)
    return RunConfig(
        raw=raw, seed=seed, workers=workers, agents=agents, placement=placement, batch_size=batch_size,
        lr=lr, momentum=momentum, device=device, strategy=f"{strategy_cls.__module__}.{strategy_cls.__qualname__}",
        strategy_name=strategy_name, strategy_settings=strategy_settings, model=model,
        stop_updates=stop_updates, stop_virtual_time_s=stop_vt, eval_every=eval_every,
        eval_samples=eval_samples, data_root=data_root, partition=partition, partition_kw=partition_kw,
        network=network, compute=compute, launcher=launcher, run_id=run_id, trace=trace,
        metrics=metrics, statelog=statelog,
        progress=bool(c.get("progress", True)), log_level=log_level, threads=threads, controller=controller)


def _controller(c: _Checker) -> dict[str, Any]:
    """The ``controller:`` section (gRPC service of launcher=local|kubernetes); defaults when absent."""
    if c.get("controller") is None:
        return {}
    out: dict[str, Any] = {}
    host = c.get("controller.host", "127.0.0.1")
    if not isinstance(host, str) or not host:
        c.bad("controller.host", host, "an address to listen on, e.g. 127.0.0.1 or 0.0.0.0")
    out["host"] = host
    if c.get("controller.port") is not None:
        port = c.integer("controller.port", 0)
        if port is not None and port > 65535:
            c.bad("controller.port", port, "0 (a free port) .. 65535")
        out["port"] = port
    if c.get("controller.max_message_bytes") is not None:
        m = c.integer("controller.max_message_bytes", 64 * 1024)
        if m is not None and m > 2**31 - 2**20:
            c.bad("controller.max_message_bytes", m, f"65536 .. {2**31 - 2**20} (gRPC's limit is 2 GiB)")
        out["max_message_bytes"] = m
    for key in ("heartbeat_s", "agent_timeout_s", "startup_timeout_s"):
        if c.get(f"controller.{key}") is not None:
            out[key] = c.number(f"controller.{key}", 0, lo_open=True)
    hb, to = out.get("heartbeat_s"), out.get("agent_timeout_s")
    if hb is not None and to is not None and to < 2 * hb:
        c.bad("controller.agent_timeout_s", to, f"at least twice controller.heartbeat_s ({hb:g} s)")
    tf = c.get("controller.token_file")
    if tf is not None and not isinstance(tf, str):
        c.bad("controller.token_file", tf, "a path, or null")
    out["token_file"] = tf
    for key in ("max_blob_bytes", "max_held_bytes"):
        if c.get(f"controller.{key}") is not None:
            out[key] = c.integer(f"controller.{key}", 1 << 20, optional=True)
    if c.get("controller.call_timeout_s") is not None:
        out["call_timeout_s"] = c.number("controller.call_timeout_s", 0, lo_open=True)
    out["tls"] = _tls(c)
    return out


def _tls(c: _Checker) -> dict[str, Any] | None:
    """``controller.tls``: certificate files of the gRPC service and the direct streams (docs/security.md)."""
    tls = c.get("controller.tls")
    if tls is None or tls.get("enabled") in (None, False):
        return None
    if tls.get("enabled") is not True:
        c.bad("controller.tls.enabled", tls.get("enabled"), "true | false")
        return None
    from pathlib import Path

    out: dict[str, Any] = {"enabled": True, "client_auth": tls.get("client_auth", True)}
    if not isinstance(out["client_auth"], bool):
        c.bad("controller.tls.client_auth", out["client_auth"], "true (mutual TLS) | false")
    local = c.get("launcher.name") == "local"  # the agents read their files on this machine too
    for key in ("cert", "key", "ca", "agent_cert", "agent_key", "server_name"):
        v = tls.get(key)
        required = key in ("cert", "key", "ca")
        if v is None and not required:
            continue
        if not isinstance(v, str) or not v:
            c.bad(f"controller.tls.{key}", v, "a PEM file path" if key != "server_name" else "a host name")
            continue
        must_exist = key in ("cert", "key", "ca") or (local and key in ("agent_cert", "agent_key"))
        if must_exist and not Path(v).is_file():
            c.bad(f"controller.tls.{key}", v, "a readable PEM file (it does not exist)")
        out[key] = v
    return out


TRACE_MODES = ("full", "sample", "window", "off")


def _trace(c: _Checker) -> dict[str, Any]:
    mode = c.choice("trace.mode", TRACE_MODES) if c.get("trace.mode") is not None else "full"
    out: dict[str, Any] = {"mode": mode, "sample_every": c.integer("trace.sample_every", 1) or 1,
                           "max_events": c.integer("trace.max_events", 1, optional=True), "window": None}
    w = c.get("trace.window")
    if w is not None or mode == "window":
        ok = isinstance(w, list) and len(w) == 2
        span = [c.duration(f"trace.window[{i}]", x) for i, x in enumerate(w)] if ok else []
        if not ok or None in span or span[0] > span[1]:
            c.bad("trace.window", w, "[start, end] virtual times (seconds or strings like 2s) with start <= end"
                  + ("; trace.mode=window needs it" if mode == "window" else ""))
        else:
            out["window"] = span
    return out


def _metrics(c: _Checker) -> dict[str, Any]:
    port = c.integer("metrics.port", 0, optional=True)
    if port is not None and port > 65535:
        c.bad("metrics.port", port, "null (do not serve), 0 (a free port) or a port 1..65535")
    host = c.get("metrics.host", "127.0.0.1")
    if not isinstance(host, str) or not host:
        c.bad("metrics.host", host, "an address to bind such as 127.0.0.1 or 0.0.0.0")
    agent_port = c.integer("metrics.agent_port", 0, optional=True) or 0
    if agent_port > 65535:
        c.bad("metrics.agent_port", agent_port, "0 (a free port) or a port 1..65535")
    elif agent_port and c.get("launcher.name") == "local" and isinstance(c.get("agents"), int) and c.get("agents") > 1:
        c.bad("metrics.agent_port", agent_port, "0 with launcher=local and several agents (they share one host, "
              "so each needs its own free port)")
    linger = c.duration("metrics.linger_s", c.get("metrics.linger_s", 0) or 0)
    return {"port": port, "host": host, "per_worker": bool(c.get("metrics.per_worker", False)),
            "linger_s": linger or 0.0, "agent_port": agent_port}


def _statelog(c: _Checker) -> dict[str, Any]:
    every = c.integer("statelog.snapshot_every", 0) if c.get("statelog.snapshot_every") is not None else 0
    return {"enabled": bool(c.get("statelog.enabled", True)), "checksum": bool(c.get("statelog.checksum", True)),
            "snapshot_every": every or 0}


def _network(c: _Checker, workers: int | None) -> dict[str, Any]:
    disc = c.choice("network.discipline", DISCIPLINES)
    egress = c.get("network.egress") or disc
    ingress = c.get("network.ingress") or disc
    for side, value in (("egress", c.get("network.egress")), ("ingress", c.get("network.ingress"))):
        if value is not None and value not in DISCIPLINES:
            c.bad(f"network.{side}", value, " | ".join(DISCIPLINES) + " or null")
    eff = c.number("network.efficiency", 0, lo_open=True, hi=1)
    bw = _bandwidth(c, "network.bandwidth", workers)
    bw_in = bw if c.get("network.bandwidth_in") is None else _bandwidth(c, "network.bandwidth_in", workers)
    return {"latency": _latency(c), "bandwidth": bw, "bandwidth_in": bw_in, "efficiency": eff,
            "egress": egress, "ingress": ingress}


BANDWIDTH_DISTRIBUTIONS = {"weibull": ("scale", "shape", "loc"), "normal": ("mean", "std"),
                           "lognormal": ("mu", "sigma")}


def _bandwidth(c: _Checker, key: str, workers: int | None) -> Any:
    """A rate (bytes/s), a list of rates (one per worker; servers get the largest) or a keyed distribution.

    A distribution is ``{distribution: weibull, scale, shape, loc, unit: Mbit/s}``
    (the FL-timing thesis' throughput fit); each vworker gets the draw
    ``(seed, "bandwidth", vworker id)``, redrawn while not positive.
    """
    v = c.get(key)
    if isinstance(v, list):
        rates = [c.rate(f"{key}[{i}]", x) for i, x in enumerate(v)]
        if workers and len(v) != workers:
            c.bad(key, v, f"a list of {workers} rates (one per worker)")
            return None
        return None if None in rates else rates
    if isinstance(v, dict):
        kind = v.get("distribution")
        if kind not in BANDWIDTH_DISTRIBUTIONS:
            c.bad(f"{key}.distribution", kind, " | ".join(BANDWIDTH_DISTRIBUTIONS))
            return None
        params = [v.get(p, 0.0 if p == "loc" else None) for p in BANDWIDTH_DISTRIBUTIONS[kind]]
        if not all(_is_num(p) for p in params):
            c.bad(key, v, f"{{distribution: {kind}, " + ", ".join(BANDWIDTH_DISTRIBUTIONS[kind]) + ", unit: Mbit/s}")
            return None
        unit = c.rate(f"{key}.unit", "1" + str(v.get("unit", "Mbit/s")))
        return {"distribution": kind, "params": [float(p) for p in params], "unit_bps": unit}
    return c.rate(key)


def _latency(c: _Checker) -> dict[str, Any]:
    lat = c.get("network.latency")
    if isinstance(lat, dict):
        if "matrix" in lat:
            m = lat["matrix"]
            if not (isinstance(m, list) and m and all(isinstance(r, list) and len(r) == len(m) for r in m)):
                c.bad("network.latency.matrix", m, "a square list of lists of durations")
                return {"kind": "constant", "ns": 0}
            rows = [[c.duration(f"network.latency.matrix[{i}][{j}]", x) for j, x in enumerate(r)]
                    for i, r in enumerate(m)]
            if any(x is None for r in rows for x in r):
                return {"kind": "constant", "ns": 0}
            return {"kind": "matrix", "matrix_ns": [[int(round(x * 1e9)) for x in r] for r in rows],
                    "groups": lat.get("groups")}
        kind = lat.get("distribution")
        if kind not in LATENCY_DISTRIBUTIONS:
            c.bad("network.latency.distribution", kind, " | ".join(LATENCY_DISTRIBUTIONS))
            return {"kind": "constant", "ns": 0}
        params = []
        for p in LATENCY_DISTRIBUTIONS[kind]:
            v = lat.get(p, 0.0 if p == "loc" else None)
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                c.bad(f"network.latency.{p}", v, "a number (seconds; log-seconds for lognormal mu)")
                return {"kind": "constant", "ns": 0}
            params.append(float(v))
        min_s = c.duration("network.latency.min", lat.get("min", 0.0)) or 0.0
        return {"kind": kind, "params": params, "min_s": min_s}
    s = c.duration("network.latency")
    return {"kind": "constant", "ns": 0 if s is None else int(round(s * 1e9))}


def _compute(c: _Checker, workers: int | None) -> dict[str, Any]:
    model = c.choice("compute.model", MODELS)
    out: dict[str, Any] = {"model": model, "constant_s": {}}
    for kind in KINDS:
        v = c.get(f"compute.{kind}")
        needed = model == "constant" or (model == "distribution" and kind not in (c.get("compute.kinds") or []))
        if v is None:
            if needed:
                c.problems.append(f"compute.{kind} is not set; compute={model} needs a duration for kind "
                                  f"{kind!r}: compute.{kind}=<seconds>.")
            continue
        s = c.duration(f"compute.{kind}")
        if s is not None:
            out["constant_s"][kind] = s
    if model == "distribution":
        d = c.get("compute.distribution")
        if d not in ("lognormal", "normal", "weibull", "exponential"):
            c.bad("compute.distribution", d, "lognormal | normal | weibull | exponential")
        params = c.get("compute.params")
        if not (isinstance(params, list) and params and all(isinstance(p, (int, float)) for p in params)):
            c.bad("compute.params", params, "a list of numbers (the distribution's parameters in seconds)")
            params = []
        out.update(dist=d, dist_params=[float(p) for p in params], dist_kinds=list(c.get("compute.kinds") or []))
    if model == "analytic":
        out["peak_flops"] = c.number("compute.peak_flops", 0, lo_open=True)
    runs = c.integer("compute.runs", 1)
    out["profile_runs"] = runs
    out["profile_db"] = c.get("compute.db") or ""
    out["speed_workers"] = _speed(c, workers)
    out["stragglers"] = _stragglers(c, workers)
    straggle = c.get("compute.straggle") or {}
    out["straggle_p"] = c.number("compute.straggle.probability", 0, hi=1) or 0.0 if straggle else 0.0
    out["straggle_factor"] = c.number("compute.straggle.factor", 0, lo_open=True) or 1.0 if straggle else 1.0
    out["jitter"] = c.number("compute.jitter", 0) or 0.0
    return out


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _speed(c: _Checker, workers: int | None) -> list[float] | None:
    """Per-worker slowdown factors from a list, classes or a keyed distribution (DESIGN §4.2)."""
    from agents.sim import keyed

    speed = c.get("compute.speed")
    if speed is None or not workers:
        return None
    if isinstance(speed, list):
        if len(speed) == workers and all(_is_num(s) and s > 0 for s in speed):
            return [float(s) for s in speed]
        c.bad("compute.speed", speed, f"null, a list of {workers} numbers > 0 (one slowdown factor per worker), "
              "{classes: [{fraction: 0.5, factor: 2.0}, ...]} or {distribution: lognormal|normal|uniform, ...}")
        return None
    if isinstance(speed, dict) and "classes" in speed:
        classes = speed["classes"]
        if not (isinstance(classes, list) and all(isinstance(k, dict) and _is_num(k.get("fraction")) and
                                                  _is_num(k.get("factor")) and k["factor"] > 0 and
                                                  0 <= k["fraction"] <= 1 for k in classes)
                and sum(k["fraction"] for k in classes) <= 1 + 1e-9):
            c.bad("compute.speed.classes", classes, "a list of {fraction: 0..1, factor: > 0} whose fractions sum "
                  "to at most 1 (the remaining workers run at factor 1.0)")
            return None
        # classes take consecutive workers in order: "half 2x slower" = the first half has factor 2
        out, start = [1.0] * workers, 0
        for k in classes:
            n = int(round(k["fraction"] * workers))
            for i in range(start, min(workers, start + n)):
                out[i] = float(k["factor"])
            start += n
        return out
    if isinstance(speed, dict) and "distribution" in speed:
        kind = speed["distribution"]
        names = {"lognormal": ("mu", "sigma"), "normal": ("mean", "std"), "uniform": ("low", "high")}
        if kind not in names or not all(_is_num(speed.get(p)) for p in names[kind]):
            c.bad("compute.speed", speed, "{distribution: lognormal, mu, sigma} | {distribution: normal, mean, std} "
                  "| {distribution: uniform, low, high}")
            return None
        a, b = (float(speed[p]) for p in names[kind])
        seed = c.get("seed", 0) or 0
        out = []
        for i in range(workers):  # keyed by (seed, "speed", worker): the same whatever the placement
            for attempt in range(1000):
                g = keyed.generator(seed, "speed", i, attempt)
                v = float(g.lognormal(a, b) if kind == "lognormal" else g.normal(a, b) if kind == "normal"
                          else g.uniform(a, b))
                if v > 0:
                    break
            else:
                c.bad("compute.speed", speed, "a distribution with positive samples")
                return None
            out.append(v)
        return out
    c.bad("compute.speed", speed, f"null, a list of {workers} numbers > 0, {{classes: [...]}} or {{distribution: ...}}")
    return None


def _stragglers(c: _Checker, workers: int | None) -> dict[str, float]:
    """``compute.stragglers: {w3: 4.0}``: fixed extra slowdown factors by vworker name."""
    st = c.get("compute.stragglers") or {}
    if not isinstance(st, dict) or not all(isinstance(k, str) and _is_num(v) and v > 0 for k, v in st.items()):
        c.bad("compute.stragglers", st, "a mapping from vworker name to a slowdown factor > 0, e.g. {w3: 4.0}")
        return {}
    return {k: float(v) for k, v in st.items()}


def _check_model(c: _Checker, model: dict[str, Any], seed: int) -> None:
    from agents.workloads.models import build_model

    try:
        build_model(model, seed)
    except (ValueError, TypeError, ImportError) as e:
        c.problems.append(f"model._target_={model.get('_target_')!r} is not usable: {e}")


def _check_data(c: _Checker, root: str | None, partition: str, kw: dict[str, Any], strategy_cls: Any,
                workers: int, batch_size: list[int], seed: int, settings: dict[str, Any]) -> None:
    from agents.workloads.data import DataNotFoundError, load_fashion_mnist
    from agents.workloads.partition import partition as make_partition

    layout = strategy_cls.layout(workers, settings)
    holders = [v.name for v in layout if v.holds_data]
    if not holders:
        return
    try:
        data = load_fashion_mnist(root)
    except DataNotFoundError as e:
        c.problems.append(f"data.root={root!r}: {e}")
        return
    except ValueError as e:
        c.problems.append(f"data.root={root!r}: {e}")
        return
    if len(holders) > len(data.train_y):
        c.bad("workers", workers, f"at most the {len(data.train_y)} training samples")
        return
    scheme = {"non_iid": "two_class_non_iid"}.get(partition, partition)
    shards = make_partition(scheme, data.train_y.numpy(), len(holders), seed, **kw)
    bsizes = batch_size if len(batch_size) == len(holders) else [batch_size[0]] * len(holders)
    for name, shard, b in zip(holders, shards, bsizes):
        if b > len(shard):
            c.problems.append(f"batch_size={b} is larger than the shard of vworker {name} "
                              f"({len(shard)} samples with data.partition={partition} over {len(holders)} "
                              f"workers); accepted: a batch_size <= {len(shard)}, or fewer workers.")
            return

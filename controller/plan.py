"""From a validated config to the run's :class:`~agents.common.plan.Plan`: vworkers, placement, models."""
from __future__ import annotations

import time
from typing import Any

from agents.sim import keyed
from agents.common.plan import Plan
from agents.strategies import load_strategy
from agents.strategies.base import VWorkerSpec
from controller.config import RunConfig, config_hash

__all__ = ["make_plan", "place"]


def place(vworkers: list[VWorkerSpec], agents: int, how: str) -> list[int]:
    """Agent id of each vworker. ``ps_alone`` pins every non-training vworker (a PS) to agent 0."""
    n = len(vworkers)
    if how == "round_robin":
        return [i % agents for i in range(n)]
    if how == "block":
        per = -(-n // agents)
        return [i // per for i in range(n)]
    if how == "ps_alone":
        if agents < 2:
            return [0] * n
        out, k = [], 0
        for v in vworkers:
            if v.holds_data:
                out.append(1 + k % (agents - 1))
                k += 1
            else:
                out.append(0)
        return out
    raise ValueError(f"placement={how!r}; accepted: round_robin | block | ps_alone")


def per_vworker_bandwidth(spec: Any, vworkers: list[VWorkerSpec], seed: int) -> list[float]:
    """Bytes/s of each vworker from a rate, a per-worker list, or a keyed distribution (config ``_bandwidth``)."""
    n = len(vworkers)
    if isinstance(spec, (int, float)):
        return [float(spec)] * n
    if isinstance(spec, list):  # one per data holder, in order; servers get the largest
        it = iter(spec)
        return [float(next(it)) if v.holds_data else float(max(spec)) for v in vworkers]
    kind, p, unit = spec["distribution"], spec["params"], spec["unit_bps"]
    out = []
    for vid in range(n):
        for attempt in range(1000):
            g = keyed.generator(seed, "bandwidth", vid, attempt)
            x = (p[2] + p[0] * g.weibull(p[1]) if kind == "weibull" else g.normal(p[0], p[1]) if kind == "normal"
                 else g.lognormal(p[0], p[1]))
            if x > 0:
                out.append(float(x) * unit)
                break
        else:
            raise ValueError(f"network bandwidth distribution {spec} gave 1000 samples <= 0")
    return out


def make_plan(rc: RunConfig, run_id: str | None = None) -> Plan:
    strategy = load_strategy(rc.strategy)
    vworkers = strategy.layout(rc.workers, rc.strategy_settings)
    n = len(vworkers)
    holders = [v.name for v in vworkers if v.holds_data]
    net = rc.network
    eff = net["efficiency"]
    latency = dict(net["latency"])
    if latency["kind"] == "matrix":
        groups = latency.pop("groups", None)
        size = len(latency["matrix_ns"])
        if groups is None:
            groups = list(range(n)) if size == n else [i % size for i in range(n)]
        latency["group_of"] = [int(g) for g in groups]
    out_bw = per_vworker_bandwidth(net["bandwidth"], vworkers, rc.seed)
    in_bw = out_bw if net["bandwidth_in"] is net["bandwidth"] else per_vworker_bandwidth(net["bandwidth_in"], vworkers,
                                                                                          rc.seed)
    network = {"latency": latency, "bandwidth_out": [b * eff for b in out_bw],
               "bandwidth_in": [b * eff for b in in_bw], "egress": net["egress"], "ingress": net["ingress"],
               "tcp": net.get("tcp")}
    comp = dict(rc.compute)
    speed_workers = comp.pop("speed_workers", None)
    speed = []
    if speed_workers is not None:
        by_name = dict(zip(holders, speed_workers))
        speed = [float(by_name.get(v.name, 1.0)) for v in vworkers]
    comp["speed"] = speed
    ids = {v.name: i for i, v in enumerate(vworkers)}
    unknown = sorted(set(comp.get("stragglers", {})) - set(ids))
    if unknown:
        raise ValueError(f"compute.stragglers names {unknown}, which are not vworkers of this run "
                         f"(they are {', '.join(ids)})")
    comp["stragglers"] = {ids[k]: f for k, f in comp.get("stragglers", {}).items()}
    comp["device"] = rc.device
    workload = {"model": rc.model, "data_root": rc.data_root, "partition": "two_class_non_iid"
                if rc.partition == "non_iid" else rc.partition, "partition_kw": rc.partition_kw,
                "data_holders": holders, "batch_size": rc.batch_size[: len(holders)] or [1],
                "lr": rc.lr, "momentum": rc.momentum, "eval_samples": rc.eval_samples, "device": rc.device,
                "threads": rc.threads, "optimizer": rc.optimizer}
    settings = {"stop_updates": rc.stop_updates, "eval_every": rc.eval_every, **rc.strategy_settings}
    rid = run_id or rc.run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{config_hash(rc.raw)}"
    return Plan(run_id=rid, seed=rc.seed, strategy=rc.strategy_name, result=strategy.result_for(rc.workers, rc.strategy_settings),  # noqa: E501
                vworkers=vworkers, placement=place(vworkers, rc.agents, rc.placement), n_agents=rc.agents,
                network=network, compute=comp, workload=workload, settings=settings,
                stop_virtual_time_ns=None if rc.stop_virtual_time_s is None else int(round(rc.stop_virtual_time_s * 1e9)))

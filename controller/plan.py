"""From a validated config to the run's :class:`~agents.plan.Plan`: vworkers, placement, models."""
from __future__ import annotations

import time

from agents.plan import Plan
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
    network = {"latency": latency, "bandwidth_out": [net["bandwidth"] * eff] * n,
               "bandwidth_in": [net["bandwidth_in"] * eff] * n, "egress": net["egress"], "ingress": net["ingress"]}
    comp = dict(rc.compute)
    speed_workers = comp.pop("speed_workers", None)
    speed = []
    if speed_workers is not None:
        by_name = dict(zip(holders, speed_workers))
        speed = [float(by_name.get(v.name, 1.0)) for v in vworkers]
    comp["speed"] = speed
    comp["device"] = rc.device
    workload = {"model": rc.model, "data_root": rc.data_root, "partition": "two_class_non_iid"
                if rc.partition == "non_iid" else rc.partition, "partition_kw": rc.partition_kw,
                "data_holders": holders, "batch_size": rc.batch_size[: len(holders)] or [1],
                "lr": rc.lr, "momentum": rc.momentum, "eval_samples": rc.eval_samples, "device": rc.device}
    settings = {"stop_updates": rc.stop_updates, "eval_every": rc.eval_every, **rc.strategy_settings}
    rid = run_id or rc.run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{config_hash(rc.raw)}"
    return Plan(run_id=rid, seed=rc.seed, strategy=rc.strategy_name, result=strategy.result,
                vworkers=vworkers, placement=place(vworkers, rc.agents, rc.placement), n_agents=rc.agents,
                network=network, compute=comp, workload=workload, settings=settings,
                stop_virtual_time_ns=None if rc.stop_virtual_time_s is None else int(round(rc.stop_virtual_time_s * 1e9)))

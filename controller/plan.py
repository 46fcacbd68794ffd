"""From a validated config to the run's :class:`~agents.common.plan.Plan`: vworkers, placement, typed specs."""
from __future__ import annotations

import time
from typing import Any

from agents.common.plan import Plan
from agents.sim import keyed
from agents.sim.compute import ComputeSpec
from agents.sim.faults import Fault, FaultSpec
from agents.sim.types import INFINITY, seconds_to_ns
from agents.sim.network import ConstantLatency, DistributionLatency, LatencyModel, MatrixLatency, NetworkSpec
from agents.strategies import load_strategy
from agents.strategies.base import VWorkerSpec, layout_of
from agents.workloads.training import WorkloadSpec
from controller.config import BandwidthSetting, ComputeSettings, LatencySetting, NetworkSettings, RunConfig, config_hash
from controller.config.validate import FaultSetting

__all__ = ["make_plan", "place", "network_spec", "compute_spec"]


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


def per_vworker_bandwidth(bw: BandwidthSetting, vworkers: list[VWorkerSpec], seed: int) -> list[float]:
    """Bytes/s of each vworker: one rate, one per data holder (servers get the largest), or keyed draws."""
    if bw.rate is not None:
        return [bw.rate] * len(vworkers)
    if bw.per_worker is not None:
        it = iter(bw.per_worker)
        return [next(it) if v.holds_data else max(bw.per_worker) for v in vworkers]
    p, out = bw.params, []
    for vid in range(len(vworkers)):
        for attempt in range(1000):
            g = keyed.generator(seed, "bandwidth", vid, attempt)
            x = (p[2] + p[0] * g.weibull(p[1]) if bw.distribution == "weibull" else g.normal(p[0], p[1])
                 if bw.distribution == "normal" else g.lognormal(p[0], p[1]))
            if x > 0:
                out.append(float(x) * bw.unit_bps)
                break
        else:
            raise ValueError(f"network bandwidth distribution {bw} gave 1000 samples <= 0")
    return out


def latency_model(lat: LatencySetting, n: int, seed: int) -> LatencyModel:
    if lat.kind == "constant":
        return ConstantLatency(lat.ns)
    if lat.kind == "matrix":
        size = len(lat.matrix_ns)
        groups = lat.groups
        if groups is None:  # vworker i sits in region i mod size (or region i when there is one per vworker)
            groups = tuple(range(n)) if size == n else tuple(i % size for i in range(n))
        if len(groups) != n:
            raise ValueError(f"network.latency.groups lists {len(groups)} regions for {n} vworkers; give one per "
                             "vworker (workers first, then servers), or null")
        return MatrixLatency(lat.matrix_ns, tuple(groups))
    return DistributionLatency(lat.kind, lat.params, seed, lat.min_s)


def network_spec(net: NetworkSettings, vworkers: list[VWorkerSpec], seed: int) -> NetworkSpec:
    out_bw = per_vworker_bandwidth(net.bandwidth, vworkers, seed)
    in_bw = out_bw if net.bandwidth_in is None else per_vworker_bandwidth(net.bandwidth_in, vworkers, seed)
    eff = net.efficiency
    from controller.topology import topology_spec

    data = [i for i, v in enumerate(vworkers) if v.cls.endswith("DataServer")]
    topology = topology_spec(net.topology, net.links, vworkers, data)
    return NetworkSpec(latency_model(net.latency, len(vworkers), seed), tuple(b * eff for b in out_bw),
                       tuple(b * eff for b in in_bw), net.egress, net.ingress, net.tcp, topology)


def compute_spec(comp: ComputeSettings, vworkers: list[VWorkerSpec], device: str, seed: int) -> ComputeSpec:
    holders = [v.name for v in vworkers if v.holds_data]
    speed: tuple[float, ...] = ()
    if comp.speed_workers is not None:
        by_name = dict(zip(holders, comp.speed_workers))
        speed = tuple(float(by_name.get(v.name, 1.0)) for v in vworkers)
    ids = {v.name: i for i, v in enumerate(vworkers)}
    for key, named in (("compute.stragglers", comp.stragglers), ("compute.start_offsets", comp.start_offsets_s)):
        unknown = sorted(set(named) - set(ids))
        if unknown:
            raise ValueError(f"{key} names {unknown}, which are not vworkers of this run "
                             f"(they are {', '.join(ids)})")
    return ComputeSpec(model=comp.model, constant_s=dict(comp.constant_s), dist=comp.dist,
                       dist_params=comp.dist_params, dist_kinds=comp.dist_kinds, peak_flops=comp.peak_flops,
                       profile_db=comp.profile_db, profile_runs=comp.profile_runs, speed=speed,
                       jitter=comp.jitter, stragglers={ids[k]: f for k, f in comp.stragglers.items()},
                       straggle_p=comp.straggle_p, straggle_factor=comp.straggle_factor, device=device, seed=seed,
                       profile_name=comp.profile_name, profile=dict(comp.profile),
                       estimators=dict(comp.estimators), layerwise=comp.layerwise,
                       forward_fraction=comp.forward_fraction, allreduce_share=comp.allreduce_share,
                       batch=comp.batch, max_batch=comp.max_batch, overlap=comp.overlap,
                       start_spread_ns=seconds_to_ns(comp.start_spread_s),
                       start_offsets_ns={ids[k]: seconds_to_ns(v) for k, v in comp.start_offsets_s.items()})


SAMPLE_BYTES = 28 * 28 + 1
"""One Fashion-MNIST (or MNIST) sample as stored: 28x28 bytes of pixels and a label byte."""


def with_data_servers(vworkers: list[VWorkerSpec], data: Any) -> list[VWorkerSpec]:
    """The strategy's vworkers, then ``data.end_devices`` end devices per training worker when the data travels.

    End devices come last, so the strategy's vworkers keep their ids (and their keyed draws).
    """
    if data is None or data.placement != "end_devices":
        return vworkers
    holders = [v.name for v in vworkers if v.holds_data]
    size = data.sample_bytes or SAMPLE_BYTES
    extra = [VWorkerSpec(f"d{i}", "agents.workloads.datanet.DataServer", {"serves": h, "sample_bytes": size})
             for i, h in enumerate(h for j in range(data.end_devices) for h in holders)]
    return [*vworkers, *extra]


def fault_spec(faults: tuple[FaultSetting, ...], vworkers: list[VWorkerSpec]) -> FaultSpec:
    """The validated ``faults:`` with vworker ids (docs/faults.md)."""
    ids = {v.name: i for i, v in enumerate(vworkers)}
    return FaultSpec(tuple(
        Fault(f.index, f.kind, f.start_ns, INFINITY if f.end_ns is None else f.end_ns,
              tuple(ids[w] for w in f.workers), tuple(tuple(ids[w] for w in g) for g in f.groups),
              f.probability, f.factor, f.mode, f.std) for f in faults))


def make_plan(rc: RunConfig, run_id: str | None = None) -> Plan:
    strategy = load_strategy(rc.strategy)
    vworkers = with_data_servers(layout_of(strategy, rc.workers, rc.strategy_settings), rc.data)
    holders = tuple(v.name for v in vworkers if v.holds_data)
    servers: dict[str, list[str]] = {}
    for v in vworkers:
        if v.cls.endswith("DataServer"):
            servers.setdefault(v.kwargs["serves"], []).append(v.name)
    workload = WorkloadSpec(model=rc.model, data_root=rc.data_root,
                            partition="two_class_non_iid" if rc.partition == "non_iid" else rc.partition,
                            partition_kw=rc.partition_kw, data_holders=holders,
                            batch_size=rc.batch_size[: len(holders)] or (1,), lr=rc.lr, momentum=rc.momentum,
                            eval_samples=rc.eval_samples, device=rc.device, threads=rc.threads, memory=rc.memory,
                            optimizer=rc.optimizer, data_placement=rc.data.placement, cache=rc.data.cache,
                            cache_size=rc.data.cache_size, data_servers=servers)
    settings = {"stop_updates": rc.stop_updates, "eval_every": rc.eval_every, **rc.strategy_settings}
    rid = run_id or rc.run_id or f"{time.strftime('%Y%m%d-%H%M%S')}-{config_hash(rc.raw)}"
    compute = compute_spec(rc.compute, vworkers, rc.device, rc.seed)
    if rc.compute.layerwise:  # per-layer shares of a gradient call (controller.predict.costs)
        from dataclasses import replace

        from controller.predict.costs import layer_table_of

        compute = replace(compute, layers=layer_table_of(rc, compute, workload.batch_size[0]))
    return Plan(run_id=rid, seed=rc.seed, strategy=rc.strategy_name,
                result=strategy.result_for(rc.workers, rc.strategy_settings), vworkers=vworkers,
                placement=place(vworkers, rc.agents, rc.placement), n_agents=rc.agents,
                network=network_spec(rc.network, vworkers, rc.seed),
                compute=compute, workload=workload,
                settings=settings, stop_virtual_time_ns=rc.stop_virtual_time_ns,
                faults=fault_spec(rc.faults, vworkers))

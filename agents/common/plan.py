"""The plan of a run: every vworker, where it lives, and the resolved models — plain JSON data.

The controller builds it from the config (``controller.plan``); each agent
receives it whole (in-process, or serialised over gRPC) and builds only the
vworkers placed on it. Nothing in it depends on the wall clock or the host.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from agents.sim.compute import ComputeSpec
from agents.sim.network import (ConstantLatency, DistributionLatency, LatencyModel, MatrixLatency,
                            NetworkSpec)
from agents.sim.tcp import TcpSpec
from agents.strategies.base import VWorkerSpec
from agents.workloads.training import WorkloadSpec
from agents.sim.types import INFINITY, VirtualTime

__all__ = ["Plan", "latency_model", "lookahead"]


@dataclass
class Plan:
    run_id: str
    seed: int
    strategy: str
    result: str  # the vworker whose model is the run's final model
    vworkers: list[VWorkerSpec]
    placement: list[int]  # agent id of each vworker id
    n_agents: int
    network: dict[str, Any]
    compute: dict[str, Any]
    workload: dict[str, Any]
    settings: dict[str, Any] = field(default_factory=dict)  # stop_updates, eval_every, ...
    stop_virtual_time_ns: VirtualTime | None = None

    @property
    def names(self) -> list[str]:
        return [v.name for v in self.vworkers]

    def local_ids(self, agent: int) -> list[int]:
        return [i for i, a in enumerate(self.placement) if a == agent]

    def network_spec(self) -> NetworkSpec:
        n = self.network
        tcp = TcpSpec(**n["tcp"]) if n.get("tcp") else None
        return NetworkSpec(latency_model(n["latency"], self.seed), tuple(n["bandwidth_out"]),
                           tuple(n["bandwidth_in"]), n["egress"], n["ingress"], tcp)

    def compute_spec(self) -> ComputeSpec:
        c = dict(self.compute)
        c["stragglers"] = {int(k): v for k, v in c.get("stragglers", {}).items()}
        for key in ("dist_params", "dist_kinds", "speed"):
            if key in c:
                c[key] = tuple(c[key])
        return ComputeSpec(**c, seed=self.seed)

    def workload_spec(self) -> WorkloadSpec:
        w = dict(self.workload)
        w["data_holders"] = tuple(w["data_holders"])
        w["batch_size"] = tuple(w["batch_size"])
        return WorkloadSpec(**w)

    def lookahead(self) -> VirtualTime:
        return lookahead(latency_model(self.network["latency"], self.seed), self.placement)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        d = json.loads(text)
        d["vworkers"] = [VWorkerSpec(**v) for v in d["vworkers"]]
        return cls(**d)


def latency_model(d: dict[str, Any], seed: int) -> LatencyModel:
    kind = d["kind"]
    if kind == "constant":
        return ConstantLatency(int(d["ns"]))
    if kind == "matrix":
        return MatrixLatency(tuple(tuple(int(x) for x in row) for row in d["matrix_ns"]), tuple(d["group_of"]))
    return DistributionLatency(kind, tuple(d["params"]), seed, float(d.get("min_s", 0.0)))


def lookahead(latency: LatencyModel, placement: list[int]) -> VirtualTime:
    """Minimum latency between two vworkers on different agents (INFINITY with one agent)."""
    agents = sorted(set(placement))
    if len(agents) < 2:
        return INFINITY
    if isinstance(latency, MatrixLatency):
        groups: dict[int, set[int]] = {}
        for vid, a in enumerate(placement):
            groups.setdefault(a, set()).add(latency.group_of[vid])
        best = INFINITY
        for a in agents:
            for b in agents:
                if a != b:
                    for ga in groups[a]:
                        for gb in groups[b]:
                            best = min(best, latency.matrix_ns[ga][gb])
        return best
    return latency.lower_bound(0, 0)

"""Gradient-exchange strategies (DESIGN §6), each a short module over the Worker API.

``STRATEGIES`` maps the names accepted by ``strategy=`` to dotted class paths; a
user strategy is any :class:`~agents.strategies.base.Strategy` subclass named by
``strategy._target_``.
"""
from __future__ import annotations

import importlib

from agents.strategies.base import Strategy, TrainingWorker, VWorkerSpec

__all__ = ["STRATEGIES", "Strategy", "TrainingWorker", "VWorkerSpec", "load_strategy", "import_path"]

STRATEGIES: dict[str, str] = {
    "sgd": "agents.strategies.sgd.SGD",
    "ps_sync": "agents.strategies.ps.PSSync",
    "ps_async": "agents.strategies.ps.PSAsync",
    "ssp": "agents.strategies.ssp.SSP",
    "ring_allreduce": "agents.strategies.ring_allreduce.RingAllReduce",
    "hierarchical_allreduce": "agents.strategies.hierarchical_allreduce.HierarchicalAllReduce",
    "gossip": "agents.strategies.gossip.Gossip",
    "local_sgd": "agents.strategies.local_sgd.LocalSGD",
    "fedavg": "agents.strategies.fedavg.FedAvg",
    "fedasync": "agents.strategies.fedasync.FedAsync",
    "microbench": "agents.strategies.microbench.Microbench",
}


def import_path(path: str) -> object:
    """Import ``pkg.module.Name``."""
    module, _, attr = path.rpartition(".")
    if not module:
        raise ImportError(f"{path!r} is not a dotted path like package.module.Class")
    return getattr(importlib.import_module(module), attr)


def load_strategy(name_or_path: str) -> type[Strategy]:
    cls = import_path(STRATEGIES.get(name_or_path, name_or_path))
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise TypeError(f"{name_or_path!r} is not a Strategy subclass")
    return cls

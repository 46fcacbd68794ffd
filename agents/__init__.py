"""lockstep's agent side: the engine (:mod:`agents.sim`), strategies, workloads and the agent process.

The public API a strategy author needs::

    from agents import Worker, TrainingWorker, Strategy, VWorkerSpec, Message
"""
from agents.sim.worker import Condition, Message, SendHandle, Worker
from agents.strategies.base import Strategy, TrainingWorker, VWorkerSpec

__all__ = ["Worker", "TrainingWorker", "Strategy", "VWorkerSpec", "Message", "SendHandle", "Condition"]

"""The engine: a discrete-event kernel, the Worker API, and the network and compute models.

Nothing here knows about gRPC, Kubernetes or the controller (an import contract in
pyproject.toml checks it): an agent process and the in-process launcher both run it.
Start reading at :mod:`agents.sim.kernel` (the event heap and coroutine driver), then
:mod:`agents.sim.worker` (what a strategy writes against) and :mod:`agents.sim.network`.
"""
from agents.sim.kernel import Kernel, KernelError, RemoteEvent
from agents.sim.types import INFINITY, NS_PER_S, VirtualTime, seconds_to_ns
from agents.sim.worker import Condition, Message, SendHandle, Worker

__all__ = ["Kernel", "KernelError", "RemoteEvent", "Worker", "Message", "SendHandle", "Condition",
           "VirtualTime", "INFINITY", "NS_PER_S", "seconds_to_ns"]

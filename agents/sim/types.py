"""Named domain values shared by the kernel, the network and the controller."""
from __future__ import annotations

from typing import NewType

VirtualTime = int
"""Virtual time in integer nanoseconds (DESIGN §1). Never a float inside the engine."""

VWorkerId = NewType("VWorkerId", int)
"""Dense integer id of a virtual worker; its stable name is e.g. ``w3`` or ``ps0``."""

AgentId = NewType("AgentId", int)
"""Dense integer id of an agent process (0 .. agents-1)."""

NS_PER_S = 1_000_000_000
INFINITY: VirtualTime = 2**63 - 1
"""A time after every event; used for "no next event"."""


def seconds_to_ns(seconds: float) -> VirtualTime:
    """Convert seconds (config edge) to integer nanoseconds, rounding to nearest."""
    return int(round(seconds * NS_PER_S))


def ns_to_seconds(ns: VirtualTime) -> float:
    return ns / NS_PER_S

"""Checkpoints of an agent at a window boundary (DESIGN §11, docs/recovery.md): save, then restore.

A checkpoint is the whole state of one :class:`~agents.core.AgentCore` between two windows — its
kernel's clock and event heap, the network model, every vworker (models, optimizers, mailboxes,
keyed-draw counters) and where each vworker's coroutine is suspended — as bytes. Restoring them in a
fresh process gives a core that runs the rest of the run exactly as the saved one would have.

Python cannot serialise a suspended coroutine, so a vworker's strategy says where it is
(:meth:`~agents.sim.worker.Worker.position`) and rebuilds its coroutine from that
(:meth:`~agents.sim.worker.Worker.resume_at`). A strategy that does not, or a vworker suspended where its
strategy cannot say, makes :func:`snapshot` raise :class:`NotCheckpointable`; the run then recovers by
replaying from virtual time 0, as before.
"""
from __future__ import annotations

from typing import Any

__all__ = ["NotCheckpointable", "snapshot", "restore"]


class NotCheckpointable(RuntimeError):
    """This agent cannot be checkpointed now; the message names the vworker and where it waits."""


def snapshot(core: Any) -> bytes:
    """The state of ``core`` between two windows, as bytes (raises :class:`NotCheckpointable`)."""
    raise NotCheckpointable("checkpoints are not built yet")


def restore(plan: Any, agent_id: int, blob: bytes, *, data: Any = None, metrics: Any = None,
            own_process: bool = False) -> Any:
    """An AgentCore for ``agent_id`` of ``plan`` in the state :func:`snapshot` saved in ``blob``."""
    raise NotCheckpointable("checkpoints are not built yet")

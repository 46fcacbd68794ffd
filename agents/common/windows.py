"""The window rule of DESIGN §5, shared by the controller's loop and the agents' direct windows.

Both transports compute the same windows from the same facts — each agent's next
event time and output bound, and the earliest time and effect of the events
routed to it — so a run's events, and with them its outputs, do not depend on
which transport carries the windows (docs/distributed.md, "Window ends" and
"Direct windows").
"""
from __future__ import annotations

from typing import Sequence

from agents.sim.types import INFINITY, VirtualTime

__all__ = ["ends_from_first", "earliest"]


def ends_from_first(T: VirtualTime, first: Sequence[VirtualTime], lookahead: VirtualTime) -> list[VirtualTime]:
    """Each agent's window end: ``min over b != a of first(b) + lookahead``.

    ``first(b)`` is the earliest time agent ``b`` could act on another agent: its output bound
    (:meth:`agents.sim.kernel.Kernel.output_bound`) or the ``acts_at`` of an event routed to it.
    Nothing ``b`` sends this window can arrive earlier; what ``a`` itself sends is answered no
    sooner than ``lookahead`` after the receiver can act on it, and ``a``'s kernel stops its
    window there (``Kernel.reply_lookahead``). Zero lookahead: the single instant ``T``.
    """
    n = len(first)
    if n == 1 or lookahead >= INFINITY:
        return [INFINITY] * n
    if lookahead <= 0:
        return [T + 1] * n
    # the two smallest, so each agent's minimum over the others costs O(1)
    order = sorted(range(n), key=first.__getitem__)
    lo, lo2 = first[order[0]], first[order[1]]
    return [min((lo2 if a == order[0] else lo) + lookahead, INFINITY) for a in range(n)]


def earliest(next_t: Sequence[VirtualTime], pending_time: Sequence[VirtualTime]) -> VirtualTime:
    """The earliest next event of any agent or undelivered message (DESIGN §5 step 1)."""
    return min(min(next_t), min(pending_time))

"""Stale-synchronous parallel (SSP, Ho et al., "More Effective Distributed ML via a Stale Synchronous
Parallel Parameter Server", NIPS 2013): an asynchronous PS whose fastest worker may run at most
``staleness_bound`` steps ahead of the slowest. The PS logic lives in :mod:`agents.strategies.ps`.
"""
from __future__ import annotations

from typing import Any

from agents.strategies.ps import PSAsync

__all__ = ["SSP"]


class SSP(PSAsync):
    name = "ssp"

    @classmethod
    def _bound(cls, settings: dict[str, Any]) -> int | None:
        s = settings.get("staleness_bound", 3)
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise ValueError(f"strategy.staleness_bound={s!r} is not valid; accepted: an integer >= 0")
        return s

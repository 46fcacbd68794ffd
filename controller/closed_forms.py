"""The coarse-grained step-time models of the throughput-prediction paper (Eq. 7-11), as functions.

"Predicting Throughput of Distributed Stochastic Gradient Descent" (§3.1):
K workers, model size M bytes, bandwidth B bytes/s to/from the parameter
server (per worker for the ring), compute times T_F + T_B per step and T_S for
the update. The paper's formulas have no latency; ``latency`` adds the number
of one-way latencies lockstep's messages pay on the critical path (2 per PS
round, 2(K−1) per ring all-reduce), so the functions can be compared with an
emulated step time exactly.
"""
from __future__ import annotations

__all__ = ["ps_step", "fcfs_step", "hybrid_step", "hybrid_overlap_step", "ring_step", "throughput"]


def ps_step(K: int, M: float, B: float, T_C: float, T_S: float = 0.0, latency: float = 0.0) -> float:
    """Eq. 7: processor sharing at the PS, ``K·M/B + (T_F+T_B) + K·M/B + T_S`` (+ 2 latencies)."""
    return K * M / B + T_C + K * M / B + T_S + 2 * latency


def fcfs_step(K: int, M: float, B: float, T_C: float, T_S: float = 0.0, latency: float = 0.0) -> float:
    """Eq. 8: FCFS transfers, ``K·M/B + (T_F+T_B) + M/B + T_S`` (+ 2 latencies)."""
    return K * M / B + T_C + M / B + T_S + 2 * latency


def hybrid_step(K: int, M: float, B: float, T_C: float, T_S: float = 0.0, latency: float = 0.0) -> float:
    """Eq. 9: the mean of Eq. 7 and Eq. 8, ``K·M/B + (T_F+T_B) + (K+1)·M/(2B) + T_S``."""
    return K * M / B + T_C + (K + 1) * M / (2 * B) + T_S + 2 * latency


def hybrid_overlap_step(K: int, M: float, B: float, T_F: float, T_B: float, T_S: float = 0.0,
                        latency: float = 0.0) -> float:
    """Eq. 10: Eq. 9 with communication overlapping computation, ``max(K·M/B, T_F) + max((K+1)·M/(2B), T_B) + T_S``."""
    return max(K * M / B, T_F) + max((K + 1) * M / (2 * B), T_B) + T_S + 2 * latency


def ring_step(K: int, M: float, B: float, T_C: float, T_S: float = 0.0, latency: float = 0.0) -> float:
    """Eq. 11: ring all-reduce, ``(T_F+T_B) + 2(K−1)·M/(K·B)`` (+ T_S and 2(K−1) latencies)."""
    return T_C + 2 * (K - 1) * M / (K * B) + T_S + 2 * (K - 1) * latency


def throughput(step_s: float, K: int, batch: int) -> float:
    """Samples per second of a synchronous step that consumes K·batch samples."""
    return K * batch / step_s

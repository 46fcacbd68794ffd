"""Collectives written as messages over the Worker API: ring all-reduce (reduce-scatter + all-gather).

Nothing here assumes a cost: each chunk is a real message through the network
model, so the ``2(K−1)/K · M/B`` of a ring all-reduce (Eq. 11 of the
throughput-prediction paper) emerges from K−1 reduce-scatter and K−1
all-gather steps of ``M/K`` bytes each, plus one latency per step.
"""
from __future__ import annotations

import torch

from agents.sim.worker import Worker

__all__ = ["ring_allreduce", "chunk_bounds"]


def chunk_bounds(n: int, k: int) -> list[tuple[int, int]]:
    """``k`` contiguous chunks of ``range(n)`` whose sizes differ by at most one (``torch.tensor_split``)."""
    q, r = divmod(n, k)
    out, start = [], 0
    for i in range(k):
        size = q + (1 if i < r else 0)
        out.append((start, start + size))
        start += size
    return out


def _add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a + b  # a new tensor: a received payload is never mutated


async def _exchange(w: Worker, right: str, left: str, out: torch.Tensor, in_size: int, extras: list[float],
                    tag: str, segment: int | None) -> tuple[torch.Tensor, list[float]]:
    """Send ``out`` to ``right`` while receiving ``in_size`` elements from ``left``.

    With ``segment`` (bytes), both chunks travel in segments and each segment is
    sent only after its receiver said it is ready, as collective libraries such
    as gloo do: about one extra latency per segment and step.
    """
    if not segment:
        w.send(right, (out, extras), tag=tag)
        m = await w.recv(src=left, tag=tag)
        return m.payload[0], m.payload[1]
    per = max(1, segment // out.element_size())
    n_out, n_in = max(1, -(-out.numel() // per)), max(1, -(-in_size // per))
    parts: list[torch.Tensor] = []
    theirs: list[float] = []
    for k in range(max(n_out, n_in)):
        if k < n_in:
            w.send(left, None, tag=f"{tag}.rdy{k}")  # receiver-ready: an empty message
        if k < n_out:
            await w.recv(src=right, tag=f"{tag}.rdy{k}")
            w.send(right, (out[k * per:(k + 1) * per].clone(), extras if k == n_out - 1 else None),
                   tag=f"{tag}.{k}")
        if k < n_in:
            m = await w.recv(src=left, tag=f"{tag}.{k}")
            parts.append(m.payload[0])
            if m.payload[1] is not None:
                theirs = m.payload[1]
    return torch.cat(parts), theirs


async def ring_allreduce(w: Worker, vec: torch.Tensor, ring: list[str], tag: str,
                         extras: list[float] | None = None, segment: int | None = None
                         ) -> tuple[torch.Tensor, list[float], int]:
    """Sum ``vec`` over the vworkers of ``ring`` (this one included): ``(sum, summed extras, bytes sent)``.

    ``extras`` are scalars (a loss, a sample count) summed along the reduce-scatter
    for free (zero bytes on the wire). Every member gets bit-identical results:
    each chunk is reduced by one member and then copied to the others.
    """
    extras = list(extras or [])
    k = len(ring)
    if k == 1:
        return vec, extras, 0
    r = ring.index(w.name)
    right, left = ring[(r + 1) % k], ring[(r - 1) % k]
    bounds = chunk_bounds(vec.numel(), k)
    chunks = [vec[a:b] for a, b in bounds]
    sent = 0
    acc = list(extras)
    # reduce-scatter: after step s, chunk (r-s-1) mod k holds the sum of s+2 members
    for s in range(k - 1):
        out_i, in_i = (r - s) % k, (r - s - 1) % k
        got, their = await _exchange(w, right, left, chunks[out_i], bounds[in_i][1] - bounds[in_i][0], acc,
                                     f"{tag}.rs{s}", segment)
        sent += chunks[out_i].numel() * chunks[out_i].element_size()
        chunks[in_i] = await w.compute(_add, got, chunks[in_i], kind="aggregate", cost=float(got.numel()))
        acc = [a + b for a, b in zip(their, extras)]
    # all-gather: member r now owns the reduced chunk (r+1) mod k and passes reduced chunks around
    for s in range(k - 1):
        out_i, in_i = (r + 1 - s) % k, (r - s) % k
        got, _ = await _exchange(w, right, left, chunks[out_i], bounds[in_i][1] - bounds[in_i][0], [],
                                 f"{tag}.ag{s}", segment)
        sent += chunks[out_i].numel() * chunks[out_i].element_size()
        chunks[in_i] = got
    return torch.cat(chunks), acc, sent

"""Collectives written as messages over the Worker API: ring all-reduce (reduce-scatter + all-gather).

Nothing here assumes a cost: each chunk is a real message through the network
model, so the ``2(K−1)/K · M/B`` of a ring all-reduce (Eq. 11 of the
throughput-prediction paper) emerges from K−1 reduce-scatter and K−1
all-gather steps of ``M/K`` bytes each, plus one latency per step.
"""
from __future__ import annotations

import heapq
from collections import deque
from typing import Any

import torch

from agents.checkpoint import continues, finishes
from agents.sim.network import payload_nbytes
from agents.sim.worker import Worker

__all__ = ["ring_allreduce", "gloo_ring_allreduce", "GlooP2P", "chunk_bounds", "GLOO_MAX_SEGMENT", "GLOO_OP_BYTES"]


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


def segment_bytes(value: Any) -> int | None:
    """``strategy.segment`` in bytes (a number or a size like ``1MB``; validated before the run), None: whole chunks."""
    if value is None:
        return None
    from agents.common.units import parse_size

    return int(parse_size(value, "strategy.segment"))


async def _exchange(w: Worker, right: str, left: str, out: torch.Tensor, in_size: int, extras: list[float],
                    tag: str, segment: int | None) -> tuple[torch.Tensor, list[float]]:
    """Send ``out`` to ``right`` while receiving ``in_size`` elements from ``left``.

    With ``segment`` (bytes), both chunks travel in segments and each segment is
    sent only after its receiver said it is ready, as collective libraries such
    as gloo do: about one extra latency per segment and step.
    """
    segment = segment_bytes(segment)
    if not segment:
        w.send(right, (out, extras), tag=tag)
        m = await w.recv(src=left, tag=tag)
        return m.payload[0], m.payload[1]
    x = _Segments(w, right, left, out, in_size, extras, tag, segment)
    return await x.run()


class _Segments:
    """One segmented exchange of :func:`_exchange`: segment ``k`` goes out once ``right`` is ready for it."""

    def __init__(self, w: Worker, right: str, left: str, out: torch.Tensor, in_size: int, extras: list[float],
                 tag: str, segment: int):
        self.w, self.right, self.left, self.out, self.extras, self.tag = w, right, left, out, extras, tag
        self.per = max(1, segment // out.element_size())
        self.n_out, self.n_in = max(1, -(-out.numel() // self.per)), max(1, -(-in_size // self.per))
        self.parts: list[torch.Tensor] = []
        self.theirs: list[float] = []
        self.k = 0

    async def run(self) -> tuple[torch.Tensor, list[float]]:
        while self.k < max(self.n_out, self.n_in):
            await self.step()
            self.k += 1
        return torch.cat(self.parts), self.theirs

    async def step(self) -> None:
        """Segment ``k``: say we are ready for theirs, send ours once they are ready, receive theirs."""
        k = self.k
        if k < self.n_in:
            self.w.send(self.left, None, tag=f"{self.tag}.rdy{k}")  # receiver-ready: an empty message
        if k < self.n_out:
            await self.w.recv(src=self.right, tag=f"{self.tag}.rdy{k}")
            self.send()
        return await self.receive()

    def send(self) -> None:
        k, per = self.k, self.per
        self.w.send(self.right, (self.out[k * per:(k + 1) * per].clone(), self.extras if k == self.n_out - 1 else None),
                    tag=f"{self.tag}.{k}")

    async def receive(self) -> None:
        if self.k < self.n_in:
            self.received(await self.w.recv(src=self.left, tag=f"{self.tag}.{self.k}"))

    def received(self, m: Any) -> None:
        self.parts.append(m.payload[0])
        if m.payload[1] is not None:
            self.theirs = m.payload[1]


GLOO_MAX_SEGMENT = 1 << 20  # bytes: gloo::AllreduceOptions::kMaxSegmentSize
GLOO_OP_BYTES = 48  # a gloo tcp op's preamble (six size_t): every notification, and in front of every data op


async def gloo_ring_allreduce(w: Worker, vec: torch.Tensor, ring: list[str], tag: str,
                              extras: list[float] | None = None, max_segment: int = GLOO_MAX_SEGMENT
                              ) -> tuple[torch.Tensor, list[float], int]:
    """gloo's ring all-reduce (gloo/allreduce.cc ``ring()``, what torch.distributed's gloo backend runs).

    The vector is cut into ``n`` segments of at most ``max_segment`` bytes, ``n`` a multiple of the
    ring size and at least twice it; reduce-scatter then all-gather send each member's ``n − n/K``
    segments to the previous member (``rank − 1``), two in flight: iteration ``i`` posts the receive
    and the send of segment ``i`` and first waits for those of ``i − 2``. Each transfer is a
    rendezvous of the tcp transport's unbound buffers: the receiver announces its posted receive
    (``NOTIFY_RECV_READY``, 48 bytes), the sender announces its send (``NOTIFY_SEND_READY``) and sends
    the data (48-byte preamble + segment) once it has the receiver's announcement — from its device
    thread, which handles the notifications as they arrive, whatever the member is doing (here a
    delivery handler of the vworker, as in :class:`GlooP2P`). So a segment whose announcement arrives
    while the member reduces the previous one goes out before the member posts its next receive, and
    that receive's announcement queues behind the segment on the pair's connection (gloo, and the
    ring2-10-1000-10 capture). Iteration ``i`` waits for the receive of ``i − 2`` (``waitRecv``) and
    for the send of ``i − 2`` to have been handed to the connection (``waitSend``).
    ``extras`` ride along the reduce-scatter like reduced elements. Every member ends with
    bit-identical results: each segment is reduced along one path, then copied.
    """
    extras = list(extras or [])
    k = len(ring)
    if k == 1:
        return vec, extras, 0
    r = ring.index(w.name)
    send_to, recv_from = ring[(r - 1) % k], ring[(r + 1) % k]
    esize = vec.element_size()
    numel = vec.numel()
    total = numel * esize
    max_bytes = esize * max(1, max_segment // esize)
    n = max(-(-total // max_bytes), 2 * k)
    n = -(-n // k) * k
    p = n // k
    per = -(-(-(-total // n)) // esize)  # elements per segment (segment bytes rounded up to elements)
    if numel < n * per - per:  # so small that some members own no segment: whole chunks do
        return await ring_allreduce(w, vec, ring, tag, extras)
    return await _GlooRing(w, vec, n, p, per, (tag, "gloo"), extras, send_to, recv_from, r).run()


class _GlooRing:
    """One member's :func:`gloo_ring_allreduce`: its iterations ``i`` of reduce-scatter, then of all-gather."""

    def __init__(self, w: Worker, vec: torch.Tensor, n: int, p: int, per: int, ctag: Any, extras: list[float],
                 send_to: str, recv_from: str, r: int):
        numel = vec.numel()
        self.w, self.n, self.p, self.r = w, n, p, r
        self.parts = [vec[min(j * per, numel):min((j + 1) * per, numel)] for j in range(n)]
        self.pair = _GlooPair(w, ctag, send_to, recv_from)
        self.own = list(extras)
        self.seg_extras: dict[int, list[float]] = {}
        self.phase: str | None = "rs"
        self.i = 0
        self.posted_recv: dict[int, int] = {}  # iteration -> segment whose receive it posted

    async def run(self) -> tuple[torch.Tensor, list[float], int]:
        while self.phase is not None:
            await self.iteration()
            self.next()
        return await self.finish()

    def next(self) -> None:
        self.i += 1
        if self.i == self.n - self.p + 2:
            self.phase, self.i, self.posted_recv = ("ag" if self.phase == "rs" else None), 0, {}

    async def iteration(self) -> None:
        """Iteration ``i``: wait for the receive and the send of ``i − 2``, then post those of ``i``."""
        i = self.i
        if i >= 2 and (i - 2) in self.posted_recv:
            j = self.posted_recv.pop(i - 2)
            data, their = await self.pair.wait_data(self.phase, i - 2)
            return await self.received(j, data, their)
        return await self.post()

    async def received(self, j: int, data: torch.Tensor, their: list[float] | None) -> None:
        if self.phase == "rs":
            self.reduced(j, await self.w.compute(_add, data, self.parts[j], kind="aggregate",
                                                 cost=float(data.numel())), their)
        else:
            self.parts[j] = data
        return await self.post()

    def reduced(self, j: int, seg: torch.Tensor, their: list[float] | None) -> None:
        self.parts[j] = seg
        self.seg_extras[j] = [a + b for a, b in zip(their, self.own)] if their is not None else list(self.own)

    async def post(self) -> None:
        if self.i >= 2:
            await self.pair.wait_sent(self.phase, self.i - 2)
        self.posts()

    def posts(self) -> None:
        """Post the receive and the send of iteration ``i``."""
        i, n, p, r, phase, parts = self.i, self.n, self.p, self.r, self.phase, self.parts
        if i < n - p:
            base_send, base_recv = (r + 1, r + 2) if phase == "rs" else (r, r + 1)
            js, jr = (base_send * p + i) % n, (base_recv * p + i) % n
            if parts[jr].numel() > 0:
                self.posted_recv[i] = jr
                self.pair.post_recv(phase, i)
            if parts[js].numel() > 0:
                ext = (self.seg_extras.get(js, self.own) if phase == "rs" else None)
                self.pair.post_send(phase, i, parts[js], ext)

    async def finish(self) -> tuple[torch.Tensor, list[float], int]:
        await self.pair.flush()  # like gloo, return only once every send has gone out
        return self.result()

    def result(self) -> tuple[torch.Tensor, list[float], int]:
        # the members' last reduced segments carry the extras of the whole ring
        final = self.seg_extras.get(((self.r + 2) * self.p + self.n - self.p - 1) % self.n, self.own)
        return torch.cat(self.parts), final, self.pair.sent


def _preamble_apart(w: Worker) -> bool:
    """Whether gloo's 48-byte op preamble leaves as a write of its own before the payload: with the tcp
    model's receiver ACK policy (``network.tcp.delayed_ack``), where a lone small packet is acknowledged
    late, as on the testbed (docs/engine.md)."""
    tcp = getattr(w.env.network, "tcp", None)
    return bool(getattr(tcp, "delayed_ack", False))


def barrier_peers(rank: int, n: int) -> tuple[set[int], set[int]]:
    """The ranks ``rank`` exchanged messages with in gloo's dissemination barrier over ``n`` ranks
    (``gloo/barrier.cc``; Hensgen, Finkel and Manber 1988): ``(heard_from, answered)``.

    In round ``d = 1, 2, 4, … < n`` a rank posts its receive from ``rank − d`` (announcing it there) and
    sends to ``rank + d`` once that rank's announcement has come: so it hears from both (an announcement
    or the data op, each a message on the connection) and answers ``rank + d`` (its data op follows the
    announcement it heard).
    """
    heard, answered = set(), set()
    d = 1
    while d < n:
        heard.update({(rank - d) % n, (rank + d) % n})
        answered.add((rank + d) % n)
        d <<= 1
    heard.discard(rank)
    answered.discard(rank)
    return heard, answered


def barrier_entries(n: int, one_way_ns: int) -> list[int]:
    """When each of ``n`` ranks leaves ``init_process_group`` and enters the barrier, in ns after the
    second-to-last: in rank order two one-way times apart, the last rank one one-way time before the
    second-to-last (``benchmarks/realrun/starts.py``; docs/benchmarks.md, "The start-up barrier")."""
    if n < 2:
        return [0] * n
    return [-2 * one_way_ns * (n - 2 - r) for r in range(n - 1)] + [-one_way_ns]


def barrier_exits(n: int, one_way_ns: int) -> list[int]:
    """When each of ``n`` ranks of a torch program leaves ``dist.barrier()`` right after
    ``init_process_group``, in ns after the first one leaves; ``one_way_ns`` is the one-way time of a small
    message between two hosts.

    Measured on the testbed (``benchmarks/realrun/starts.py``; docs/benchmarks.md, "The start-up barrier"):
    ranks leave ``init_process_group`` in rank order two one-way times apart, the last rank one one-way time
    before the second-to-last. gloo's barrier is then the dissemination barrier of :func:`barrier_peers`
    over gloo's send/recv rendezvous: in round ``d`` a rank announces its receive to ``rank − d`` and its
    data op leaves for ``rank + d`` once that rank's announcement has come, one one-way time after it was
    posted; the rank goes to the next round when its receive has arrived and its send has left. This is
    :func:`barrier_on_cores` with a core per rank and nothing after the barrier.
    """
    exits, _ = barrier_on_cores(barrier_entries(n, one_way_ns), one_way_ns, [0] * n, cores=n)
    first = min(exits, default=0)
    return [t - first for t in exits]


def barrier_on_cores(entries_ns: list[int], one_way_ns: int, setup_ns: list[int], cores: int,
                     ties: list[float] | None = None) -> tuple[list[int], list[int]]:
    """``(exits, ready)``: when each rank leaves gloo's dissemination barrier and when it has done the
    setup that follows it (``setup_ns``: the program's allocations before its first operation), on hosts
    whose ranks share ``cores`` CPUs and run each process until it blocks (``entries_ns``: when each rank
    entered the barrier).

    The rounds are :func:`barrier_exits`'. A rank needs a core for each of its steps: a woken rank waits
    until one is free, and a core is held from a rank's barrier exit to the end of its setup — the testbed's
    processes run at one real-time priority (``chrt -r 5``), where nothing preempts a running process, and
    its hosts share the machine's two cores (docs/benchmarks.md, "The start-up on two cores"). Ranks
    waiting for a core get it in the order they woke, ties in the order of ``ties`` (default: rank).
    """
    n = len(entries_ns)
    ties = list(range(n)) if ties is None else ties
    rounds, d = [], 1
    while d < n:
        rounds.append(d)
        d <<= 1
    at = [0] * n                                 # the round each rank is in
    announced, sent = [False] * n, [False] * n
    announcements = [set() for _ in range(n)]   # rounds whose receive rank + d has announced
    data = [set() for _ in range(n)]            # rounds whose data op from rank - d has come
    entered = [False] * n
    exits: list[int | None] = [None] * n
    ready: list[int | None] = [None] * n
    held: list[int] = []                          # when the cores now held for setups are freed
    waiting: list[tuple[int, float, int]] = []    # (woke at, tie, rank)
    events: list[tuple[int, int, str, int, int]] = []
    seq = 0

    def post(t: int, kind: str, rank: int, rnd: int = -1) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(events, (t, seq, kind, rank, rnd))

    def run(r: int, t: int) -> None:
        """Rank ``r`` holds a core at ``t``: it goes as far as its messages let it."""
        while at[r] < len(rounds):
            d, k = rounds[at[r]], at[r]
            if not announced[r]:
                announced[r] = True
                post(t + one_way_ns, "announce", (r - d) % n, k)
            if not sent[r] and k in announcements[r]:
                sent[r] = True
                post(t + one_way_ns, "data", (r + d) % n, k)
            if not (sent[r] and k in data[r]):
                return
            at[r] += 1
            announced[r] = sent[r] = False
        exits[r], ready[r] = t, t + setup_ns[r]
        held.append(ready[r])
        post(ready[r], "free", r)

    for r, t in enumerate(entries_ns):
        post(t, "enter", r)
    while events:
        t = events[0][0]
        while events and events[0][0] == t:  # everything that happens at t, then who runs
            _, _, kind, r, k = heapq.heappop(events)
            if kind == "free":
                held.remove(t)
                continue
            if kind == "enter":
                entered[r] = True
            elif kind == "announce":
                announcements[r].add(k)
            else:
                data[r].add(k)
            if entered[r] and exits[r] is None and all(q != r for _, _, q in waiting):
                waiting.append((t, ties[r], r))
        waiting.sort()
        while waiting and len(held) < cores:
            run(waiting.pop(0)[2], t)
    return [int(x) for x in exits], [int(x) for x in ready]


def gloo_barrier(w: Worker, ranks: list[str]) -> None:
    """What the program's ``dist.barrier()`` after ``init_process_group`` (realrun's, and most torch
    programs') leaves on this vworker's connections, for the ``tcp`` model's receiver (docs/engine.md,
    "Connections before the first tensor"): a peer it heard from in the barrier counts as heard from
    just now, and one it answered puts its receiver in pingpong mode. The barrier's own time is not
    modelled here: ``lockstep validate`` starts each rank when it has left the barrier and done its setup on
    the testbed's cores (:func:`barrier_on_cores`, ``compute.start_offsets``) plus a spread for the hosts'
    scheduling (``compute.start_spread``)."""
    prime = getattr(w.env.network, "barrier_history", None)
    if prime is None:
        return
    heard, answered = barrier_peers(ranks.index(w.name), len(ranks))
    prime(w, [w.env.ids[ranks[r]] for r in sorted(heard)], {w.env.ids[ranks[r]] for r in answered})


class _GlooPair:
    """The rendezvous of one member with its two ring neighbours during one all-reduce.

    The collective's messages are handled on delivery (gloo's device thread): an announced receive
    releases the send waiting for it at once; data is kept until the member asks for it. The member
    waits on a doorbell rung by every delivery."""

    BELL = "gloo.ring"

    def __init__(self, w: Worker, ctag: Any, send_to: str, recv_from: str):
        self.w, self.ctag, self.send_to, self.recv_from = w, ctag, send_to, recv_from
        self.ready: set[tuple[str, int]] = set()      # receives send_to has posted, not yet used
        self.pending: dict[tuple[str, int], tuple] = {}  # sends waiting for send_to's announcement
        self.data: dict[tuple[str, int], tuple] = {}
        self.sent = 0
        self.bell = w.condition(self.BELL)
        while (m := w.recv_nowait(tag=ctag)) is not None:  # what came before this member started the call
            self._handle(m.payload)
        w.handle(ctag, self._on_message)

    def post_recv(self, phase: str, i: int) -> None:
        self.w.send(self.recv_from, ("rr", phase, i), nbytes=GLOO_OP_BYTES, tag=self.ctag)

    def post_send(self, phase: str, i: int, seg: torch.Tensor, ext: list[float] | None) -> None:
        key = (phase, i)
        if key in self.ready:
            self.ready.discard(key)
            self._send(key, seg, ext, GLOO_OP_BYTES)  # NOTIFY_SEND_READY and the data op together
        else:
            self.pending[key] = (seg, ext)
            self.w.send(self.send_to, ("sr", phase, i), nbytes=GLOO_OP_BYTES, tag=self.ctag)

    def _send(self, key: tuple[str, int], seg: torch.Tensor, ext: list[float] | None, extra: int) -> None:
        nbytes = seg.numel() * seg.element_size()
        if _preamble_apart(self.w):
            self.w.send(self.send_to, ("pre",), nbytes=GLOO_OP_BYTES + extra, tag=self.ctag)
            self.w.send(self.send_to, ("d", key[0], key[1], seg, ext), nbytes=nbytes, tag=self.ctag)
        else:
            self.w.send(self.send_to, ("d", key[0], key[1], seg, ext), nbytes=nbytes + GLOO_OP_BYTES + extra,
                        tag=self.ctag)
        self.sent += nbytes

    def _on_message(self, m: Any) -> None:
        self._handle(m.payload)
        self.w.ring(self.BELL)

    def _handle(self, payload: tuple) -> None:
        kind = payload[0]
        if kind == "rr":
            key = (payload[1], payload[2])
            if key in self.pending:
                seg, ext = self.pending.pop(key)
                self._send(key, seg, ext, 0)
            else:
                self.ready.add(key)
        elif kind == "d":
            self.data[(payload[1], payload[2])] = (payload[3], payload[4])
        # "sr": the sender's announcement; nothing to do until its data comes; "pre": a data op's preamble

    async def wait_data(self, phase: str, i: int) -> tuple[torch.Tensor, list[float] | None]:
        """gloo's ``waitRecv``: segment ``i`` of ``phase`` has arrived."""
        key = (phase, i)
        while key not in self.data:
            await self.w.wait(self.bell)
        return self.data.pop(key)

    async def wait_sent(self, phase: str, i: int) -> None:
        """gloo's ``waitSend``: segment ``i`` of ``phase`` went to the connection (its receiver had announced it)."""
        while (phase, i) in self.pending:
            await self.w.wait(self.bell)

    async def flush(self) -> None:
        """Like gloo, return only once every send has gone out; then stop handling this call's messages."""
        while self.pending:
            await self.w.wait(self.bell)
        self.w.handle(self.ctag, None)


class GlooP2P:
    """torch.distributed's ``send``/``recv`` over gloo's tcp transport (the PS strategies' ``collective: gloo``).

    gloo's unbound buffers rendezvous per message (``gloo/transport/tcp/pair.cc``): a receive, when
    posted, is announced to its sender (``NOTIFY_RECV_READY``, a 48-byte op); a send starts at once if
    the receiver's announcement for it has arrived, else the sender announces it (``NOTIFY_SEND_READY``)
    and starts it when the announcement comes. The data op is a 48-byte preamble and the payload.
    gloo's device thread handles the notifications as they arrive, whatever the application waits
    for: here a delivery handler of the vworker. Announcements are matched per peer and tag, in order.
    """

    TAG = "gloo.p2p"

    def __init__(self, w: Worker):
        self.w = w
        self.ready: dict[tuple[str, Any], int] = {}  # announced receives of (peer, tag) not yet used
        self.pending: dict[tuple[str, Any], deque] = {}  # sends of (peer, tag) waiting for an announcement
        w.handle(self.TAG, self._on_note)
        while (m := w.recv_nowait(tag=self.TAG)) is not None:  # announced before this vworker started
            self._on_note(m)

    def post_recv(self, src: str, tag: Any) -> None:
        """A receive of ``tag`` from ``src`` is posted: announce it."""
        self.w.send(src, ("rr", tag), nbytes=GLOO_OP_BYTES, tag=self.TAG)

    def send(self, dst: str, payload: Any, tag: Any, nbytes: int | None = None) -> None:
        key = (dst, tag)
        if self.ready.get(key):
            self.ready[key] -= 1
            self._data(dst, payload, tag, nbytes)
        else:
            self.pending.setdefault(key, deque()).append((payload, nbytes))
            self.w.send(dst, ("sr", tag), nbytes=GLOO_OP_BYTES, tag=self.TAG)

    def _data(self, dst: str, payload: Any, tag: Any, nbytes: int | None) -> None:
        size = payload_nbytes(payload) if nbytes is None else int(nbytes)
        if _preamble_apart(self.w):
            self.w.send(dst, ("pre", tag), nbytes=GLOO_OP_BYTES, tag=self.TAG)
            self.w.send(dst, payload, nbytes=size, tag=tag)
        else:
            self.w.send(dst, payload, nbytes=size + GLOO_OP_BYTES, tag=tag)

    def _on_note(self, m: Any) -> None:
        kind, tag = m.payload
        if kind != "rr":  # "sr": the sender's announcement; the data follows once ours reaches it
            return
        key = (m.src, tag)
        waiting = self.pending.get(key)
        if waiting:
            payload, nbytes = waiting.popleft()
            self._data(m.src, payload, tag, nbytes)
        else:
            self.ready[key] = self.ready.get(key, 0) + 1


async def ring_allreduce(w: Worker, vec: torch.Tensor, ring: list[str], tag: str,
                         extras: list[float] | None = None, segment: int | None = None
                         ) -> tuple[torch.Tensor, list[float], int]:
    """Sum ``vec`` over the vworkers of ``ring`` (this one included): ``(sum, summed extras, bytes sent)``.

    ``extras`` are scalars (a loss, a sample count) summed along the reduce-scatter
    for free (zero bytes on the wire). Every member gets bit-identical results:
    each chunk is reduced by one member and then copied to the others.
    """
    extras = list(extras or [])
    if len(ring) == 1:
        return vec, extras, 0
    return await _Ring(w, vec, ring, tag, extras, segment).run()


class _Ring:
    """One member's ring all-reduce: ``k − 1`` reduce-scatter steps, then ``k − 1`` all-gather steps."""

    def __init__(self, w: Worker, vec: torch.Tensor, ring: list[str], tag: str, extras: list[float],
                 segment: int | None):
        self.w, self.tag, self.extras, self.segment = w, tag, extras, segment
        self.k = k = len(ring)
        self.r = r = ring.index(w.name)
        self.right, self.left = ring[(r + 1) % k], ring[(r - 1) % k]
        self.bounds = chunk_bounds(vec.numel(), k)
        self.chunks = [vec[a:b] for a, b in self.bounds]
        self.sent = 0
        self.acc = list(extras)
        self.s = 0  # steps done

    async def run(self) -> tuple[torch.Tensor, list[float], int]:
        while self.s < 2 * (self.k - 1):
            await self.step()
            self.s += 1
        return torch.cat(self.chunks), self.acc, self.sent

    async def step(self) -> None:
        """Reduce-scatter step s: after it, chunk (r−s−1) mod k holds the sum of s+2 members. All-gather step
        s: member r owns the reduced chunk (r+1) mod k and passes reduced chunks around."""
        k, r, s = self.k, self.r, self.s
        rs = s < k - 1
        out_i, in_i = ((r - s) % k, (r - s - 1) % k) if rs else ((r + 1 - (s - k + 1)) % k, (r - (s - k + 1)) % k)
        out = self.chunks[out_i]
        self.sent += out.numel() * out.element_size()
        got, their = await _exchange(self.w, self.right, self.left, out, self.bounds[in_i][1] - self.bounds[in_i][0],
                                     self.acc if rs else [], f"{self.tag}.rs{s}" if rs else f"{self.tag}.ag{s - k + 1}",
                                     self.segment)
        return await self.exchanged(rs, in_i, got, their)

    async def exchanged(self, rs: bool, i: int, got: torch.Tensor, their: list[float]) -> None:
        if not rs:  # all-gather: a reduced chunk to keep
            self.chunks[i] = got
            return
        self.reduced(i, await self.w.compute(_add, got, self.chunks[i], kind="aggregate", cost=float(got.numel())),
                     their)

    def reduced(self, i: int, chunk: torch.Tensor, their: list[float]) -> None:
        self.chunks[i] = chunk
        self.acc = [a + b for a, b in zip(their, self.extras)]


# ------------------------------------------------------------------ checkpoints (agents.checkpoint)
# The rest of each frame above after the await it is suspended in (``below``), in tail-call form: a loop's
# frame goes on from its state object (the step it was in has done its part), a step's with what it awaited.
@continues(_exchange)
async def _(f: dict[str, Any], value: Any, below: str) -> tuple[torch.Tensor, list[float]]:
    return value if below == "run" else value.payload[:2]


@continues(_Segments.run)
async def _(f: dict[str, Any], value: Any, below: str) -> tuple[torch.Tensor, list[float]]:
    f["self"].k += 1
    return await f["self"].run()


@continues(_Segments.step)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    if below == "recv":  # right is ready for segment k
        f["self"].send()
        return await f["self"].receive()
    return value


@continues(_Segments.receive)
async def _(f: dict[str, Any], m: Any, below: str) -> None:
    f["self"].received(m)


finishes(ring_allreduce)


@continues(_Ring.run)
async def _(f: dict[str, Any], value: Any, below: str) -> tuple[torch.Tensor, list[float], int]:
    f["self"].s += 1
    return await f["self"].run()


@continues(_Ring.step)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    if below == "_exchange":
        return await f["self"].exchanged(f["rs"], f["in_i"], *value)
    return value


@continues(_Ring.exchanged)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    f["self"].reduced(f["i"], value, f["their"])


finishes(gloo_ring_allreduce)


@continues(_GlooRing.run)
async def _(f: dict[str, Any], value: Any, below: str) -> tuple[torch.Tensor, list[float], int]:
    if below == "finish":
        return value
    f["self"].next()
    return await f["self"].run()


@continues(_GlooRing.iteration)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    if below == "wait_data":
        return await f["self"].received(f["j"], *value)
    return value


@continues(_GlooRing.received)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    if below == "compute":
        f["self"].reduced(f["j"], value, f["their"])
        return await f["self"].post()
    return value


@continues(_GlooRing.post)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    f["self"].posts()


@continues(_GlooRing.finish)
async def _(f: dict[str, Any], value: Any, below: str) -> tuple[torch.Tensor, list[float], int]:
    return f["self"].result()


@continues(_GlooPair.wait_data)
async def _(f: dict[str, Any], value: Any, below: str) -> tuple[torch.Tensor, list[float] | None]:
    return await f["self"].wait_data(f["phase"], f["i"])  # (the loop tests its condition again)


@continues(_GlooPair.wait_sent)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    return await f["self"].wait_sent(f["phase"], f["i"])


@continues(_GlooPair.flush)
async def _(f: dict[str, Any], value: Any, below: str) -> None:
    return await f["self"].flush()

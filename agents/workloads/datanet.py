"""Training data on the network: sim4DistrDL's end devices, edge nodes and LRU caches (its §V use case).

With ``data.placement=end_devices`` the samples of a training vworker's shard live on its
end devices — ``data.end_devices`` :class:`DataServer` vworkers per worker, sample ``j``
of the shard on device ``j mod E``. Before each gradient the worker looks its batch up in
its node's LRU cache (``data.cache=lru``, ``data.cache_size`` samples;
:mod:`agents.workloads.cache`), asks each end device for the samples it lacks (a request
costs nothing on the wire), waits for the replies (``data.sample_bytes`` per sample over
the topology, DESIGN §4.1) and caches them. The gradient itself is the real one on the real
samples; what the network adds is the wait, recorded per fetch as a ``data.fetch`` row
(hits, misses, bytes, wait) that the controller sums into metrics.csv, summary.json,
Prometheus and the trace.
"""
from __future__ import annotations

from typing import Any

from agents.checkpoint import continues
from agents.sim.worker import Worker
from agents.workloads.cache import LRUCache

__all__ = ["DataServer", "fetch_batch", "FETCH_KIND", "REQUEST_TAG"]

FETCH_KIND = "data.fetch"
REQUEST_TAG = "data.req"


class DataServer(Worker):
    """An end device: answers every request with the bytes of the samples asked for."""

    def __init__(self, name: str, vid: int, env: Any, serves: str = "", sample_bytes: int = 785):
        super().__init__(name, vid, env)
        self.serves, self.sample_bytes = serves, sample_bytes

    async def run(self) -> None:
        while True:
            self._answer(await self.recv(tag=REQUEST_TAG))

    def _answer(self, m: Any) -> None:
        ids, reply = m.payload
        self.send(m.src, None, nbytes=len(ids) * self.sample_bytes, tag=reply)


class _State:
    __slots__ = ("cache", "position", "seq")

    def __init__(self, capacity: int, shard: Any):
        self.cache = LRUCache(capacity)
        self.position = {int(s): j for j, s in enumerate(shard)}
        self.seq = 0


async def fetch_batch(w: Any) -> tuple[Any, Any]:
    """The next batch of training vworker ``w``, fetched over the network where its cache lacks samples."""
    tr = w.training
    spec = tr.spec
    st = getattr(w, "_datanet", None)
    if st is None:
        capacity = spec.cache_size if spec.cache == "lru" else 0
        st = w._datanet = _State(capacity, tr.shards[tr._rank[w.name]])
    if w._stream is None:
        w._stream = tr.stream(w.name, w.id)
    indices = next(w._stream)
    got = st.cache.lookup(indices)
    t0 = w.now
    nbytes = 0
    if got.misses:
        servers = spec.data_servers[w.name]
        by_server: dict[str, list[int]] = {}
        for s in got.misses:
            by_server.setdefault(servers[st.position[s] % len(servers)], []).append(s)
        st.seq += 1
        reply = f"data.{st.seq}"
        for srv, ids in by_server.items():  # in the order of the batch's first miss on each device
            w.send(srv, (tuple(ids), reply), nbytes=0, tag=REQUEST_TAG)
        nbytes = await _replies(w, reply, len(by_server))
    return _fetched(w, st, indices, got, t0, nbytes)


async def _replies(w: Any, reply: str, left: int, nbytes: int = 0) -> int:
    """The bytes of the ``left`` replies still to come (``nbytes``: of those already in)."""
    while left:
        nbytes += (await w.recv(tag=reply)).nbytes
        left -= 1
    return nbytes


def _fetched(w: Any, st: _State, indices: Any, got: Any, t0: int, nbytes: int) -> tuple[Any, Any]:
    """The batch is in: cache what was missing, record the fetch."""
    if got.misses:
        st.cache.insert(got.misses)
    t1 = w.now
    w.env.recorder.event(w, FETCH_KIND, hits=len(got.hits), misses=len(got.misses), bytes=nbytes, wait_ns=t1 - t0)
    if w.env.tracer is not None and t1 > t0:
        w.env.tracer.compute(w, "data_wait", t0, t1)
    return w.training.batch(indices)


# ------------------------------------------------------------------ checkpoints (agents.checkpoint)
# The rest of each frame above after the await it is suspended in, in tail-call form.
@continues(DataServer.run)
async def _(f: dict[str, Any], m: Any, below: str) -> None:
    f["self"]._answer(m)
    return await f["self"].run()


@continues(fetch_batch)
async def _(f: dict[str, Any], nbytes: int, below: str) -> tuple[Any, Any]:
    return _fetched(f["w"], f["st"], f["indices"], f["got"], f["t0"], nbytes)


@continues(_replies)
async def _(f: dict[str, Any], m: Any, below: str) -> int:
    return await _replies(f["w"], f["reply"], f["left"] - 1, f["nbytes"] + m.nbytes)

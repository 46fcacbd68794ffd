"""Direct windows: the agents carry DESIGN §5's window protocol between themselves.

With ``controller.windows=direct`` the controller starts the run (call ``mesh_run``) and
then only listens: after each window, every agent that ran it sends each other agent one
:class:`~protos.lockstep.v1.mesh_pb2.MeshReport` — the events for that agent, its next
event time and output bound, its stop time, and what it routed to every agent. Each agent
keeps the same view of all agents that the controller's loop keeps
(:func:`controller.clock.run_windows`), so each computes the same ``T``, the same window ends
(:func:`agents.common.windows.ends_from_first`) and the same set of agents that run the next
window; an agent that does not run a window sends nothing for it (everyone knows it is idle).
The windows, hence the events and every output, are the ones the controller would have made —
but a window costs one hop between two agents instead of two hops through the controller, and
no gRPC message (the reports are null messages in the sense of Chandy–Misra–Bryant: each says
how far its sender can be trusted not to act).

Agents on one host talk over Unix-domain sockets (abstract namespace), others over TCP on the
interface that reaches the controller; each connection starts with the acceptor's secret, which
only the controller hands out. Tensors above 64 KiB travel as raw bytes after the report (one copy
into the socket, one out). Rows and counters go to the controller as ``Reached`` frames every
``report_s`` of wall time, with the *frontier* (the start of the next window: no later window has
an event before it), so the controller writes rows in their global order as they become final.
"""
from __future__ import annotations

import hmac
import logging
import secrets
import selectors
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from agents.common import wire
from agents.common.windows import ends_from_first, earliest
from agents.sim.env import Stats
from agents.sim.kernel import RemoteEvent
from agents.sim.types import INFINITY, VirtualTime
from protos.lockstep.v1 import agent_pb2 as pb
from protos.lockstep.v1 import mesh_pb2 as mpb

__all__ = ["MeshError", "MeshListener", "MeshLinks", "MeshLoop", "Progress", "PeerAddress"]

log = logging.getLogger("lockstep.agent")

MAGIC = b"LSM1"
_HELLO = struct.Struct("<4s32si")
_PREFIX = struct.Struct("<II")
_BLOB = struct.Struct("<qq")
_MAX_PROTO = 1 << 30
_MAX_BLOBS = 1 << 20
_MAX_BLOB = 1 << 36
_READ = 1 << 20


class MeshError(RuntimeError):
    """A peer broke the direct-window protocol, or its stream broke."""


@dataclass(frozen=True)
class PeerAddress:
    """Where agent ``agent`` accepts direct-window streams, and the secret it asks for."""

    agent: int
    uds: str  # abstract Unix socket name (without the leading NUL); "" = none
    tcp: str  # HOST:PORT; "" = none
    secret: bytes


# ------------------------------------------------------------- connections
class MeshListener:
    """Accepts the other agents' streams: an abstract Unix socket, and TCP on ``host`` when given."""

    def __init__(self, run_id: str, agent_id: int, host: str | None):
        self.agent_id = agent_id
        self.secret = secrets.token_bytes(32)
        self.uds = f"lockstep-mesh-{agent_id}-{secrets.token_hex(8)}"
        self._uds = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._uds.bind("\0" + self.uds)
        self._uds.listen(64)
        self._tcp: socket.socket | None = None
        self.tcp = ""
        if host:
            fam = socket.AF_INET6 if ":" in host else socket.AF_INET
            self._tcp = socket.create_server((host, 0), family=fam)
            port = self._tcp.getsockname()[1]
            self.tcp = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    def address(self) -> PeerAddress:
        return PeerAddress(self.agent_id, self.uds, self.tcp, self.secret)

    def accept(self, expected: set[int], timeout_s: float) -> dict[int, socket.socket]:
        """Accept one authenticated stream from each agent in ``expected``."""
        socks = [s for s in (self._uds, self._tcp) if s is not None]
        got: dict[int, socket.socket] = {}
        deadline = time.monotonic() + timeout_s
        sel = selectors.DefaultSelector()
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        try:
            while expected - set(got):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MeshError(f"agents {sorted(expected - set(got))} did not open their direct-window "
                                    f"streams within {timeout_s:g} s")
                for key, _ in sel.select(left):
                    conn, peer = key.fileobj.accept()
                    try:
                        conn.settimeout(max(1.0, min(10.0, left)))
                        hello = _recv_exact(conn, _HELLO.size)
                        magic, secret, src = _HELLO.unpack(hello)
                    except (OSError, MeshError) as e:
                        log.warning("direct windows: dropped a connection from %s (%s)", peer, e)
                        conn.close()
                        continue
                    if magic != MAGIC or not hmac.compare_digest(secret, self.secret) or src not in expected \
                            or src in got:
                        log.warning("direct windows: refused a connection from %s (wrong hello or secret)", peer)
                        conn.close()
                        continue
                    got[src] = conn
        finally:
            sel.close()
        return got

    def close(self) -> None:
        for s in (self._uds, self._tcp):
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        b = sock.recv(n - len(out))
        if not b:
            raise MeshError("the stream ended")
        out += b
    return bytes(out)


def connect(me: int, peer: PeerAddress, timeout_s: float) -> socket.socket:
    """Open a stream to ``peer``: its Unix socket when it is on this host, else TCP."""
    errors = []
    if peer.uds:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect("\0" + peer.uds)
        except OSError as e:  # another host (or network namespace): its socket is not visible here
            s.close()
            errors.append(f"unix: {e}")
        else:
            s.sendall(_HELLO.pack(MAGIC, peer.secret, me))
            return s
    if peer.tcp:
        host, _, port = peer.tcp.rpartition(":")
        try:
            s = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.settimeout(None)
            s.sendall(_HELLO.pack(MAGIC, peer.secret, me))
            return s
        except (OSError, ValueError) as e:
            errors.append(f"tcp {peer.tcp}: {e}")
    raise MeshError(f"cannot reach agent {peer.agent} for direct windows ({'; '.join(errors) or 'no address'})")


class _Reader:
    """Reassembles one peer's frames from a non-blocking socket."""

    def __init__(self, agent: int, sock: socket.socket, alloc: Callable[[int], Any] = bytearray):
        self.agent, self.sock, self.alloc = agent, sock, alloc
        self.head = bytearray()
        self.need = _PREFIX.size
        self.phase = 0  # 0: prefix, 1: report + blob table, 2: blob bytes
        self.plen = self.nblobs = 0
        self.report: Any = None
        self.blobs: list[tuple[int, bytearray]] = []
        self.bi = self.got = 0
        self.frames: list[tuple[Any, dict[int, bytearray]]] = []
        self.eof: str | None = None  # why the stream ended (a peer closes it once its last window is sent)

    def pump(self) -> None:
        """Read what the socket has; complete frames go to ``self.frames``; the end sets ``eof``."""
        sock = self.sock
        while self.eof is None:
            try:
                if self.phase < 2:
                    b = sock.recv(min(_READ, self.need - len(self.head)))
                    if not b:
                        self.eof = f"agent {self.agent} closed its direct-window stream" + \
                            (" inside a frame" if self.head else "")
                        return
                    self.head += b
                    if len(self.head) == self.need:
                        self._advance()
                else:
                    _, buf = self.blobs[self.bi]
                    mv = memoryview(buf)
                    k = sock.recv_into(mv[self.got:], min(_READ * 8, len(buf) - self.got))
                    if k == 0:
                        self.eof = f"agent {self.agent} closed its direct-window stream inside a tensor"
                        return
                    self.got += k
                    if self.got == len(buf):
                        self.bi, self.got = self.bi + 1, 0
                        self._blob_done()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionError as e:
                self.eof = f"the direct-window stream of agent {self.agent} broke: {e}"
                return

    def _advance(self) -> None:
        if self.phase == 0:
            self.plen, self.nblobs = _PREFIX.unpack(self.head)
            if self.plen > _MAX_PROTO or self.nblobs > _MAX_BLOBS:
                raise MeshError(f"agent {self.agent} sent a malformed frame ({self.plen} B, {self.nblobs} blobs)")
            self.phase, self.need = 1, _PREFIX.size + self.plen + self.nblobs * _BLOB.size
            if len(self.head) == self.need:
                self._advance()
            return
        off = _PREFIX.size
        try:
            self.report = mpb.MeshReport.FromString(bytes(self.head[off:off + self.plen]))
        except Exception as e:  # noqa: BLE001 - protobuf's DecodeError is a plain Exception
            raise MeshError(f"agent {self.agent} sent a malformed report: {e}") from e
        off += self.plen
        self.blobs = []
        for i in range(self.nblobs):
            bid, n = _BLOB.unpack_from(self.head, off + i * _BLOB.size)
            if not 0 <= n <= _MAX_BLOB:
                raise MeshError(f"agent {self.agent} announced a tensor of {n} bytes")
            self.blobs.append((bid, self.alloc(n)))
        self.bi = self.got = 0
        self.phase = 2
        self._blob_done()

    def _blob_done(self) -> None:
        while self.bi < len(self.blobs) and len(self.blobs[self.bi][1]) == 0:
            self.bi += 1
        if self.bi < len(self.blobs):
            return
        self.frames.append((self.report, dict(self.blobs)))
        self.head, self.need, self.phase, self.report, self.blobs = bytearray(), _PREFIX.size, 0, None, []


class MeshLinks:
    """This agent's streams to every other agent and the exchange of one window's reports."""

    def __init__(self, me: int, socks: dict[int, socket.socket], alloc: Callable[[int], Any] = bytearray):
        """``alloc(n)``: a writable buffer of n bytes for a received tensor (pinned host memory on a GPU
        agent, so the tensor built on it copies to the device asynchronously)."""
        self.me = me
        self.socks = socks
        self.sel = selectors.DefaultSelector()
        self.readers: dict[int, _Reader] = {}
        for a, s in socks.items():
            s.setblocking(False)
            if s.family != socket.AF_UNIX:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.readers[a] = _Reader(a, s, alloc)
            self.sel.register(s, selectors.EVENT_READ, a)
        self._writing: set[int] = set()
        self.closed = False

    @classmethod
    def open(cls, me: int, listener: MeshListener, peers: list[PeerAddress], timeout_s: float,
             alloc: Callable[[int], Any] = bytearray) -> "MeshLinks":
        """Connect to every higher agent, accept every lower one (one stream per pair)."""
        socks = {p.agent: connect(me, p, timeout_s) for p in peers if p.agent > me}
        socks.update(listener.accept({p.agent for p in peers if p.agent < me}, timeout_s))
        return cls(me, socks, alloc)

    def exchange(self, out: dict[int, list], expect: set[int],
                 should_stop: Callable[[], bool] | None = None) -> dict[int, tuple[Any, dict[int, bytearray]]]:
        """Send each ``out[agent]`` (a list of buffers) and take one frame from each agent in ``expect``."""
        pending = {a: [memoryview(b).cast("B") for b in bufs] for a, bufs in out.items() if bufs}
        for a in list(pending):
            if self._send(a, pending[a]):
                del pending[a]
        got: dict[int, tuple[Any, dict[int, bytearray]]] = {}
        for a in expect:
            r = self.readers[a]
            if r.frames:
                got[a] = r.frames.pop(0)
        for a in pending:
            self.sel.modify(self.socks[a], selectors.EVENT_READ | selectors.EVENT_WRITE, a)
        while pending or len(got) < len(expect):
            if self.closed or (should_stop is not None and should_stop()):
                raise MeshError("direct windows stopped")
            for a in expect:
                r = self.readers[a]
                if a not in got and r.eof is not None and not r.frames:
                    raise MeshError(r.eof)
            for key, events in self.sel.select(1.0):
                a = key.data
                if events & selectors.EVENT_READ:
                    r = self.readers[a]
                    r.pump()
                    if a in expect and a not in got and r.frames:
                        got[a] = r.frames.pop(0)
                    if r.eof is not None:
                        self.sel.unregister(self.socks[a])
                        if a in pending or (a in expect and a not in got):
                            raise MeshError(r.eof)
                if events & selectors.EVENT_WRITE and a in pending:
                    if self._send(a, pending[a]):
                        del pending[a]
                        self.sel.modify(self.socks[a], selectors.EVENT_READ, a)
        return got

    def _send(self, a: int, bufs: list[memoryview]) -> bool:
        """Send as much of ``bufs`` as the socket takes now (trimming it); True when all went."""
        s = self.socks[a]
        while bufs:
            try:
                n = s.sendmsg(bufs[:512])
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as e:
                raise MeshError(f"the direct-window stream to agent {a} broke: {e}") from e
            while n and bufs:
                if n >= bufs[0].nbytes:
                    n -= bufs[0].nbytes
                    bufs.pop(0)
                else:
                    bufs[0] = bufs[0][n:]
                    n = 0
        return True

    def close(self) -> None:
        self.closed = True
        for s in self.socks.values():
            try:
                s.close()
            except OSError:
                pass
        try:
            self.sel.close()
        except (OSError, ValueError):
            pass


# ------------------------------------------------------------ the windows
@dataclass
class Progress:
    """What an agent reports to the controller: its rows since the last report and the frontier."""

    windows: int
    frontier: VirtualTime  # the start of the next window: no later event anywhere is earlier
    stop_time: VirtualTime | None
    updates: list = field(default_factory=list)
    evals: list = field(default_factory=list)
    events: list = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    final: bool = False


class MeshLoop:
    """The window loop of DESIGN §5 run by every agent on the same view (see the module docstring)."""

    def __init__(self, core: Any, links: MeshLinks | Any, placement: list[int], n_agents: int,
                 lookahead: VirtualTime, next_times: list[VirtualTime], horizons: list[VirtualTime],
                 report: Callable[[Progress], None], report_s: float = 0.05,
                 should_stop: Callable[[], bool] | None = None):
        self.core, self.links, self.placement, self.n = core, links, placement, n_agents
        self.me = core.agent_id
        self.lookahead = lookahead
        self.next_t, self.bound = list(next_times), list(horizons)
        self.report, self.report_s, self.should_stop = report, report_s, should_stop
        self.writer = wire.FrameWriter(pb.AgentFrame, 1 << 30)  # blob ids; tensors > 64 KiB travel raw
        self.windows = 0
        self.wall_s = 0.0

    def run(self) -> tuple[VirtualTime | None, int]:
        """Run every window to the end of the run; return (stop time, windows)."""
        n, me, L = self.n, self.me, self.lookahead
        inf = INFINITY
        next_t, bound = self.next_t, self.bound
        pend_time, pend_effect, pend_n = [inf] * n, [inf] * n, [0] * n
        inbound: list[RemoteEvent] = []
        stop: VirtualTime | None = None
        acc = Progress(0, 0, None)
        last_report = time.monotonic()
        core = self.core
        while True:
            T = earliest(next_t, pend_time)
            if T >= inf or (stop is not None and T > stop):
                break
            first = [b if e >= b else e for b, e in zip(bound, pend_effect)]
            ends = ends_from_first(T, first, L)
            active = [a for a in range(n) if next_t[a] < ends[a] or pend_n[a]]
            k = self.windows
            out: dict[int, list] = {}
            mine = None
            if me in active:
                r = core.advance(ends[me], inbound, stop, None)
                inbound = []
                mine, out = self._reports(k, r)
                acc.updates.extend(r.updates)
                acc.evals.extend(r.evals)
                acc.events.extend(r.events)
                acc.stats.merge(r.stats)
            got = self.links.exchange(out, {a for a in active if a != me}, self.should_stop) \
                if n > 1 else {}
            pend_time, pend_effect, pend_n = [inf] * n, [inf] * n, [0] * n
            for a in active:
                if a == me:
                    rep, blobs = mine, None
                else:
                    rep, blobs = got[a]
                    if rep.window != k:
                        raise MeshError(f"agent {a} sent its report of window {rep.window} in window {k}")
                    if rep.horizon < rep.next_time:
                        raise MeshError(f"agent {a} reported a horizon {rep.horizon} before its next event "
                                        f"{rep.next_time}")
                    inbound.extend(self._events(a, rep, blobs))
                next_t[a], bound[a] = rep.next_time, rep.horizon
                if rep.HasField("stop_time"):
                    stop = rep.stop_time if stop is None else min(stop, rep.stop_time)
                for ro in rep.routed:
                    c = ro.agent
                    if not 0 <= c < n or c == a or ro.count <= 0 or ro.min_effect < ro.min_time:
                        raise MeshError(f"agent {a} reported a malformed routing entry for agent {c}")
                    pend_n[c] += ro.count
                    if ro.min_time < pend_time[c]:
                        pend_time[c] = ro.min_time
                    if ro.min_effect < pend_effect[c]:
                        pend_effect[c] = ro.min_effect
            self.windows = k + 1
            now = time.monotonic()
            if now - last_report >= self.report_s:
                acc.windows, acc.frontier, acc.stop_time = self.windows, earliest(next_t, pend_time), stop
                self.report(acc)
                acc = Progress(0, 0, None)
                last_report = now
        acc.windows, acc.frontier, acc.stop_time, acc.final = self.windows, earliest(next_t, pend_time), stop, True
        self.report(acc)
        return stop, self.windows

    def _reports(self, k: int, r: Any) -> tuple[Any, dict[int, list]]:
        """This agent's report of window ``k`` (for its own view) and the frames for each peer."""
        n, me, placement = self.n, self.me, self.placement
        by_dst: dict[int, list[RemoteEvent]] = {}
        for ev in r.outbound:
            by_dst.setdefault(placement[ev.dst], []).append(ev)
        base = mpb.MeshReport(window=k, next_time=r.next_time, horizon=r.horizon)
        if r.stop_time is not None:
            base.stop_time = r.stop_time
        for c in sorted(by_dst):
            evs = by_dst[c]
            base.routed.add(agent=c, count=len(evs), min_time=min(e.time for e in evs),
                            min_effect=min(e.acts_at for e in evs))
        out: dict[int, list] = {}
        for a in range(n):
            if a == me:
                continue
            rep = mpb.MeshReport()
            rep.CopyFrom(base)
            blobs = self.writer.blobs()
            for ev in by_dst.get(a, ()):
                wire.encode_event(ev, rep.events.add(), blobs)
            body = rep.SerializeToString()
            table = b"".join(_BLOB.pack(bid, mv.nbytes) for bid, mv in blobs.out)
            out[a] = [_PREFIX.pack(len(body), len(blobs.out)) + body + table, *(mv for _, mv in blobs.out)]
        return base, out

    def _events(self, a: int, rep: Any, blobs: dict[int, bytearray]) -> list[RemoteEvent]:
        placement, me = self.placement, self.me
        n = len(placement)
        out = []
        for e in rep.events:
            try:
                ev = wire.decode_event(e, blobs)
            except wire.WireError as err:
                raise MeshError(f"agent {a} sent a malformed event: {err}") from err
            if not 0 <= ev.dst < n or placement[ev.dst] != me:
                raise MeshError(f"agent {a} sent an event for vworker {ev.dst}, which this agent does not host")
            if not 0 <= ev.origin < n or placement[ev.origin] != a:
                raise MeshError(f"agent {a} sent an event from vworker {ev.origin}, which it does not host")
            out.append(ev)
        return out


def host_buffer(core: Any) -> Callable[[int], Any]:
    """Where received tensor bytes go: pinned host memory when the agent computes on a GPU."""
    training = getattr(core, "training", None)
    if training is None or training.device.type != "cuda":
        return bytearray
    import torch

    return lambda n: torch.empty(n, dtype=torch.uint8, pin_memory=True).numpy()


# ---------------------------------------------------------- the agent side
class MeshSession:
    """An agent's side of direct windows: the calls ``mesh_open`` and ``mesh_run`` (agents/agent.py).

    ``mesh_open`` starts listening and answers ``(uds, tcp, secret)``. ``mesh_run(peers, next_times,
    horizons, report_s)`` connects to the other agents and runs the windows on a thread of its own,
    while the agent's event loop writes its progress (``Reached`` frames, in order) and, at the end,
    the call's ``Reply`` ``(stop time or None, windows)``.
    """

    def __init__(self, core: Any, run_id: str, tcp_host: str | None, writer: Any):
        self.core, self.run_id, self.tcp_host, self.writer = core, run_id, tcp_host, writer
        self.listener: MeshListener | None = None
        self.links: MeshLinks | None = None
        self._stopping = False

    def open(self) -> tuple[str, str, bytes]:
        if self.listener is None:
            self.listener = MeshListener(self.run_id, self.core.agent_id, self.tcp_host)
        a = self.listener.address()
        return a.uds, a.tcp, a.secret

    def stop(self) -> None:
        """The run is being shut down: unblock the window thread."""
        self._stopping = True
        if self.links is not None:
            self.links.close()

    def _progress_frame(self, p: Progress) -> list:
        f = pb.AgentFrame()
        r = f.reached
        r.window, r.next_time, r.horizon = p.windows, p.frontier, p.frontier
        if p.stop_time is not None:
            r.stop_time = p.stop_time
        blobs = self.writer.blobs()
        wire.encode_value(p.updates, r.updates, blobs)
        wire.encode_value(p.evals, r.evals, blobs)
        wire.encode_value(p.events, r.events, blobs)
        wire.encode_stats(p.stats, r.stats)
        return list(self.writer.frames(f, blobs))

    async def run(self, call_id: int, args: tuple, write: Callable[[Any], Any], timeout_s: float = 60.0) -> None:
        """Run the windows (``mesh_run``); every frame goes out through ``write``, in order."""
        import asyncio

        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def post(frames: list) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, frames)

        def work() -> tuple[VirtualTime | None, int]:
            peers_raw, next_times, horizons, report_s = args
            peers = [PeerAddress(int(a), str(u), str(t), bytes(s)) for a, u, t, s in peers_raw]
            core, plan = self.core, self.core.plan
            if self.listener is None:
                raise MeshError("mesh_run before mesh_open")
            self.links = MeshLinks.open(core.agent_id, self.listener,
                                        [p for p in peers if p.agent != core.agent_id], timeout_s, host_buffer(core))
            if self._stopping:
                raise MeshError("direct windows stopped")
            loop_ = MeshLoop(core, self.links, plan.placement, plan.n_agents, plan.lookahead(), list(next_times),
                             list(horizons), lambda p: post(self._progress_frame(p)), float(report_s),
                             should_stop=lambda: self._stopping)
            return loop_.run()

        done = loop.run_in_executor(None, work)
        while True:
            getter = asyncio.ensure_future(queue.get())
            finished, _ = await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
            if getter in finished:
                for fr in getter.result():
                    await write(fr)
                continue
            getter.cancel()
            while not queue.empty():
                for fr in queue.get_nowait():
                    await write(fr)
            break
        try:
            stop, windows = done.result()
        except Exception as e:  # noqa: BLE001 - reported to the controller as this agent's failure
            if self.links is not None:
                self.links.close()
            f = pb.AgentFrame()
            f.failure.error = f"direct windows: {type(e).__name__}: {e}"
            log.error("direct windows failed: %s", e, exc_info=not isinstance(e, MeshError))
            await write(f)
            return
        self.links.close()
        f = pb.AgentFrame()
        f.reply.id = call_id
        wire.encode_value((stop, windows), f.reply.value)
        await write(f)

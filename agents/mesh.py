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
interface that reaches the controller. Each connection starts with a hello that carries the key
the controller derived for that pair, ``pair_key(acceptor's secret, connector, acceptor)``
(agents/direct.py), so no agent can speak for another; hellos are read by the accepting thread for
all connections at once, each within ``HELLO_TIMEOUT_S`` and at most ``MAX_UNAUTHENTICATED`` at a
time, so strangers cannot hold up the start (docs/security.md). With ``controller.tls`` every
stream speaks mutual TLS with the run's certificates. Tensors above 64 KiB travel as raw bytes
after the report (one copy into the socket, one out); every size a peer announces is checked
against the plan's limits (``controller.max_blob_bytes``, ``max_held_bytes``) before anything is
allocated, and a peer that runs ahead is held back by the stream's own flow control once what it
sent and nobody used reaches ``max_held_bytes``. Rows and counters go to the controller as ``Reached`` frames every
``report_s`` of wall time, with the *frontier* (the start of the next window: no later window has
an event before it), so the controller writes rows in their global order as they become final.
"""
from __future__ import annotations

import hmac
import logging
import secrets
import selectors
import socket
import ssl
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from agents.common import wire
from agents.common.wire import Limits
from agents.direct import Pending, admit, pair_key
from agents.common.windows import ends_from_first, earliest
from agents.sim.env import Stats
from agents.sim.kernel import RemoteEvent
from agents.sim.types import INFINITY, VirtualTime
from protos.lockstep.v1 import agent_pb2 as pb
from protos.lockstep.v1 import mesh_pb2 as mpb

__all__ = ["MeshError", "MeshListener", "MeshLinks", "MeshLoop", "Progress", "PeerAddress"]

log = logging.getLogger("lockstep.agent")

MAGIC = b"LSM2"
_HELLO = struct.Struct("<4s32si")  # magic, pair key, connecting agent
_PREFIX = struct.Struct("<II")
_BLOB = struct.Struct("<qq")
_READ = 1 << 20
_CHUNK = 64 << 10  # a read of reports (several small frames at a time)
_TLS_WRITE = 256 << 10  # TLS has no sendmsg: buffers go out in slices of this size
HELLO_TIMEOUT_S = 5.0  # from connecting to a complete hello (and TLS handshake), however slowly bytes come
MAX_QUEUED_FRAMES = 1024  # frames of one peer received and not yet used: beyond, its stream is not read


class MeshError(RuntimeError):
    """A peer broke the direct-window protocol, or its stream broke."""


@dataclass(frozen=True)
class PeerAddress:
    """Where agent ``agent`` accepts direct-window streams, and the key this agent presents to it."""

    agent: int
    uds: str  # abstract Unix socket name (without the leading NUL); "" = none
    tcp: str  # HOST:PORT; "" = none
    key: bytes  # pair_key(its secret, this agent, it); only the controller knows the secrets


# ------------------------------------------------------------- connections
class MeshListener:
    """Accepts the other agents' streams: an abstract Unix socket, and TCP on ``host`` when given.

    ``server_ssl``: with ``controller.tls``, every accepted stream (Unix or TCP) must complete a TLS
    handshake with a certificate signed by the run's CA before its hello is read.
    """

    def __init__(self, run_id: str, agent_id: int, host: str | None, server_ssl: ssl.SSLContext | None = None):
        self.agent_id = agent_id
        self.secret = secrets.token_bytes(32)
        self.ssl = server_ssl
        self.refused: Counter = Counter()  # why connections were turned away (counts only: bounded)
        self._logged_at = 0.0
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

    def secret_address(self) -> tuple[str, str, bytes]:
        """What ``mesh_open`` answers: the addresses and the secret the controller derives keys from."""
        return self.uds, self.tcp, self.secret

    def _refuse(self, p: Pending, why: str) -> None:
        self.refused[why] += 1
        now = time.monotonic()
        if now - self._logged_at >= 1.0:
            log.warning("direct windows: refused a connection from %s: %s (%d refused so far)", p.peer or "a local "
                        "process", why, sum(self.refused.values()))
            self._logged_at = now
        try:
            p.conn.close()
        except OSError:
            pass

    def accept(self, expected: set[int], timeout_s: float) -> dict[int, socket.socket]:
        """Accept one authenticated stream from each agent in ``expected``.

        One selector reads every pending hello (no blocking read, no thread per connection), so a
        stranger who connects and sends nothing costs a slot for ``HELLO_TIMEOUT_S`` at most.
        """
        socks = [s for s in (self._uds, self._tcp) if s is not None]
        got: dict[int, socket.socket] = {}
        pending: dict[socket.socket, Pending] = {}  # insertion order = age
        deadline = time.monotonic() + timeout_s
        sel = selectors.DefaultSelector()
        for s in socks:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ, None)
        try:
            while expected - set(got):
                now = time.monotonic()
                if now >= deadline:
                    raise MeshError(f"agents {sorted(expected - set(got))} did not open their direct-window "
                                    f"streams within {timeout_s:g} s")
                for p in [p for p in pending.values() if p.deadline <= now]:
                    sel.unregister(p.conn)
                    del pending[p.conn]
                    self._refuse(p, f"no hello within {HELLO_TIMEOUT_S:g} s")
                wait = min([p.deadline for p in pending.values()] + [deadline]) - now
                for key, _ in sel.select(max(0.0, min(wait, 0.5))):
                    if key.data is None:
                        self._take_connections(key.fileobj, sel, pending)
                        continue
                    p = key.data
                    done = self._progress(p)
                    if done is None:
                        continue
                    sel.unregister(p.conn)
                    del pending[p.conn]
                    if isinstance(done, str):
                        self._refuse(p, done)
                        continue
                    if done not in expected or done in got:
                        self._refuse(p, f"agent {done} is not expected here or already connected")
                        continue
                    p.conn.setblocking(True)
                    got[done] = p.conn
        except BaseException:
            for c in got.values():
                c.close()
            raise
        finally:
            for p in pending.values():
                p.conn.close()
            sel.close()
        return got

    def _take_connections(self, lsock: Any, sel: selectors.BaseSelector, pending: dict) -> None:
        while True:
            try:
                conn, peer = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:  # e.g. too many open files: this connection is lost, the others wait
                log.warning("direct windows: accept failed: %s", e)
                return
            admit(conn, peer, self.ssl, sel, pending, self._refuse, HELLO_TIMEOUT_S)

    def _progress(self, p: Pending) -> int | str | None:
        """Read what ``p`` sent: None (more to come), the agent its hello proves, or why it is refused."""
        try:
            if not p.handshaken:
                p.conn.do_handshake()
                p.handshaken = True
            data = p.conn.recv(_HELLO.size - len(p.hello))
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError):
            return None
        except (OSError, ssl.SSLError) as e:
            return f"TLS or socket error before the hello: {e}"
        if not data:
            return "closed before its hello"
        p.hello += data
        if len(p.hello) < _HELLO.size:
            return None
        magic, key, src = _HELLO.unpack(bytes(p.hello))
        if magic != MAGIC or src == self.agent_id or not hmac.compare_digest(
                key, pair_key(self.secret, src, self.agent_id)):
            return "wrong hello or key"
        return src

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


def connect(me: int, peer: PeerAddress, timeout_s: float, client_ssl: ssl.SSLContext | None = None) -> socket.socket:
    """Open a stream to ``peer``: its Unix socket when it is on this host, else TCP; TLS with ``client_ssl``."""
    errors = []

    def hello(s: socket.socket) -> socket.socket:
        if client_ssl is not None:
            s.settimeout(max(1.0, min(timeout_s, HELLO_TIMEOUT_S)))
            s = client_ssl.wrap_socket(s, server_side=False)
        s.settimeout(None)
        s.sendall(_HELLO.pack(MAGIC, peer.key, me))
        return s

    if peer.uds:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect("\0" + peer.uds)
        except OSError as e:  # another host (or network namespace): its socket is not visible here
            s.close()
            errors.append(f"unix: {e}")
        else:
            try:
                return hello(s)
            except (OSError, ssl.SSLError) as e:
                s.close()
                errors.append(f"unix: {e}")
    if peer.tcp:
        host, _, port = peer.tcp.rpartition(":")
        try:
            s = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return hello(s)
        except (OSError, ValueError, ssl.SSLError) as e:
            errors.append(f"tcp {peer.tcp}: {e}")
    raise MeshError(f"cannot reach agent {peer.agent} for direct windows ({'; '.join(errors) or 'no address'})")


class _Reader:
    """Reassembles one peer's frames from a non-blocking socket (plain or TLS).

    Every size the peer announces is checked against ``limits`` before its buffer is allocated;
    frames received and not yet used count against ``limits.max_pending_bytes`` (and
    ``MAX_QUEUED_FRAMES``): past that, :meth:`full` is true and the stream is not read until
    frames are taken, so the peer waits on its own socket instead of filling this agent's memory.

    Small frames (a window's report) are read ``_CHUNK`` bytes at a time, several to a read; a
    tensor's bytes beyond what came with its report go straight into the tensor's buffer. A read
    that does not fill the chunk has emptied the socket, so a plain stream is not asked again
    (the selector says when more comes; a TLS stream may hold decrypted bytes it cannot see).
    """

    def __init__(self, agent: int, sock: socket.socket, alloc: Callable[[int], Any] = bytearray,
                 limits: Limits | None = None):
        self.agent, self.sock, self.alloc = agent, sock, alloc
        self.limits = limits or Limits()
        self.tls = isinstance(sock, ssl.SSLSocket)
        self.chunk = bytearray(_CHUNK)
        self.chunk_view = memoryview(self.chunk)
        self.head = bytearray()  # received bytes of frames not yet parsed
        self.report: Any = None
        self.blobs: list[tuple[int, Any]] = []  # the tensors of the frame being received
        self.bi = self.got = 0  # the tensor being filled, and how many of its bytes are in
        self.frames: list[tuple[Any, dict[int, Any]]] = []
        self.frame_bytes: list[int] = []  # what each queued frame holds
        self.held = 0  # bytes of the queued frames and of the frame being received
        self.frame_total = 0
        self.eof: str | None = None  # why the stream ended (a peer closes it once its last window is sent)

    def full(self) -> bool:
        return len(self.frames) >= MAX_QUEUED_FRAMES or (bool(self.frames) and self.held >= self.limits.max_pending_bytes)

    def take(self) -> tuple[Any, dict[int, Any]]:
        """The oldest complete frame (there must be one)."""
        self.held -= self.frame_bytes.pop(0)
        return self.frames.pop(0)

    def pump(self) -> None:
        """Read what the socket has; complete frames go to ``self.frames``; the end sets ``eof``."""
        sock = self.sock
        self._parse()
        while self.eof is None and not self.full():
            try:
                if self.blobs:  # a tensor's bytes, straight into its buffer
                    mv = memoryview(self.blobs[self.bi][1]).cast("B")
                    k = sock.recv_into(mv[self.got:], min(_READ * 8, len(mv) - self.got))
                    if k == 0:
                        self.eof = f"agent {self.agent} closed its direct-window stream inside a tensor"
                        return
                    self.got += k
                    if self.got == len(mv):
                        self.bi, self.got = self.bi + 1, 0
                        self._blob_done()
                        self._parse()
                    continue
                k = sock.recv_into(self.chunk_view, _CHUNK)
                if not k:
                    self.eof = f"agent {self.agent} closed its direct-window stream" + \
                        (" inside a frame" if self.head else "")
                    return
                self.head += self.chunk_view[:k]
                self._parse()
                if k < _CHUNK and not self.tls and not self.blobs:
                    return
            except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except OSError as e:  # a reset, a TLS error (ssl.SSLError is an OSError)
                self.eof = f"the direct-window stream of agent {self.agent} broke: {e}"
                return

    def _parse(self) -> None:
        """Take every complete frame out of ``head`` (and the start of a frame's tensors)."""
        head, lim = self.head, self.limits
        while not self.blobs and len(head) >= _PREFIX.size and not self.full():
            plen, nblobs = _PREFIX.unpack_from(head)
            if plen > lim.max_pending_bytes or nblobs > lim.max_pending_blobs:
                raise MeshError(f"agent {self.agent} sent a malformed frame ({plen} B, {nblobs} blobs; "
                                f"at most {lim.max_pending_bytes} B and {lim.max_pending_blobs} blobs accepted)")
            off = _PREFIX.size
            need = off + plen + nblobs * _BLOB.size
            if len(head) < need:
                return
            try:
                report = mpb.MeshReport.FromString(bytes(head[off:off + plen]))
            except Exception as e:  # noqa: BLE001 - protobuf's DecodeError is a plain Exception
                raise MeshError(f"agent {self.agent} sent a malformed report: {e}") from e
            off += plen
            table = [_BLOB.unpack_from(head, off + i * _BLOB.size) for i in range(nblobs)]
            total = plen
            for bid, n in table:  # every size checked before the first buffer exists
                if not 0 <= n <= lim.max_blob_bytes:
                    raise MeshError(f"agent {self.agent} announced a tensor of {n} bytes; at most {lim.max_blob_bytes} "
                                    "accepted (controller.max_blob_bytes)")
                total += n
            if total > lim.max_pending_bytes:
                raise MeshError(f"agent {self.agent} announced {total} bytes in one frame; at most "
                                f"{lim.max_pending_bytes} accepted (controller.max_held_bytes)")
            if len({bid for bid, _ in table}) != len(table):
                raise MeshError(f"agent {self.agent} sent a frame that names one tensor id twice")
            del head[:need]
            self.held += total
            self.report, self.frame_total = report, total
            self.blobs = [(bid, self.alloc(n)) for bid, n in table]
            self.bi = self.got = 0
            while head and self.bi < len(self.blobs):  # tensor bytes that came in the same read
                mv = memoryview(self.blobs[self.bi][1]).cast("B")
                k = min(len(head), len(mv) - self.got)
                mv[self.got:self.got + k] = head[:k]
                del head[:k]
                self.got += k
                if self.got == len(mv):
                    self.bi, self.got = self.bi + 1, 0
            self._blob_done()

    def _blob_done(self) -> None:
        while self.bi < len(self.blobs) and len(memoryview(self.blobs[self.bi][1]).cast("B")) == 0:
            self.bi += 1
        if self.bi < len(self.blobs):
            return
        self.frames.append((self.report, dict(self.blobs)))
        self.frame_bytes.append(self.frame_total)
        self.report, self.blobs = None, []


class MeshLinks:
    """This agent's streams to every other agent and the exchange of one window's reports."""

    def __init__(self, me: int, socks: dict[int, socket.socket], alloc: Callable[[int], Any] = bytearray,
                 limits: Limits | None = None):
        """``alloc(n)``: a writable buffer of n bytes for a received tensor (pinned host memory on a GPU
        agent, so the tensor built on it copies to the device asynchronously)."""
        self.me = me
        self.socks = socks
        self.sel = selectors.DefaultSelector()
        self.readers: dict[int, _Reader] = {}
        self._events: dict[int, int] = {}  # what the selector watches on each stream (0: not registered)
        for a, s in socks.items():
            s.setblocking(False)
            if s.family != socket.AF_UNIX:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.readers[a] = _Reader(a, s, alloc, limits)
            self._events[a] = 0
            self._watch(a, selectors.EVENT_READ)
        self._writing: set[int] = set()
        self.closed = False

    def _watch(self, a: int, events: int) -> None:
        """Watch stream ``a`` for ``events`` (0: not at all)."""
        was = self._events[a]
        if events == was:
            return
        s = self.socks[a]
        if not was:
            self.sel.register(s, events, a)
        elif not events:
            self.sel.unregister(s)
        else:
            self.sel.modify(s, events, a)
        self._events[a] = events

    def _want(self, a: int, pending: dict) -> int:
        r = self.readers[a]
        read = selectors.EVENT_READ if r.eof is None and not r.full() else 0
        return read | (selectors.EVENT_WRITE if a in pending else 0)

    def _take(self, a: int, pending: dict) -> tuple[Any, dict[int, Any]]:
        r = self.readers[a]
        was_full = r.full()
        frame = r.take()
        if was_full and not r.full():
            r.pump()  # TLS may hold decrypted bytes the selector cannot see
            self._watch(a, self._want(a, pending))
        return frame

    @classmethod
    def open(cls, me: int, listener: MeshListener, peers: list[PeerAddress], timeout_s: float,
             alloc: Callable[[int], Any] = bytearray, client_ssl: ssl.SSLContext | None = None,
             limits: Limits | None = None) -> "MeshLinks":
        """Connect to every higher agent, accept every lower one (one stream per pair)."""
        socks: dict[int, socket.socket] = {}
        try:
            for p in peers:
                if p.agent > me:
                    socks[p.agent] = connect(me, p, timeout_s, client_ssl)
            socks.update(listener.accept({p.agent for p in peers if p.agent < me}, timeout_s))
        except BaseException:
            for s in socks.values():
                s.close()
            raise
        finally:
            listener.close()  # every stream is open: nobody else may connect
        return cls(me, socks, alloc, limits)

    def exchange(self, out: dict[int, list], expect: set[int],
                 should_stop: Callable[[], bool] | None = None) -> dict[int, tuple[Any, dict[int, Any]]]:
        """Send each ``out[agent]`` (a list of buffers) and take one frame from each agent in ``expect``."""
        pending = {a: [memoryview(b).cast("B") for b in bufs] for a, bufs in out.items() if bufs}
        for a in list(pending):
            if self._send(a, pending[a]):
                del pending[a]
        got: dict[int, tuple[Any, dict[int, Any]]] = {}
        for a in expect:
            if self.readers[a].frames:
                got[a] = self._take(a, pending)
        for a in pending:
            self._watch(a, self._want(a, pending))
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
                        got[a] = self._take(a, pending)
                    if r.eof is not None and (a in pending or (a in expect and a not in got and not r.frames)):
                        raise MeshError(r.eof)
                if events & selectors.EVENT_WRITE and a in pending:
                    if self._send(a, pending[a]):
                        del pending[a]
                self._watch(a, self._want(a, pending))
        return got

    def _send(self, a: int, bufs: list[memoryview]) -> bool:
        """Send as much of ``bufs`` as the socket takes now (trimming it); True when all went."""
        s = self.socks[a]
        tls = isinstance(s, ssl.SSLSocket)
        while bufs:
            try:
                # TLS has no sendmsg; a slice retried after a would-block is the same slice
                n = s.send(bufs[0][:_TLS_WRITE]) if tls else s.sendmsg(bufs[:512])
            except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
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
            while bufs and bufs[0].nbytes == 0:
                bufs.pop(0)
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
        self.cpu_s = 0.0  # CPU seconds of the thread that ran :meth:`run` (summary.json wall_cpu_s.window_loops)
        # the loop's view between two windows (what a checkpoint saves besides the core: VIEW_FIELDS)
        inf = INFINITY
        self.pend_time, self.pend_effect, self.pend_n = [inf] * n_agents, [inf] * n_agents, [0] * n_agents
        self.inbound: list[RemoteEvent] = []
        self.stop: VirtualTime | None = None
        # checkpoints (docs/recovery.md): the controller asks for window K; at the top of the loop with
        # windows == K this agent reports its rows, then hands its view to on_checkpoint
        self.on_checkpoint: Callable[[int, int, dict | None, str], None] | None = None
        self._ck_lock = threading.Lock()
        self._ck_request: tuple[int, int] | None = None  # (call id, window K)
        self._finished = False

    def view(self) -> dict[str, Any]:
        """What :meth:`run` keeps between two windows, for a checkpoint (restored by :meth:`set_view`)."""
        return {"windows": self.windows, "next_t": list(self.next_t), "bound": list(self.bound),
                "pend_time": list(self.pend_time), "pend_effect": list(self.pend_effect),
                "pend_n": list(self.pend_n), "inbound": list(self.inbound), "stop": self.stop}

    def set_view(self, view: dict[str, Any]) -> None:
        """Start from a checkpoint's view instead of the first window."""
        n = self.n
        for k in ("next_t", "bound", "pend_time", "pend_effect", "pend_n"):
            if len(view[k]) != n:
                raise MeshError(f"the checkpoint's view has {len(view[k])} agents in {k}, not {n}")
        self.windows = int(view["windows"])
        self.next_t, self.bound = list(view["next_t"]), list(view["bound"])
        self.pend_time, self.pend_effect, self.pend_n = (list(view["pend_time"]), list(view["pend_effect"]),
                                                         list(view["pend_n"]))
        self.inbound, self.stop = list(view["inbound"]), view["stop"]

    def request_checkpoint(self, call_id: int, window: int) -> bool:
        """Ask for a checkpoint at the top of window ``window`` (any thread); False when the loop is over."""
        with self._ck_lock:
            if self._finished:
                return False
            self._ck_request = (call_id, window)
            return True

    def _checkpoint_due(self, acc: "Progress", ending: bool) -> "Progress":
        """At the top of the loop: answer a checkpoint request that is due (or can no longer be met)."""
        with self._ck_lock:
            req = self._ck_request
            if req is None or (not ending and self.windows < req[1]):
                return acc
            self._ck_request = None
        call_id, k = req
        if self.on_checkpoint is None:
            return acc
        if ending and self.windows <= k:
            self.on_checkpoint(call_id, k, None, "ended")
        elif self.windows > k:
            self.on_checkpoint(call_id, k, None, "missed")
        else:  # every row of the windows before K goes to the controller first, then the checkpoint
            acc.windows, acc.frontier, acc.stop_time = self.windows, earliest(self.next_t, self.pend_time), self.stop
            self.report(acc)
            acc = Progress(0, 0, None)
            self.on_checkpoint(call_id, k, self.view(), "")
        return acc

    def run(self) -> tuple[VirtualTime | None, int]:
        """Run every window to the end of the run; return (stop time, windows)."""
        cpu0 = time.thread_time()
        n, me, L = self.n, self.me, self.lookahead
        inf = INFINITY
        next_t, bound = self.next_t, self.bound
        pend_time, pend_effect, pend_n = self.pend_time, self.pend_effect, self.pend_n
        inbound: list[RemoteEvent] = self.inbound
        stop: VirtualTime | None = self.stop
        acc = Progress(0, 0, None)
        last_report = time.monotonic()
        core = self.core
        while True:
            if self._ck_request is not None:
                self.pend_time, self.pend_effect, self.pend_n, self.inbound, self.stop = \
                    pend_time, pend_effect, pend_n, inbound, stop
                acc = self._checkpoint_due(acc, False)
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
        self.pend_time, self.pend_effect, self.pend_n, self.inbound, self.stop = \
            pend_time, pend_effect, pend_n, inbound, stop
        with self._ck_lock:
            self._finished = True
        acc = self._checkpoint_due(acc, True)
        acc.windows, acc.frontier, acc.stop_time, acc.final = self.windows, earliest(next_t, pend_time), stop, True
        self.cpu_s = time.thread_time() - cpu0
        self.report(acc)
        return stop, self.windows

    def _reports(self, k: int, r: Any) -> tuple[Any, dict[int, list]]:
        """This agent's report of window ``k`` (for its own view) and the frames for each peer.

        The part every peer gets is serialized once; a peer's events follow it as a second message
        with only ``events`` set, which protobuf reads as one report (fields of concatenated messages
        merge; repeated ones append)."""
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
        common = base.SerializeToString()
        alone = _PREFIX.pack(len(common), 0) + common
        out: dict[int, list] = {}
        for a in range(n):
            if a == me:
                continue
            evs = by_dst.get(a)
            if not evs:
                out[a] = [alone]
                continue
            rep = mpb.MeshReport()
            blobs = self.writer.blobs()
            for ev in evs:
                wire.encode_event(ev, rep.events.add(), blobs)
            body = common + rep.SerializeToString()
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

    def __init__(self, core: Any, run_id: str, tcp_host: str | None, writer: Any,
                 server_ssl: ssl.SSLContext | None = None, client_ssl: ssl.SSLContext | None = None):
        """``server_ssl``/``client_ssl``: with ``controller.tls``, the contexts every stream uses
        (agents/common/trust.py), both ways, Unix sockets included."""
        self.core, self.run_id, self.tcp_host, self.writer = core, run_id, tcp_host, writer
        self.server_ssl, self.client_ssl = server_ssl, client_ssl
        self.listener: MeshListener | None = None
        self.links: MeshLinks | None = None
        self._stopping = False
        self.view: dict[str, Any] | None = None  # a restored checkpoint's loop view (agents/agent.py, "restore")
        self._loop: MeshLoop | None = None
        self._lock = threading.Lock()
        self._early: tuple[int, int] | None = None  # a checkpoint asked for before the loop was built
        self._over = False
        self._post: Callable[[Iterable[Any]], None] | None = None

    def open(self) -> tuple[str, str, bytes]:
        if self.listener is None:
            self.listener = MeshListener(self.run_id, self.core.agent_id, self.tcp_host, self.server_ssl)
        return self.listener.secret_address()

    def stop(self) -> None:
        """The run is being shut down: unblock the window thread."""
        self._stopping = True
        if self.links is not None:
            self.links.close()

    def checkpoint(self, call_id: int, window: int) -> bool:
        """The controller asks for a checkpoint at window ``window`` (call ``checkpoint``, from the event loop).

        Answered later, in order with the progress frames, by :meth:`_on_checkpoint`; False when the windows
        are over (the caller answers ``ended`` itself)."""
        with self._lock:
            if self._over:
                return False
            if self._loop is None:
                self._early = (call_id, window)
                return True
            return self._loop.request_checkpoint(call_id, window)

    def _on_checkpoint(self, call_id: int, window: int, view: dict | None, status: str) -> None:
        """On the window thread, at the top of window ``window`` (or when it can no longer come)."""
        post = self._post
        if view is None:
            post(checkpoint_reply(self.writer, call_id, status, window))
            return
        from agents.checkpoint import NotCheckpointable, snapshot

        try:
            core = snapshot(self.core)
            blob = pack_checkpoint(window, view, core)
        except NotCheckpointable as e:
            permanent = bool(getattr(e, "permanent", False))
            post(checkpoint_reply(self.writer, call_id, "refused_permanent" if permanent else "refused", window,
                                  reason=str(e)))
            return
        except Exception as e:  # noqa: BLE001 - a checkpoint that cannot be taken must not stop the run
            log.warning("checkpoint of window %d failed: %s: %s", window, type(e).__name__, e, exc_info=True)
            post(checkpoint_reply(self.writer, call_id, "refused", window, reason=f"{type(e).__name__}: {e}"))
            return
        log.info("checkpoint of window %d: %d bytes", window, len(blob))
        post(checkpoint_reply(self.writer, call_id, "ok", window, blob=blob))

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

        def post(frames: Iterable[Any]) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, frames)

        self._post = post

        def work() -> tuple[VirtualTime | None, int]:
            peers_raw, next_times, horizons, report_s = args[:4]
            resume = bool(args[4]) if len(args) > 4 else False  # start from the restored checkpoint's view
            peers = [PeerAddress(int(a), str(u), str(t), bytes(s)) for a, u, t, s in peers_raw]
            core, plan = self.core, self.core.plan
            if self.listener is None:
                raise MeshError("mesh_run before mesh_open")
            self.links = MeshLinks.open(core.agent_id, self.listener,
                                        [p for p in peers if p.agent != core.agent_id], timeout_s, host_buffer(core),
                                        self.client_ssl, plan.limits)
            log.info("direct windows: streams to agents %s open%s", sorted(self.links.socks),
                     " (mutual TLS)" if self.client_ssl is not None else "")
            if self._stopping:
                raise MeshError("direct windows stopped")
            loop_ = MeshLoop(core, self.links, plan.placement, plan.n_agents, plan.lookahead(), list(next_times),
                             list(horizons), lambda p: post(self._progress_frame(p)), float(report_s),
                             should_stop=lambda: self._stopping)
            if resume:
                if self.view is None:
                    raise MeshError("mesh_run from a checkpoint, but no checkpoint was restored")
                loop_.set_view(self.view)
                self.view = None
            loop_.on_checkpoint = self._on_checkpoint
            with self._lock:
                self._loop = loop_
                early, self._early = self._early, None
            if early is not None and not loop_.request_checkpoint(*early):
                self._on_checkpoint(early[0], early[1], None, "ended")
            try:
                out = loop_.run()
                core.window_cpu_s = loop_.cpu_s  # before the reply: the controller asks for info after it
                return out
            finally:
                with self._lock:
                    self._over = True
                    early, self._early = self._early, None
                if early is not None:
                    self._on_checkpoint(early[0], early[1], None, "ended")

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


# ------------------------------------------------------------- checkpoints
CHECKPOINT_FORMAT = 2


def pack_checkpoint(window: int, view: dict[str, Any], core: Any) -> Any:
    """One agent's checkpoint: the loop's view at the top of ``window`` and its core's snapshot (a
    :class:`~agents.common.files.Blob`), as a Blob: a small head (:func:`~agents.common.files.headed`) and the
    core's pieces, not copied."""
    from agents.common.files import Blob, headed

    pieces = core.pieces if isinstance(core, Blob) else [core]
    return headed({"format": CHECKPOINT_FORMAT, "window": window, "view": view, "core": len(core)}, pieces,
                  live=getattr(core, "live", False))


def unpack_checkpoint(blob: Any) -> dict[str, Any]:
    """The inverse of :func:`pack_checkpoint` (the core: a view of ``blob``'s bytes, not a copy). Only for
    bytes from this agent's authenticated controller, which read them from its run directory
    (docs/security.md: a checkpoint is trusted like config.yaml)."""
    from agents.common.files import read_headed

    try:
        d, core = read_headed(blob)
    except ValueError:
        d = core = None
    if not isinstance(d, dict) or d.get("format") != CHECKPOINT_FORMAT or d.get("core") != core.nbytes:
        raise ValueError(f"not a lockstep agent checkpoint of format {CHECKPOINT_FORMAT}")
    d["core"] = core
    return d


def taken_checkpoint(taking: Any) -> dict[str, Any]:
    """What :func:`unpack_checkpoint` gives, from a :class:`agents.checkpoint.Taking` that took the pieces (the
    core: the Taking itself, for ``agents.checkpoint.restore(..., taken=)``)."""
    d = dict(taking.outer or {})
    if d.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"not a lockstep agent checkpoint of format {CHECKPOINT_FORMAT}")
    d["core"] = taking
    return d


def piece_bytes(writer: Any) -> int:
    """Checkpoint bytes per frame: whole frames below the message limit, so none becomes an envelope blob."""
    return max(1024, min(4 << 20, writer.max_message_bytes // 2))


def checkpoint_reply(writer: Any, call_id: int, status: str, window: int, blob: Any = b"",
                     reason: str = "") -> Iterator[Any]:
    """The reply frames to call ``checkpoint``: ``(status, window, part, parts, bytes or reason)`` each.

    ``status``: ok (the checkpoint, in ``parts`` frames), missed (this agent was past ``window`` when asked),
    ended (the windows ended before it), refused / refused_permanent (NotCheckpointable: its sentence).

    The frames are made as they are taken, so an agent holds one piece's frame at a time beside the checkpoint,
    not a second copy of all of it (a 10 000-vworker agent's is GBs), and the window thread that posts them does
    not make them. A piece's frame is its serialized bytes (:func:`~agents.common.wire.reply_bytes`: one copy of the
    piece), which the agent's stream sends as they are (:func:`~agents.common.wire.serialize_frame`)."""
    if status != "ok":
        f = pb.AgentFrame()
        f.reply.id = call_id
        wire.encode_value((status, window, 0, 1, reason), f.reply.value)
        yield from writer.frames(f)
        return
    step = piece_bytes(writer)  # a piece and its few fields stay below the message limit
    if hasattr(blob, "chunks"):  # a Blob: views of its pieces
        pieces = blob.chunks(step) or [b""]
    else:
        pieces = [memoryview(blob)[i:i + step] for i in range(0, len(blob), step)] or [b""]
    for i, piece in enumerate(pieces):
        yield wire.reply_bytes(call_id, (status, window, i, len(pieces)), piece)

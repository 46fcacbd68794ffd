"""Direct agent-to-agent tensor streams: large tensors skip the controller.

A tensor of at least ``DIRECT_MIN_BYTES`` sent to a vworker on another agent
travels as raw bytes on a TCP connection from the sending agent straight to
the receiving one; the event that carries it goes through the controller as
usual (it keeps its heap key, so ordering and determinism are unchanged) but
holds only a ``PeerBlob`` reference ``(agent, id, nbytes)``. The receiving
agent takes the bytes by that reference when it decodes the event, waiting
for the last of them if needed; bytes are copied once, from the socket into
the buffer the tensor is built on (``torch.frombuffer``).

Each agent listens on the address it reaches the controller from and tells
the controller (``Register.data_address``) with a random secret. The
controller hands every *other* agent its own key for it, ``pair_key(secret,
sender, receiver)`` (HMAC-SHA256), so a hello proves both that the sender was
told by the controller and *which* agent it is: no agent can speak for
another. Hellos are read by one thread for all connections, each within
``HELLO_TIMEOUT_S`` of connecting and at most ``MAX_UNAUTHENTICATED`` at a
time (the oldest is dropped), so strangers cost no thread; each authenticated
sender gets one reader thread. Sizes and blob ids are checked against the
plan's :class:`~agents.common.wire.Limits` before anything is allocated, and
buffers grow as the bytes arrive. With ``controller.tls`` both ends speak TLS
with the run's certificates. An agent that cannot reach a peer sends through
the controller instead (chunked frames).

Stream format, after the hello ``MAGIC + sender agent id (int32 LE) + key
(32 B)``: repeated ``blob id (int64 LE, increasing), nbytes (int64 LE), bytes``.
"""
from __future__ import annotations

import hashlib
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
from typing import Callable

from agents.common.wire import Limits, WireError

__all__ = ["DIRECT_MIN_BYTES", "DirectServer", "DirectLinks", "local_address_towards", "pair_key"]

log = logging.getLogger("lockstep.agent")

DIRECT_MIN_BYTES = 256 * 1024
MAGIC = b"LSD2"
_HELLO = struct.Struct("<4si32s")
_HEADER = struct.Struct("<qq")
_RECV = 8 << 20  # large reads: about 2.5x the throughput of 1 MiB ones on loopback
HELLO_TIMEOUT_S = 5.0  # from connecting to a complete hello, however slowly the bytes come
MAX_UNAUTHENTICATED = 64  # connections still owing their hello; the oldest goes when another arrives


def pair_key(secret: bytes, sender: int, receiver: int) -> bytes:
    """What agent ``sender`` presents to agent ``receiver`` (whose listening secret is ``secret``)."""
    return hmac.new(secret, f"lockstep-direct {sender}->{receiver}".encode(), hashlib.sha256).digest()


def local_address_towards(address: str) -> str | None:
    """The IP of this host's interface that routes to ``address`` (HOST:PORT), or None.

    Connecting a UDP socket sends nothing; it only picks the route.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        fam = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(fam, socket.SOCK_DGRAM) as s:
            s.connect((host, int(port or 1)))
            return s.getsockname()[0]
    except (OSError, ValueError):
        return None


def _recv_exact(sock: socket.socket, mv: memoryview) -> bool:
    got, n = 0, mv.nbytes
    while got < n:
        k = sock.recv_into(mv[got:], min(_RECV, n - got))
        if k == 0:
            return False
        got += k
    return True


def _recv_growing(sock: socket.socket, n: int) -> bytearray | None:
    """``n`` bytes into a buffer that grows (doubling) as they arrive: a header alone allocates at most
    ``_RECV`` bytes. None when the stream ends first."""
    buf = bytearray(min(n, _RECV))
    got = 0
    while got < n:
        if got == len(buf):
            buf.extend(bytes(min(n, 2 * len(buf)) - len(buf)))
        with memoryview(buf) as mv:
            k = sock.recv_into(mv[got:], min(_RECV, len(buf) - got))
        if k == 0:
            return None
        got += k
    return buf


class Pending:
    """An accepted connection that has not finished its TLS handshake and hello (here and agents/mesh.py)."""

    __slots__ = ("conn", "peer", "deadline", "hello", "handshaken")

    def __init__(self, conn: socket.socket, peer: object, tls: bool, hello_timeout_s: float):
        self.conn, self.peer = conn, peer
        self.deadline = time.monotonic() + hello_timeout_s
        self.hello = bytearray()
        self.handshaken = not tls


def admit(conn: socket.socket, peer: object, ssl_context: ssl.SSLContext | None, sel: selectors.BaseSelector,
          pending: dict[socket.socket, Pending], refuse: Callable[[Pending, str], None],
          hello_timeout_s: float) -> None:
    """Wait for the hello of a just-accepted ``conn``: wrap it for TLS (the handshake comes with the hello)
    and, with ``MAX_UNAUTHENTICATED`` already waiting, refuse the oldest of them."""
    conn.setblocking(False)
    if ssl_context is not None:
        try:
            conn = ssl_context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
        except (OSError, ssl.SSLError):
            conn.close()
            return
    if len(pending) >= MAX_UNAUTHENTICATED:
        oldest = next(iter(pending.values()))
        sel.unregister(oldest.conn)
        del pending[oldest.conn]
        refuse(oldest, f"more than {MAX_UNAUTHENTICATED} connections without a hello")
    p = Pending(conn, peer, ssl_context is not None, hello_timeout_s)
    pending[conn] = p
    sel.register(conn, selectors.EVENT_READ, p)


class DirectServer:
    """Accepts the other agents' streams and keeps the blobs they send until :meth:`take`."""

    def __init__(self, host: str, agent_id: int = -1, ssl_context: ssl.SSLContext | None = None,
                 limits: Limits | None = None):
        self.secret = secrets.token_bytes(32)
        self.agent_id = agent_id
        self.limits = limits or Limits()  # the plan's, once the agent has it (agents/agent.py)
        self._ssl = ssl_context
        self._sock = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        self._sock.setblocking(False)
        self.address = f"[{host}]:{self._sock.getsockname()[1]}" if ":" in host else \
            f"{host}:{self._sock.getsockname()[1]}"
        self._cv = threading.Condition()
        self._blobs: dict[tuple[int, int], bytearray] = {}
        self._held: Counter = Counter()  # sender -> bytes received and not yet taken
        self._last_bid: dict[int, int] = {}
        self._streams: set[int] = set()  # senders with an open stream
        self._lost: dict[int, str] = {}  # sender agent -> why its stream ended
        self.refused: Counter = Counter()  # why connections were turned away (counts only: bounded)
        self._logged_at = 0.0
        self._closed = False
        threading.Thread(target=self._accept, name="direct-accept", daemon=True).start()

    # ------------------------------------------------------------ hellos
    def _refuse(self, p: Pending, why: str) -> None:
        self.refused[why] += 1
        now = time.monotonic()
        if now - self._logged_at >= 1.0:
            log.warning("refused a direct stream from %s: %s (%d refused so far)", p.peer, why,
                        sum(self.refused.values()))
            self._logged_at = now
        try:
            p.conn.close()
        except OSError:
            pass

    def _accept(self) -> None:
        """One thread reads every hello (no thread per stranger), then hands a stream its own reader."""
        sel = selectors.DefaultSelector()
        pending: dict[socket.socket, Pending] = {}  # insertion order = age
        try:
            sel.register(self._sock, selectors.EVENT_READ, None)
            while not self._closed:
                now = time.monotonic()
                for p in [p for p in pending.values() if p.deadline <= now]:
                    sel.unregister(p.conn)
                    del pending[p.conn]
                    self._refuse(p, f"no hello within {HELLO_TIMEOUT_S:g} s")
                wait = min([p.deadline for p in pending.values()], default=now + 0.5) - now
                for key, _ in sel.select(max(0.0, min(wait, 0.5))):
                    if key.data is None:
                        self._take_connections(sel, pending)
                    else:
                        self._progress(sel, pending, key.data)
        except (OSError, ValueError):  # the listening socket was closed
            pass
        finally:
            for p in pending.values():
                p.conn.close()
            sel.close()

    def _take_connections(self, sel: selectors.BaseSelector, pending: dict[socket.socket, Pending]) -> None:
        while True:
            try:
                conn, peer = self._sock.accept()
            except BlockingIOError:
                return
            admit(conn, peer, self._ssl, sel, pending, self._refuse, HELLO_TIMEOUT_S)

    def _progress(self, sel: selectors.BaseSelector, pending: dict[socket.socket, Pending], p: Pending) -> None:
        def drop(why: str) -> None:
            sel.unregister(p.conn)
            del pending[p.conn]
            self._refuse(p, why)

        try:
            if not p.handshaken:
                p.conn.do_handshake()
                p.handshaken = True
            data = p.conn.recv(_HELLO.size - len(p.hello))
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except (OSError, ssl.SSLError) as e:
            return drop(f"TLS or socket error before the hello: {e}")
        if not data:
            return drop("closed before its hello")
        p.hello += data
        if len(p.hello) < _HELLO.size:
            return
        sel.unregister(p.conn)
        del pending[p.conn]
        magic, src, key = _HELLO.unpack(bytes(p.hello))
        if magic != MAGIC or src == self.agent_id or not hmac.compare_digest(
                key, pair_key(self.secret, src, self.agent_id)):
            return self._refuse(p, "wrong hello or key")
        with self._cv:
            if src in self._streams:
                return self._refuse(p, f"agent {src} already has a stream open")
            self._streams.add(src)
            self._lost.pop(src, None)
        p.conn.setblocking(True)
        threading.Thread(target=self._serve, args=(p.conn, src), name=f"direct-recv-{src}", daemon=True).start()

    # ------------------------------------------------------------ streams
    def _serve(self, conn: socket.socket, src: int) -> None:
        try:
            head = bytearray(_HEADER.size)
            while _recv_exact(conn, memoryview(head)):
                bid, n = _HEADER.unpack(head)
                lim = self.limits
                if not 0 <= n <= lim.max_blob_bytes:
                    raise WireError(f"direct stream from agent {src} announces a blob of {n} bytes; at most "
                                    f"{lim.max_blob_bytes} accepted (controller.max_blob_bytes)")
                with self._cv:
                    if bid <= self._last_bid.get(src, 0):
                        raise WireError(f"direct stream from agent {src} reuses blob id {bid}")
                    if self._held[src] + n > lim.max_pending_bytes:
                        raise WireError(f"direct stream from agent {src} would hold more than "
                                        f"{lim.max_pending_bytes} bytes nobody took (controller.max_held_bytes)")
                    self._last_bid[src] = bid
                    self._held[src] += n
                buf = _recv_growing(conn, n) if n else bytearray()
                if buf is None:
                    raise WireError(f"direct stream from agent {src} ended inside blob {bid}")
                with self._cv:
                    self._blobs[(src, bid)] = buf
                    self._cv.notify_all()
            reason = "its direct stream ended"
        except (OSError, WireError, MemoryError) as e:
            reason = f"its direct stream failed: {e}"
        finally:
            conn.close()
        with self._cv:
            self._streams.discard(src)
            self._lost[src] = reason
            self._cv.notify_all()

    def take(self, src: int, bid: int, nbytes: int, timeout_s: float = 120.0) -> bytearray:
        """The bytes of blob ``bid`` from agent ``src`` (waits for them); WireError when they cannot come."""
        with self._cv:
            ok = self._cv.wait_for(lambda: (src, bid) in self._blobs or src in self._lost or self._closed,
                                   timeout_s)
            buf = self._blobs.pop((src, bid), None)
            if buf is None:
                why = self._lost.get(src) or ("this agent is closing" if self._closed else
                                              f"nothing came for {timeout_s:g} s" if not ok else "unknown")
                raise WireError(f"tensor bytes {bid} from agent {src} never arrived on the direct stream ({why})")
            self._held[src] -= len(buf)
        if len(buf) != nbytes:
            raise WireError(f"direct blob {bid} from agent {src} has {len(buf)} bytes; its reference says {nbytes}")
        return buf

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        try:
            self._sock.close()
        except OSError:
            pass


class DirectLinks:
    """This agent's outgoing direct streams, connected on first use.

    ``peers`` maps an agent id to ``(address, key)``, the key being what the controller derived for
    this agent (:func:`pair_key`).
    """

    def __init__(self, agent_id: int, peers: dict[int, tuple[str, bytes]], connect_timeout_s: float = 5.0,
                 ssl_context: ssl.SSLContext | None = None):
        self.agent_id, self.peers, self.connect_timeout_s = agent_id, peers, connect_timeout_s
        self._ssl = ssl_context
        self._socks: dict[int, socket.socket | None] = {}  # None: could not connect, use the controller

    def usable(self, dst: int) -> bool:
        """True when large tensors for agent ``dst`` can go straight to it (connects the first time)."""
        if dst not in self._socks:
            self._socks[dst] = self._connect(dst)
        return self._socks[dst] is not None

    def _connect(self, dst: int) -> socket.socket | None:
        if dst not in self.peers:
            return None
        address, key = self.peers[dst]
        host, _, port = address.rpartition(":")
        try:
            s = socket.create_connection((host.strip("[]"), int(port)), timeout=self.connect_timeout_s)
            if self._ssl is not None:
                s = self._ssl.wrap_socket(s, server_side=False)
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(_HELLO.pack(MAGIC, self.agent_id, key))
        except (OSError, ValueError, ssl.SSLError) as e:
            log.warning("cannot open a direct stream to agent %d at %s (%s); its tensors go through the "
                        "controller", dst, address, e)
            return None
        log.info("direct stream to agent %d at %s", dst, address)
        return s

    def send(self, dst: int, bid: int, mv: memoryview) -> None:
        s = self._socks.get(dst)
        if s is None:
            raise WireError(f"no direct stream to agent {dst}")
        try:
            s.sendall(_HEADER.pack(bid, mv.nbytes))
            if mv.nbytes:
                s.sendall(mv)
        except OSError as e:
            raise WireError(f"the direct stream to agent {dst} broke: {e}") from e

    def close(self) -> None:
        for s in self._socks.values():
            if s is not None:
                try:
                    s.close()
                except OSError:
                    pass
        self._socks.clear()


FetchBlob = Callable[[int, int, int], bytearray]

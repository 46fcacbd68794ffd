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
the controller (``Register.data_address``) with a random secret; the
controller hands both only to the other agents (``Peers``), so a connection
must present that secret before anything it sends is read. An agent that
cannot reach a peer sends through the controller instead (chunked frames).

Stream format, after the hello ``MAGIC + secret (32 B) + sender agent id
(int32 LE)``: repeated ``blob id (int64 LE), nbytes (int64 LE), bytes``.
"""
from __future__ import annotations

import hmac
import logging
import secrets
import socket
import struct
import threading
from typing import Callable

from agents.common.wire import WireError

__all__ = ["DIRECT_MIN_BYTES", "DirectServer", "DirectLinks", "local_address_towards"]

log = logging.getLogger("lockstep.agent")

DIRECT_MIN_BYTES = 256 * 1024
MAGIC = b"LSD1"
_HELLO = struct.Struct("<4s32si")
_HEADER = struct.Struct("<qq")
_RECV = 8 << 20  # large reads: about 2.5x the throughput of 1 MiB ones on loopback
_MAX_BLOB = 1 << 36


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


class DirectServer:
    """Accepts the other agents' streams and keeps the blobs they send until :meth:`take`."""

    def __init__(self, host: str):
        self.secret = secrets.token_bytes(32)
        self._sock = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.address = f"[{host}]:{self._sock.getsockname()[1]}" if ":" in host else \
            f"{host}:{self._sock.getsockname()[1]}"
        self._cv = threading.Condition()
        self._blobs: dict[tuple[int, int], bytearray] = {}
        self._lost: dict[int, str] = {}  # sender agent -> why its stream ended
        self._closed = False
        threading.Thread(target=self._accept, name="direct-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, peer), name="direct-recv", daemon=True).start()

    def _serve(self, conn: socket.socket, peer) -> None:
        src = None
        try:
            hello = bytearray(_HELLO.size)
            conn.settimeout(10.0)
            if not _recv_exact(conn, memoryview(hello)):
                return
            magic, secret, src = _HELLO.unpack(hello)
            if magic != MAGIC or not hmac.compare_digest(secret, self.secret):
                log.warning("refused a direct stream from %s: wrong hello or secret", peer)
                src = None
                return
            conn.settimeout(None)
            head = bytearray(_HEADER.size)
            while _recv_exact(conn, memoryview(head)):
                bid, n = _HEADER.unpack(head)
                if not 0 <= n <= _MAX_BLOB:
                    raise WireError(f"direct stream from agent {src} announces a blob of {n} bytes")
                buf = bytearray(n)
                if not _recv_exact(conn, memoryview(buf)):
                    raise WireError(f"direct stream from agent {src} ended inside blob {bid}")
                with self._cv:
                    self._blobs[(src, bid)] = buf
                    self._cv.notify_all()
            reason = "its direct stream ended"
        except (OSError, WireError) as e:
            reason = f"its direct stream failed: {e}"
        finally:
            conn.close()
        if src is not None:
            with self._cv:
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
    """This agent's outgoing direct streams, connected on first use."""

    def __init__(self, agent_id: int, peers: dict[int, tuple[str, bytes]], connect_timeout_s: float = 5.0):
        self.agent_id, self.peers, self.connect_timeout_s = agent_id, peers, connect_timeout_s
        self._socks: dict[int, socket.socket | None] = {}  # None: could not connect, use the controller

    def usable(self, dst: int) -> bool:
        """True when large tensors for agent ``dst`` can go straight to it (connects the first time)."""
        if dst not in self._socks:
            self._socks[dst] = self._connect(dst)
        return self._socks[dst] is not None

    def _connect(self, dst: int) -> socket.socket | None:
        if dst not in self.peers:
            return None
        address, secret = self.peers[dst]
        host, _, port = address.rpartition(":")
        try:
            s = socket.create_connection((host.strip("[]"), int(port)), timeout=self.connect_timeout_s)
            s.settimeout(None)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.sendall(_HELLO.pack(MAGIC, secret, self.agent_id))
        except (OSError, ValueError) as e:
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

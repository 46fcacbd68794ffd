"""Findings 3 and 6 of the review (issue 17) for the direct windows' streams (controller.windows=direct,
agents/mesh.py), and their mutual TLS (issue 13 item 5): strangers cannot hold up the start, a hello cannot
speak for another agent, sizes are checked before anything is allocated, a peer that runs ahead is held back
by flow control. All traffic on 127.0.0.1 or abstract Unix sockets of this host."""
from __future__ import annotations

import socket
import ssl
import threading
import time

import pytest
import torch

from agents.common.trust import client_ssl_context, server_ssl_context
from agents.common.wire import Limits
from agents.direct import MAX_UNAUTHENTICATED, pair_key
from agents.mesh import _BLOB, _HELLO, _PREFIX, MAGIC, MeshError, MeshLinks, MeshListener, PeerAddress, connect
from protos.lockstep.v1 import mesh_pb2 as mpb
from tests.helpers import wait_until


def _frame(window: int, blobs: list[memoryview] = (), ids: list[int] | None = None) -> list:
    body = mpb.MeshReport(window=window).SerializeToString()
    ids = ids or [i + 1 for i in range(len(blobs))]
    table = b"".join(_BLOB.pack(i, mv.nbytes) for i, mv in zip(ids, blobs))
    return [_PREFIX.pack(len(body), len(blobs)) + body + table, *blobs]


def _tcp(listener: MeshListener) -> socket.socket:
    host, port = listener.tcp.rsplit(":", 1)
    return socket.create_connection((host, int(port)))


def test_three_hundred_connections_without_a_hello_do_not_hold_up_the_start_of_direct_windows():
    listener = MeshListener("run", 0, "127.0.0.1")
    uds, tcp, secret = listener.secret_address()
    before = threading.active_count()
    strangers: list[socket.socket] = []
    real: dict = {}

    def dial():  # 300 strangers connect and say nothing; then the genuine agent 1 connects
        for _ in range(300):
            strangers.append(_tcp(listener))
        real["sock"] = connect(1, PeerAddress(0, "", tcp, pair_key(secret, 1, 0)), 10.0)

    t = threading.Thread(target=dial)
    t0 = time.monotonic()
    t.start()
    try:
        got = listener.accept({1}, timeout_s=30.0)
        assert list(got) == [1] and time.monotonic() - t0 < 20
        assert threading.active_count() <= before + 1  # the dialing thread: no thread per stranger
        assert sum(listener.refused.values()) >= 300 - MAX_UNAUTHENTICATED
    finally:
        t.join(10)
        for s in strangers:
            s.close()
        listener.close()


def test_a_spoofed_direct_window_hello_cannot_speak_for_another_agent():
    listener = MeshListener("run", 0, "127.0.0.1")
    uds, tcp, secret = listener.secret_address()
    # agent 2 holds its own key for agent 0 and claims to be agent 1 with it
    spoof = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    spoof.connect("\0" + uds)
    spoof.sendall(_HELLO.pack(MAGIC, pair_key(secret, 2, 0), 1))
    real: dict = {}
    t = threading.Thread(target=lambda: real.setdefault("s", connect(1, PeerAddress(0, uds, "", pair_key(
        secret, 1, 0)), 10.0)))
    t.start()
    try:
        got = listener.accept({1}, timeout_s=20.0)
        assert listener.refused["wrong hello or key"] == 1
        got[1].sendall(b"x")  # the genuine agent 1's stream, not the spoofer's
        t.join(10)  # the listener can accept before the dialing thread's connect() has returned
        assert "s" in real, "the genuine agent 1 did not finish connecting"
        real["s"].settimeout(5)
        assert real["s"].recv(1) == b"x"
        spoof.settimeout(5)
        assert spoof.recv(1) == b""  # closed without a reply
    finally:
        t.join(10)
        spoof.close()
        listener.close()


def _pair(limits: Limits | None = None, alloc=bytearray) -> tuple[MeshLinks, MeshLinks]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return MeshLinks(0, {1: a}, alloc, limits), MeshLinks(1, {0: b})


def test_a_frame_announcing_a_huge_tensor_fails_before_anything_is_allocated():
    made: list[int] = []

    def alloc(n):
        made.append(n)
        return bytearray(n)

    x, y = _pair(alloc=alloc)
    head = _frame(0, [memoryview(b"0123456789")])[0]
    head = head[:-8] + (1 << 36).to_bytes(8, "little")  # 10 bytes follow, 64 GiB announced
    y.socks[0].sendall(head + b"0123456789")
    t0 = time.monotonic()
    with pytest.raises(MeshError, match="agent 1 announced a tensor of 68719476736 bytes; at most"):
        x.exchange({}, {1})
    assert time.monotonic() - t0 < 5 and made == []


def test_a_frame_naming_one_tensor_id_twice_is_refused():
    x, y = _pair()
    y.socks[0].sendall(b"".join(bytes(b) for b in _frame(0, [memoryview(b"ab"), memoryview(b"cd")], ids=[4, 4])))
    with pytest.raises(MeshError, match="names one tensor id twice"):
        x.exchange({}, {1})


def test_a_peer_that_runs_ahead_is_held_back_by_flow_control_not_by_memory():
    limits = Limits(max_blob_bytes=1 << 20, max_pending_bytes=1 << 20, max_pending_blobs=16)
    x, y = _pair(limits)
    tensor = memoryview(torch.arange(100_000, dtype=torch.float32).numpy()).cast("B")  # 400 kB
    sent = []

    def run_ahead():
        for k in range(12):
            y.exchange({0: _frame(k, [tensor])}, set())
            sent.append(k)

    t = threading.Thread(target=run_ahead, daemon=True)
    t.start()
    rep, blobs = x.exchange({}, {1})[1]
    assert rep.window == 0 and bytes(blobs[1]) == bytes(tensor)
    # more frames arrived than were used; reading stops once they hold max_pending_bytes
    r = x.readers[1]
    wait_until(lambda: (r.pump(), r.full())[1], timeout=10, interval=0.01, what="the reader to stop reading")
    assert r.full() and r.held <= (1 << 20) + tensor.nbytes + 64
    assert t.is_alive() and len(sent) < 12  # the sender waits on its own socket
    for k in range(1, 12):
        rep, blobs = x.exchange({}, {1})[1]
        assert rep.window == k and bytes(blobs[1]) == bytes(tensor)
    t.join(30)
    assert sent == list(range(12))


# ------------------------------------------------------------------- mutual TLS
def _tls_listener(pki) -> tuple[MeshListener, tuple[str, str, bytes]]:
    node = pki["node"]
    listener = MeshListener("run", 0, "127.0.0.1", server_ssl_context(str(pki["ca"].path), str(node.cert),
                                                                        str(node.key)))
    return listener, listener.secret_address()


@pytest.mark.parametrize("transport", ["uds", "tcp"])
def test_with_tls_a_direct_window_stream_without_a_valid_certificate_is_refused(pki, transport):
    listener, (uds, tcp, secret) = _tls_listener(pki)
    node, stranger, ca = pki["node"], pki["stranger"], str(pki["ca"].path)
    addr = PeerAddress(0, uds if transport == "uds" else "", tcp if transport == "tcp" else "", pair_key(secret, 1, 0))
    results: dict = {}

    def dial():
        for name, ctx in (("plain", None),  # the right key, no TLS
                          ("no certificate", client_ssl_context(ca, None, None)),
                          ("stranger", client_ssl_context(ca, str(stranger.cert), str(stranger.key)))):
            try:
                s = connect(1, addr, 5.0, ctx)
                s.settimeout(5)
                results[name] = s.recv(1)  # b"" once the listener closed it
            except (OSError, ssl.SSLError, MeshError) as e:
                results[name] = e
        results["good"] = connect(1, addr, 5.0, client_ssl_context(ca, str(node.cert), str(node.key)))

    t = threading.Thread(target=dial)
    t.start()
    try:
        got = listener.accept({1}, timeout_s=30.0)
        t.join(20)
        assert list(got) == [1] and isinstance(got[1], ssl.SSLSocket)
        assert set(results) == {"plain", "no certificate", "stranger", "good"}
        for name in ("plain", "no certificate", "stranger"):
            assert results[name] == b"" or isinstance(results[name], (OSError, MeshError)), (name, results[name])
        assert sum(listener.refused.values()) == 3
        got[1].close()
    finally:
        t.join(10)
        listener.close()


def test_tensors_cross_a_tls_stream_both_ways(pki):
    listener, (uds, tcp, secret) = _tls_listener(pki)
    node, ca = pki["node"], str(pki["ca"].path)
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("s", connect(
        1, PeerAddress(0, "", tcp, pair_key(secret, 1, 0)), 5.0, client_ssl_context(ca, str(node.cert), str(node.key)))))
    t.start()
    got = listener.accept({1}, timeout_s=20.0)
    t.join(10)
    x, y = MeshLinks(0, got), MeshLinks(1, {0: out["s"]})
    big_x, big_y = torch.arange(1_000_000, dtype=torch.float32), -torch.arange(700_000, dtype=torch.float32)

    def side(links, me, other, tensor):
        out[me] = links.exchange({other: _frame(me, [memoryview(tensor.numpy()).cast("B")])}, {other})

    ts = [threading.Thread(target=side, args=(x, 0, 1, big_x)), threading.Thread(target=side, args=(y, 1, 0, big_y))]
    for th in ts:
        th.start()
    for th in ts:
        th.join(60)
    assert not any(th.is_alive() for th in ts), "the exchange deadlocked"
    assert torch.equal(torch.frombuffer(out[0][1][1][1], dtype=torch.float32), big_y)
    assert torch.equal(torch.frombuffer(out[1][0][1][1], dtype=torch.float32), big_x)
    x.close()
    y.close()

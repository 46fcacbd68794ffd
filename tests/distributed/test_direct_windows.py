"""Direct windows (controller.windows=direct, agents/mesh.py): the agents carry DESIGN §5's windows themselves.

The same windows as the controller's loop (so the same outputs and the same window count), authenticated
streams, malformed reports refused with a clear error, large tensors both ways at once without a deadlock.
"""
from __future__ import annotations

import socket
import threading

import pytest
import torch

from agents.common import wire
from agents.direct import pair_key
from agents.mesh import MAGIC, MeshError, MeshLinks, MeshListener, MeshLoop, PeerAddress, connect, _HELLO
from agents.sim.kernel import RemoteEvent
from agents.sim.types import INFINITY
from protos.lockstep.v1 import agent_pb2 as pb
from protos.lockstep.v1 import mesh_pb2 as mpb

from .conftest import assert_same_outputs, run

COMMON = ["workers=8", "stop.updates=30", "eval.every=10", "eval.samples=300", "network.latency=1ms"]


@pytest.mark.parametrize("agents", [2, 3])
def test_direct_windows_are_the_controllers_windows(tmp_path, agents):
    base = COMMON + ["strategy=ps_async", f"agents={agents}"]
    one = run(tmp_path / "one", COMMON + ["strategy=ps_async", "agents=1"])
    hub = run(tmp_path / "hub", base + ["controller.windows=hub"], local=True)
    direct = run(tmp_path / "direct", base + ["controller.windows=direct"], local=True)
    assert direct.summary["windows"] == hub.summary["windows"] > 1
    assert direct.summary["messages_remote"] == hub.summary["messages_remote"] > 0
    assert_same_outputs(tmp_path / "one", tmp_path / "direct")
    assert_same_outputs(tmp_path / "hub", tmp_path / "direct")
    assert one.summary["updates"] == direct.summary["updates"] == 30


def _pair() -> tuple[MeshLinks, MeshLinks]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    return MeshLinks(0, {1: a}), MeshLinks(1, {0: b})


def _frame(report: mpb.MeshReport, blobs: list[memoryview] = ()) -> list:
    from agents.mesh import _BLOB, _PREFIX

    body = report.SerializeToString()
    table = b"".join(_BLOB.pack(i + 1, mv.nbytes) for i, mv in enumerate(blobs))
    return [_PREFIX.pack(len(body), len(blobs)) + body + table, *blobs]


def test_large_reports_cross_both_ways_at_once_without_a_deadlock():
    x, y = _pair()
    big_x, big_y = torch.arange(4_000_000, dtype=torch.float32), -torch.arange(3_000_000, dtype=torch.float32)
    out: dict = {}

    def side(links, me, other, tensor):
        rep = mpb.MeshReport(window=7, next_time=me, horizon=me)
        out[me] = links.exchange({other: _frame(rep, [memoryview(tensor.numpy()).cast("B")])}, {other})

    ts = [threading.Thread(target=side, args=(x, 0, 1, big_x)), threading.Thread(target=side, args=(y, 1, 0, big_y))]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not any(t.is_alive() for t in ts), "the exchange deadlocked"
    rep, blobs = out[0][1]
    assert rep.window == 7 and rep.next_time == 1
    assert torch.equal(torch.frombuffer(blobs[1], dtype=torch.float32), big_y)
    assert torch.equal(torch.frombuffer(out[1][0][1][1], dtype=torch.float32), big_x)


def test_a_stream_that_ends_before_its_report_fails_with_the_peers_name():
    x, y = _pair()
    y.close()
    with pytest.raises(MeshError, match="agent 1 closed its direct-window stream"):
        x.exchange({}, {1})


def test_a_connection_without_the_secret_is_refused_and_the_right_one_accepted():
    listener = MeshListener("run", 0, "127.0.0.1")
    uds, tcp, secret = listener.secret_address()
    bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bad.connect("\0" + uds)
    bad.sendall(_HELLO.pack(MAGIC, b"\0" * 32, 1))
    wrong_tcp = PeerAddress(0, "", tcp, b"x" * 32)
    good_holder: dict = {}

    def dial():
        good_holder["bad_tcp"] = connect(1, wrong_tcp, 5.0)
        good_holder["good"] = connect(1, PeerAddress(0, uds, tcp, pair_key(secret, 1, 0)), 5.0)

    t = threading.Thread(target=dial)
    t.start()
    got = listener.accept({1}, timeout_s=20.0)
    t.join(10)
    assert list(got) == [1]
    # the refused connections were closed before anything they sent was read: an end of stream, or a reset when
    # the kernel still held the unread hello at the close (which a loaded machine makes likely)
    for s in (bad, good_holder["bad_tcp"]):
        s.settimeout(5)
        try:
            end = s.recv(1)
        except ConnectionResetError:
            end = b""
        assert end == b""
    listener.close()


class _FakeCore:
    """Enough of an AgentCore for MeshLoop: hosts vworker 0 on agent 0; vworker 1 is on agent 1."""

    agent_id = 0

    def advance(self, *a, **k):  # pragma: no cover - agent 0 never runs in these tests
        raise AssertionError("agent 0 has nothing to run")


class _FakeLinks:
    def __init__(self, frame):
        self.frame = frame

    def exchange(self, out, expect, should_stop=None):
        return {1: self.frame}


def _bad_event_loop(event: RemoteEvent, origin_agent: int = 1, window: int = 0) -> MeshLoop:
    rep = mpb.MeshReport(window=window, next_time=INFINITY, horizon=INFINITY)
    wire.encode_event(event, rep.events.add())
    rep.routed.add(agent=0, count=1, min_time=event.time, min_effect=event.time)
    return MeshLoop(_FakeCore(), _FakeLinks((rep, {})), placement=[0, 1, 1], n_agents=2, lookahead=1000,
                    next_times=[INFINITY, 5], horizons=[INFINITY, 5], report=lambda p: None)


@pytest.mark.parametrize("event,message", [
    (RemoteEvent(2000, 0, 1, 1, 1, "notify", (1, "x")), "for vworker 1, which this agent does not host"),
    (RemoteEvent(2000, 0, 0, 1, 0, "notify", (0, "x")), "from vworker 0, which it does not host"),
])
def test_a_report_with_an_event_its_sender_cannot_send_is_refused(event, message):
    with pytest.raises(MeshError, match=message):
        _bad_event_loop(event).run()


def test_a_report_of_another_window_is_refused():
    ev = RemoteEvent(2000, 0, 1, 1, 0, "notify", (0, "x"))
    with pytest.raises(MeshError, match="its report of window 3 in window 0"):
        _bad_event_loop(ev, window=3).run()


def test_a_garbled_report_is_refused_with_the_senders_name():
    x, y = _pair()
    y.socks[0].sendall(b"\x05\x00\x00\x00\x00\x00\x00\x00" + b"\xff" * 5)
    with pytest.raises(MeshError, match="agent 1 sent a malformed report"):
        x.exchange({}, {1})


def test_received_tensors_land_in_the_buffers_the_agent_asks_for():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    made: list[int] = []

    def alloc(n):
        made.append(n)
        return bytearray(n)

    x, y = MeshLinks(0, {1: a}, alloc), MeshLinks(1, {0: b})
    t = torch.arange(100_000, dtype=torch.float32)
    sender = threading.Thread(target=y.exchange, args=({0: _frame(mpb.MeshReport(window=0),
                                                                  [memoryview(t.numpy()).cast("B")])}, set()))
    sender.start()
    (rep, blobs), = x.exchange({}, {1}).values()
    sender.join(30)
    assert made == [400_000] and torch.equal(torch.frombuffer(blobs[1], dtype=torch.float32), t)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU; this machine has none")
def test_a_gpu_agent_receives_tensors_in_pinned_memory():
    from agents.mesh import host_buffer

    class Core:
        class training:
            device = torch.device("cuda")

    buf = host_buffer(Core())(1024)
    assert torch.frombuffer(buf, dtype=torch.uint8).is_pinned()

"""Direct agent-to-agent tensor streams (agents/direct.py): bit-exact, authenticated, failures are clear."""
from __future__ import annotations

import socket

import pytest
import torch

from agents.common import wire
from agents.direct import DIRECT_MIN_BYTES, DirectLinks, DirectServer, pair_key
from protos.lockstep.v1 import agent_pb2 as pb

from .conftest import assert_same_outputs, run, wait_until

BIG = ["strategy=ps_async", "strategy._target_=tests.distributed.probe.BigTensors", "workers=1",
       "stop.updates=1000", "network.latency=1ms"]


def test_large_tensors_take_the_direct_stream_and_arrive_bit_identical(tmp_path):
    run(tmp_path / "one", BIG + ["agents=1"])
    r = run(tmp_path / "two", BIG + ["agents=2", "placement=round_robin"], local=True)
    assert r.summary["messages_remote"] == 3
    assert "direct stream to agent 1" in (tmp_path / "two" / "agents" / "agent-0.log").read_text()
    assert_same_outputs(tmp_path / "one", tmp_path / "two", params=False)


def test_with_direct_streams_off_the_same_tensors_go_through_the_controller(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_DIRECT", "0")
    run(tmp_path / "one", BIG + ["agents=1"])
    run(tmp_path / "two", BIG + ["agents=2", "placement=round_robin"], local=True)
    assert "direct stream" not in (tmp_path / "two" / "agents" / "agent-0.log").read_text()
    assert_same_outputs(tmp_path / "one", tmp_path / "two", params=False)


@pytest.fixture
def server():
    s = DirectServer("127.0.0.1", agent_id=1)
    yield s
    s.close()


def _links(server, sender: int = 0, **kw) -> DirectLinks:
    """Agent ``sender``'s links to ``server`` (agent 1), with the key the controller would hand it."""
    return DirectLinks(sender, {1: (server.address, pair_key(server.secret, sender, 1))}, **kw)


def _encode_for(dst_agent: int, links: DirectLinks, x) -> tuple[pb.Value, list]:
    w = wire.FrameWriter(pb.AgentFrame)
    blobs = w.blobs()
    blobs.self_agent, blobs.direct_ok, blobs.direct_min, blobs.dst_agent = 0, links.usable, DIRECT_MIN_BYTES, dst_agent
    v = wire.encode_value(x, pb.Value(), blobs)
    return v, blobs.direct


def test_a_tensor_crosses_the_direct_stream_and_the_controller_routes_only_its_reference(server):
    links = _links(server)
    x = (torch.randn(DIRECT_MIN_BYTES // 4 + 3), torch.arange(5))
    v, direct = _encode_for(1, links, x)
    assert len(direct) == 1 and v.tuple.items[0].tensor.WhichOneof("bytes_in") == "peer"
    # the controller keeps the reference and encodes it back unchanged
    ref = wire.decode_value(v, peer=wire.keep_refs(0))
    assert isinstance(ref[0], wire.BlobRef) and torch.equal(ref[1], x[1])
    again = wire.encode_value(ref, pb.Value())
    assert again.tuple.items[0].tensor == v.tuple.items[0].tensor
    for dst, bid, mv in direct:
        links.send(dst, bid, mv)
    y = wire.decode_value(again, peer=server.take)
    assert torch.equal(y[0], x[0]) and torch.equal(y[1], x[1])
    links.close()


def test_a_reference_that_names_another_agent_is_rejected_by_the_controller(server):
    links = _links(server)
    v, _ = _encode_for(1, links, torch.zeros(DIRECT_MIN_BYTES))
    with pytest.raises(wire.WireError, match="names agent 0, not its sender 2"):
        wire.decode_value(v, peer=wire.keep_refs(2))
    v.tensor.peer.nbytes += 4
    with pytest.raises(wire.WireError, match="direct reference says"):
        wire.decode_value(v, peer=wire.keep_refs(0))
    links.close()


def test_a_stream_with_a_wrong_secret_is_refused_and_its_bytes_never_used(server):
    links = DirectLinks(3, {1: (server.address, b"x" * 32)})
    assert links.usable(1)  # the connection opens; the server reads the hello and closes it

    def refused() -> bool:  # shows as a broken stream once the server has closed it
        try:
            links.send(1, 1, memoryview(bytearray(1 << 16)))
        except wire.WireError:
            return True
        return False

    wait_until(refused, timeout=10, what="the server to close a stream with a wrong secret")
    with pytest.raises(wire.WireError, match="never arrived"):
        server.take(3, 1, 1 << 16, timeout_s=0.2)
    links.close()


def test_bytes_from_an_agent_whose_stream_ended_fail_with_a_clear_error(server):
    from agents.direct import _HELLO, MAGIC

    host, port = server.address.rsplit(":", 1)
    c = socket.create_connection((host, int(port)))
    c.sendall(_HELLO.pack(MAGIC, 5, pair_key(server.secret, 5, 1)))
    c.sendall((7).to_bytes(8, "little") + (100).to_bytes(8, "little") + b"\0" * 10)  # 10 of 100 bytes
    c.close()
    with pytest.raises(wire.WireError, match="from agent 5 never arrived.*ended inside blob 7"):
        server.take(5, 7, 100, timeout_s=10)


def test_an_unreachable_peer_falls_back_to_the_controller():
    s = socket.create_server(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    links = DirectLinks(0, {1: (f"127.0.0.1:{port}", b"s" * 32)}, connect_timeout_s=1)
    v, direct = _encode_for(1, links, torch.zeros(DIRECT_MIN_BYTES))
    assert direct == [] and v.tensor.WhichOneof("bytes_in") == "blob"

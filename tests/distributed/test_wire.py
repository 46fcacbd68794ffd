"""The wire format: exact round trips, preserved container types, bounded messages, clear refusals."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agents.common import wire
from agents.sim.kernel import RemoteEvent
from agents.sim.network import Transfer
from protos.lockstep.v1 import agent_pb2 as pb


def roundtrip(obj, max_bytes=1 << 14):
    w, r = wire.FrameWriter(pb.AgentFrame, max_bytes), wire.FrameReader(pb.AgentFrame)
    f = pb.AgentFrame()
    blobs = w.blobs()
    wire.encode_value(obj, f.reply.value, blobs)
    out, sizes = None, []
    for fr in w.frames(f, blobs):
        data = fr.SerializeToString()
        sizes.append(len(data))
        msg = r.feed(pb.AgentFrame.FromString(data))
        if msg is not None:
            out = wire.decode_value(msg.reply.value, r.blobs)
    assert max(sizes) <= max_bytes
    return out, len(sizes)


def test_payloads_come_back_bit_exact_with_their_container_types():
    g = torch.Generator().manual_seed(0)
    obj = (torch.randn(50_000, generator=g), 7, 0.1 + 0.2, "w3", None, [1, (2.5, True)],
           {"k": torch.arange(6, dtype=torch.int64).reshape(2, 3), 3: b"raw"}, torch.empty(0, 4),
           torch.tensor(-0.0), torch.tensor([math.nan, math.inf], dtype=torch.float64),
           torch.ones(3, dtype=torch.bfloat16), np.arange(5, dtype=np.float32), -(2**63))
    out, frames = roundtrip(obj)
    assert frames > 10, "a 200 kB tensor must travel in chunks of at most 16 kB"
    assert type(out) is tuple and type(out[5]) is list and type(out[5][1]) is tuple and type(out[6]) is dict
    assert out[1:7:1][0] == 7 and out[2] == 0.1 + 0.2 and out[3] == "w3" and out[4] is None and out[12] == -(2**63)
    for a, b in ((out[0], obj[0]), (out[6]["k"], obj[6]["k"]), (out[8], obj[8]), (out[9], obj[9]), (out[10], obj[10])):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.view(-1).view(torch.uint8).tolist() == b.reshape(-1).view(torch.uint8).tolist()
    assert out[7].shape == (0, 4) and out[6][3] == b"raw"
    assert isinstance(out[11], np.ndarray) and out[11].dtype == np.float32 and (out[11] == obj[11]).all()


def test_a_transfer_event_keeps_every_field():
    tr = Transfer(1, 2, "w1", "ps0", 9, "grad", (torch.ones(3), 4, 0.5, 32), 12, 100, 110, 1000, None, math.inf)
    ev = RemoteEvent(1110, 0, 1, 17, 2, "arrive", tr)
    e = wire.encode_event(ev, pb.Event())
    back = wire.decode_event(pb.Event.FromString(e.SerializeToString()))
    assert (back.time, back.priority, back.origin, back.seq, back.dst, back.kind) == (1110, 0, 1, 17, 2, "arrive")
    t = back.data
    assert (t.src, t.dst, t.src_name, t.dst_name, t.seq, t.tag, t.nbytes, t.sent_at, t.e0, t.latency, t.tail,
            t.cap, t.done) == (1, 2, "w1", "ps0", 9, "grad", 12, 100, 110, 1000, None, math.inf, None)
    assert type(t.payload) is tuple and torch.equal(t.payload[0], torch.ones(3)) and t.payload[1:] == (4, 0.5, 32)


def test_a_huge_frame_travels_as_an_envelope():
    big = [i * 0.5 for i in range(10_000)]  # ~90 kB of Value messages, no tensor
    out, frames = roundtrip(big, max_bytes=8192)
    assert out == big and frames > 10


@pytest.mark.parametrize("n", [0, 1, 127, 128, 16_383, 16_384, 3 << 20])
@pytest.mark.parametrize("call_id", [1, 300, 2**40])
def test_a_reply_serialized_around_its_bytes_parses_to_the_frame_the_message_makes(n, call_id):
    """A checkpoint piece's frame is serialized without building it (wire.reply_bytes): the controller must
    read the very frame the message would have been, whatever the lengths' varints (1 to 4 bytes here)."""
    data = bytes(range(256)) * (n // 256) + bytes(n % 256)
    built = pb.AgentFrame()
    built.reply.id = call_id
    wire.encode_value(("ok", 140_402, 3, 700, data), built.reply.value)
    sent = wire.reply_bytes(call_id, ("ok", 140_402, 3, 700), memoryview(data))
    got = pb.AgentFrame.FromString(sent)
    assert got == built
    assert got.SerializeToString() == built.SerializeToString()
    assert wire.decode_value(got.reply.value) == ("ok", 140_402, 3, 700, data)
    assert wire.serialize_frame(sent) is sent and wire.serialize_frame(built) == built.SerializeToString()


@pytest.mark.parametrize("obj", [object(), {1, 2}, 2**64, torch.zeros(2, dtype=torch.uint16)
                                 if hasattr(torch, "uint16") else object()])
def test_values_that_cannot_cross_agents_are_refused_with_a_clear_error(obj):
    with pytest.raises(wire.WireError, match="cannot cross agents|does not fit"):
        wire.encode_value(obj, pb.Value())


def test_malformed_frames_raise_wire_errors():
    r = wire.FrameReader(pb.AgentFrame)
    f = pb.AgentFrame()
    f.chunk.blob, f.chunk.total, f.chunk.offset, f.chunk.data = 1, 4, 2, b"xx"
    with pytest.raises(wire.WireError, match="does not continue"):
        r.feed(f)
    with pytest.raises(wire.WireError, match="empty frame"):
        r.feed(pb.AgentFrame())
    v = pb.Value()
    v.tensor.dtype, v.tensor.blob = "float32", 5
    with pytest.raises(wire.WireError, match="blob 5"):
        wire.decode_value(v, {})
    v = pb.Value()
    v.tensor.dtype = "complex_float_99"
    with pytest.raises(wire.WireError, match="unknown tensor dtype"):
        wire.decode_value(v)


def test_a_named_tuple_row_travels_as_a_plain_tuple_and_is_rebuilt_field_by_field():
    from agents.sim.env import RowKey, UpdateRow

    key, row = RowKey(5, 2, 1), UpdateRow(5, 5e-9, "w2", 3, 0.25, 1, 16, 4096, 0.5)
    out, _ = roundtrip([(key, row)])
    assert type(out[0][1]) is tuple and out == [(tuple(key), tuple(row))]
    assert UpdateRow(*out[0][1]).loss == 0.25 and RowKey(*out[0][0]).time == 5


def test_a_restore_call_serialized_around_its_piece_parses_to_the_call_the_message_makes():
    """controller/run.py restore_agents sends each piece as wire.append_bytes of a ControllerFrame's call."""
    piece = bytes(range(256)) * 700
    built = pb.ControllerFrame()
    built.call.id, built.call.method = 12, "restore"
    wire.encode_value((3, 9, piece), built.call.args)
    head = pb.ControllerFrame()
    head.call.id, head.call.method = 12, "restore"
    wire.encode_value((3, 9), head.call.args)
    got = pb.ControllerFrame.FromString(wire.append_bytes(head, ("call", "args"), memoryview(piece)))
    assert got == built and wire.decode_value(got.call.args) == (3, 9, piece)
    with pytest.raises(ValueError, match="call of ControllerFrame is not a Value"):
        wire.append_bytes(head, ("call",), piece)


def test_a_checkpoints_frames_are_made_as_they_are_taken_and_carry_its_bytes_in_order():
    """agents/mesh.py checkpoint_reply: the frames of a checkpoint are made one at a time as the stream takes them
    (an agent holds one beside its checkpoint, not a copy of all of it), each a reply the controller reads as
    (status, window, part, parts, bytes) with the pieces in order."""
    from agents.common.files import Blob
    from agents.mesh import checkpoint_reply

    writer = wire.FrameWriter(pb.AgentFrame, 1 << 14)  # pieces of 8 KiB
    storage = bytearray(b"a" * 20_000)
    blob = Blob([b"head", memoryview(storage)])
    frames = checkpoint_reply(writer, 9, "ok", 42, blob)
    first = next(frames)
    storage[10_000:] = b"b" * 10_000  # a frame not yet taken is made from the bytes as they are when it is
    rest = list(frames)
    got = [wire.decode_value(pb.AgentFrame.FromString(wire.serialize_frame(f)).reply.value) for f in [first, *rest]]
    assert [g[:4] for g in got] == [("ok", 42, i, 4) for i in range(4)]
    assert b"".join(g[4] for g in got) == b"head" + b"a" * 10_000 + b"b" * 10_000
    assert max(len(wire.serialize_frame(f)) for f in [first, *rest]) <= 1 << 14
    refused = list(checkpoint_reply(writer, 9, "refused", 42, reason="vworker w3 waits in recv"))
    assert [wire.decode_value(f.reply.value) for f in refused] == [("refused", 42, 0, 1, "vworker w3 waits in recv")]

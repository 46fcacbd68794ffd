"""Serialisation of the agent protocol (protos/lockstep/v1/agent.proto) — exact, and nothing pickled.

Payloads cross agents as a tree of :class:`Value` messages: ``None``, bool,
int (int64), float (IEEE double, so bit-exact), str, bytes, tensors and
numpy arrays (raw bytes + dtype + shape), and tuple / list / dict containers
whose kind is preserved — a strategy receives the same Python objects it
would receive in-process. Anything else is refused with :class:`WireError`.

Small tensors travel inline; larger ones become *blobs*: ``BlobChunk`` frames
sent before the frame that references them, each at most
``max_message_bytes``. A frame that is still too large is itself sent as a
blob (``envelope``). Large tensors for another agent may instead go straight
to it (agents/direct.py): the frame then holds a ``PeerBlob`` reference, which
the controller decodes to a :class:`BlobRef` and encodes back unchanged. :class:`FrameWriter` produces the frames of one stream
direction, :class:`FrameReader` reassembles them.

Everything a peer sends is checked before it costs memory (docs/security.md):
a :class:`Limits`, derived from the plan (:func:`limits_for`: a small multiple
of the model's bytes and of the message limit), bounds every blob, the bytes
and blobs held before a frame uses them, and the shape of every tensor; blob
buffers grow as their chunks arrive, never to a size a chunk merely declares.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch

from agents.sim.env import Stats
from agents.sim.kernel import RemoteEvent
from agents.sim.network import Transfer
from protos.lockstep.v1 import agent_pb2 as pb

__all__ = ["PROTOCOL_VERSION", "WireError", "BlobRef", "FrameWriter", "FrameReader", "Limits", "limits_for",
           "encode_value", "decode_value", "encode_event", "decode_event", "encode_stats", "decode_stats",
           "append_bytes", "reply_bytes", "serialize_frame",
           "DEFAULT_MAX_MESSAGE_BYTES", "METADATA_TOKEN", "METADATA_AGENT", "METADATA_TICKET", "METADATA_PROTOCOL"]

PROTOCOL_VERSION = 5  # 5: the token in Register's metadata, checked before the request is read
# call metadata (docs/distributed.md): Register carries the token, the protocol and the agent id;
# Session and Beat the agent id and the ticket Register returned
METADATA_TOKEN, METADATA_AGENT = "lockstep-token", "lockstep-agent-id"
METADATA_TICKET, METADATA_PROTOCOL = "lockstep-ticket", "lockstep-protocol"
from agents.common.net import DEFAULT_MAX_MESSAGE_BYTES  # noqa: E402 - re-exported
_FRAME_OVERHEAD = 1024  # room for the non-data fields of a BlobChunk frame
_MAX_DEPTH = 64
_MAX_DIMS = 32  # numpy's limit is 64, torch's 25 for some kernels; no strategy sends more than a few
_MAX_DIM = 1 << 40  # one dimension: a zero-sized tensor may not claim an absurd shape either
_INT64 = (-(1 << 63), (1 << 63) - 1)

_TORCH_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)}
_NUMPY_DTYPES = {n: np.dtype(n) for n in (
    "float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "uint16", "uint32",
    "uint64", "bool", "complex64", "complex128")}


class WireError(ValueError):
    """A value that cannot cross agents, or a malformed message."""


@dataclass(frozen=True)
class Limits:
    """What a peer may make this process hold (docs/security.md), checked before anything is allocated.

    ``max_blob_bytes`` bounds one blob (a tensor, or a frame sent as an envelope); ``max_pending_bytes``
    and ``max_pending_blobs`` bound what is held between the chunks and the frame that uses them.
    """

    max_blob_bytes: int = 4 * DEFAULT_MAX_MESSAGE_BYTES
    max_pending_bytes: int = 8 * DEFAULT_MAX_MESSAGE_BYTES
    max_pending_blobs: int = 4096

    def to_dict(self) -> dict[str, int]:
        return {"max_blob_bytes": self.max_blob_bytes, "max_pending_bytes": self.max_pending_bytes,
                "max_pending_blobs": self.max_pending_blobs}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "Limits":
        return cls(**{k: int(v) for k, v in (d or {}).items() if k in cls.__dataclass_fields__})


def limits_for(model_bytes: int, n_vworkers: int, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
               max_blob_bytes: int | None = None, max_held_bytes: int | None = None) -> Limits:
    """The limits of a run: one blob is at most 4x the model or 4x the message limit (a frame sent as an
    envelope); a frame may carry a few model-sized tensors for every vworker (a PS's broadcast). A strategy
    that sends larger tensors sets ``controller.max_blob_bytes`` / ``controller.max_held_bytes``."""
    blob = max_blob_bytes or max(4 * model_bytes, 4 * max_message_bytes)
    held = max_held_bytes or blob + 4 * model_bytes * max(n_vworkers, 1)
    return Limits(max_blob_bytes=blob, max_pending_bytes=max(held, blob), max_pending_blobs=64 + 8 * max(n_vworkers, 1))


@dataclass(frozen=True)
class BlobRef:
    """A tensor whose bytes travel on a direct stream from agent ``agent``: what the controller routes."""

    agent: int
    id: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]
    numpy: bool


# (sender agent, blob id, nbytes) -> the bytes (agent side) or a BlobRef (controller side)
PeerFetch = Callable[[int, int, int], Any]


def keep_refs(src_agent: int) -> PeerFetch:
    """The controller's ``peer`` for decoding a frame of agent ``src_agent``: keep references as BlobRef."""
    def ref(agent: int, bid: int, nbytes: int) -> Any:
        if agent != src_agent:
            raise WireError(f"a direct tensor reference names agent {agent}, not its sender {src_agent}")
        return None
    return ref


# ------------------------------------------------------------------ blobs
class _Blobs:
    """Tensor bytes of one frame: small ones inline, the rest as blobs sent before the frame."""

    def __init__(self, writer: "FrameWriter"):
        self.writer = writer
        self.out: list[tuple[int, memoryview]] = []
        self.inline_left = writer.max_message_bytes // 2
        # direct streams (agents/direct.py): set by the sending agent around each event it encodes
        self.self_agent = -1
        self.dst_agent: int | None = None
        self.direct_ok: Callable[[int], bool] | None = None
        self.direct_min = 1 << 62
        self.direct: list[tuple[int, int, memoryview]] = []  # (destination agent, blob id, bytes)

    def put(self, t: pb.Tensor, mv: memoryview) -> None:
        n = mv.nbytes
        dst = self.dst_agent
        if n >= self.direct_min and dst is not None and self.direct_ok is not None and self.direct_ok(dst):
            bid = self.writer.new_blob_id()
            self.direct.append((dst, bid, mv))
            t.peer.agent, t.peer.id, t.peer.nbytes = self.self_agent, bid, n
        elif n <= self.writer.inline_limit and n <= self.inline_left:
            self.inline_left -= n
            t.data = mv.tobytes()
        else:
            bid = self.writer.new_blob_id()
            self.out.append((bid, mv))
            t.blob = bid


def _tensor_bytes(x: torch.Tensor) -> memoryview:
    x = x.detach()
    if x.device.type != "cpu":
        x = x.cpu()
    x = x.contiguous().reshape(-1)
    if x.numel() == 0:
        return memoryview(b"")
    return memoryview(x.view(torch.uint8).numpy())


def _put_ref(t: pb.Tensor, ref: BlobRef) -> None:
    t.dtype, t.numpy = ref.dtype, ref.numpy
    t.shape.extend(ref.shape)
    t.peer.agent, t.peer.id, t.peer.nbytes = ref.agent, ref.id, ref.nbytes


# ----------------------------------------------------------------- values
def encode_value(obj: Any, out: pb.Value, blobs: _Blobs | None = None, _depth: int = 0) -> pb.Value:
    """Fill ``out`` with ``obj`` (see the module docstring for what is accepted)."""
    if _depth > _MAX_DEPTH:
        raise WireError(f"payload nested deeper than {_MAX_DEPTH} levels")
    if obj is None:
        out.none = True
    elif obj is True or obj is False:
        out.b = obj
    elif isinstance(obj, int):
        if not _INT64[0] <= obj <= _INT64[1]:
            raise WireError(f"integer {obj} does not fit in int64 and cannot cross agents")
        out.i = obj
    elif isinstance(obj, float):
        out.f = obj
    elif isinstance(obj, str):
        out.s = obj
    elif isinstance(obj, (bytes, bytearray)):
        out.raw = bytes(obj)
    elif isinstance(obj, torch.Tensor):
        t = out.tensor
        t.dtype = str(obj.dtype).removeprefix("torch.")
        if t.dtype not in _TORCH_DTYPES:
            raise WireError(f"tensor dtype {obj.dtype} cannot cross agents; accepted: {', '.join(_TORCH_DTYPES)}")
        t.shape.extend(obj.shape)
        _put_bytes(t, _tensor_bytes(obj), blobs)
    elif isinstance(obj, np.ndarray):
        t = out.tensor
        t.dtype, t.numpy = obj.dtype.name, True
        if t.dtype not in _NUMPY_DTYPES:
            raise WireError(f"numpy dtype {obj.dtype} cannot cross agents; accepted: {', '.join(_NUMPY_DTYPES)}")
        t.shape.extend(obj.shape)
        _put_bytes(t, memoryview(np.ascontiguousarray(obj).reshape(-1).view(np.uint8)), blobs)
    elif isinstance(obj, BlobRef):
        _put_ref(out.tensor, obj)
    elif isinstance(obj, np.generic):
        encode_value(obj.item(), out, blobs, _depth + 1)
    elif isinstance(obj, tuple) or type(obj) is list:  # a NamedTuple (a row, a row key) travels as a tuple
        seq = out.tuple if isinstance(obj, tuple) else out.list
        seq.SetInParent()
        _encode_items(obj, seq.items.add, blobs, _depth + 1)
    elif type(obj) is dict:
        d = out.dict
        d.SetInParent()
        _encode_items(obj.keys(), d.keys.add, blobs, _depth + 1)
        _encode_items(obj.values(), d.values.add, blobs, _depth + 1)
    else:
        raise WireError(f"a payload of type {type(obj).__qualname__} cannot cross agents; accepted: None, bool, "
                        "int, float, str, bytes, torch.Tensor, numpy.ndarray and tuple/list/dict of them")
    return out


def _encode_items(items: Any, add: Callable[[], pb.Value], blobs: _Blobs | None, depth: int) -> None:
    """Each of ``items`` into ``add()``, the common scalars without a call each (rows, packets)."""
    if items and depth > _MAX_DEPTH:
        raise WireError(f"payload nested deeper than {_MAX_DEPTH} levels")
    for x in items:
        tx = type(x)
        if tx is float:
            add().f = x
        elif tx is int and _INT64[0] <= x <= _INT64[1]:
            add().i = x
        elif tx is str:
            add().s = x
        else:
            encode_value(x, add(), blobs, depth)


def _put_bytes(t: pb.Tensor, mv: memoryview, blobs: _Blobs | None) -> None:
    if blobs is None:
        t.data = mv.tobytes()
    else:
        blobs.put(t, mv)


def decode_value(v: pb.Value, blobs: dict[int, bytearray] | None = None, _depth: int = 0,
                 peer: PeerFetch | None = None) -> Any:
    """The Python object ``v`` describes; raises WireError when it is malformed.

    ``peer`` resolves direct tensor references: the receiving agent's fetches the bytes, the controller's
    (:func:`keep_refs`) returns None to keep a :class:`BlobRef`; without it such a reference is refused.
    """
    if _depth > _MAX_DEPTH:
        raise WireError(f"value nested deeper than {_MAX_DEPTH} levels")
    kind = v.WhichOneof("kind")
    if kind == "none" or kind is None:
        return None
    if kind == "b":
        return v.b
    if kind == "i":
        return v.i
    if kind == "f":
        return v.f
    if kind == "s":
        return v.s
    if kind == "raw":
        return v.raw
    if kind == "tensor":
        return _decode_tensor(v.tensor, blobs, peer)
    if kind == "tuple":
        return tuple(_decode_items(v.tuple.items, blobs, _depth + 1, peer))
    if kind == "list":
        return _decode_items(v.list.items, blobs, _depth + 1, peer)
    if kind == "dict":
        d = v.dict
        if len(d.keys) != len(d.values):
            raise WireError("dict value with different numbers of keys and values")
        keys = _decode_items(d.keys, blobs, _depth + 1, peer)
        values = _decode_items(d.values, blobs, _depth + 1, peer)
        try:
            return dict(zip(keys, values))
        except TypeError as e:  # an unhashable key
            raise WireError(f"dict value with an unusable key: {e}") from e
    raise WireError(f"unknown value kind {kind!r}")  # pragma: no cover - oneof is closed


def _decode_items(items: Any, blobs: dict[int, bytearray] | None, depth: int, peer: PeerFetch | None) -> list:
    """The values of a tuple or list, the common scalars without a call each."""
    if depth > _MAX_DEPTH and len(items):
        raise WireError(f"value nested deeper than {_MAX_DEPTH} levels")
    out = []
    put = out.append
    for x in items:
        kind = x.WhichOneof("kind")
        if kind == "i":
            put(x.i)
        elif kind == "f":
            put(x.f)
        elif kind == "s":
            put(x.s)
        else:
            put(decode_value(x, blobs, depth, peer))
    return out


def _decode_tensor(t: pb.Tensor, blobs: dict[int, bytearray] | None, peer: PeerFetch | None = None) -> Any:
    shape = tuple(t.shape)
    if len(shape) > _MAX_DIMS or any(not 0 <= s <= _MAX_DIM for s in shape):
        raise WireError(f"tensor of shape {list(shape)}: accepted at most {_MAX_DIMS} dimensions "
                        f"of 0..{_MAX_DIM} each")
    numel = math.prod(shape)
    src = t.WhichOneof("bytes_in")
    if src == "peer":
        p = t.peer
        dt = _NUMPY_DTYPES.get(t.dtype) if t.numpy else _TORCH_DTYPES.get(t.dtype)
        if dt is None:
            raise WireError(f"unknown {'numpy' if t.numpy else 'tensor'} dtype {t.dtype!r}")
        itemsize = dt.itemsize if t.numpy else torch.empty((), dtype=dt).element_size()
        if p.nbytes != numel * itemsize:
            raise WireError(f"tensor of shape {shape} {t.dtype} needs {numel * itemsize} bytes, "
                            f"its direct reference says {p.nbytes}")
        if peer is None:
            raise WireError(f"tensor {p.id} was sent directly by agent {p.agent}, where no direct stream is expected")
        buf = peer(p.agent, p.id, p.nbytes)
        if buf is None:
            return BlobRef(p.agent, p.id, p.nbytes, t.dtype, shape, t.numpy)
    elif src == "blob":
        if blobs is None or t.blob not in blobs:
            raise WireError(f"tensor references blob {t.blob}, which was not sent before it")
        buf = blobs.pop(t.blob)
    else:
        buf = bytearray(t.data)
    if t.numpy:
        dt = _NUMPY_DTYPES.get(t.dtype)
        if dt is None:
            raise WireError(f"unknown numpy dtype {t.dtype!r}")
        if len(buf) != numel * dt.itemsize:
            raise WireError(f"array of shape {shape} {t.dtype} needs {numel * dt.itemsize} bytes, got {len(buf)}")
        try:
            return np.frombuffer(buf, dtype=dt).reshape(shape)
        except (ValueError, MemoryError) as e:  # e.g. a zero-sized array whose shape numpy cannot hold
            raise WireError(f"array of shape {list(shape)} {t.dtype} cannot be built: {e}") from e
    dtype = _TORCH_DTYPES.get(t.dtype)
    if dtype is None:
        raise WireError(f"unknown tensor dtype {t.dtype!r}; accepted: {', '.join(_TORCH_DTYPES)}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(buf) != numel * itemsize:
        raise WireError(f"tensor of shape {shape} {t.dtype} needs {numel * itemsize} bytes, got {len(buf)}")
    try:
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(buf, dtype=torch.uint8).view(dtype).reshape(shape)
    except (RuntimeError, ValueError, MemoryError) as e:
        raise WireError(f"tensor of shape {list(shape)} {t.dtype} cannot be built: {e}") from e


# ----------------------------------------------------------------- events
def encode_event(ev: RemoteEvent, out: pb.Event, blobs: _Blobs | None = None) -> pb.Event:
    out.time, out.priority, out.origin, out.seq, out.dst, out.kind = (
        ev.time, ev.priority, ev.origin, ev.seq, ev.dst, ev.kind)
    if ev.effect is not None:
        out.effect = ev.effect
    d = ev.data
    if ev.kind == "arrive" and isinstance(d, Transfer):
        t = out.transfer
        t.src, t.dst, t.src_name, t.dst_name, t.seq = d.src, d.dst, d.src_name, d.dst_name, d.seq
        t.nbytes, t.sent_at, t.e0, t.latency, t.cap = d.nbytes, d.sent_at, d.e0, d.latency, d.cap
        if d.tail is not None:
            t.tail = d.tail
        encode_value(d.tag, t.tag, blobs)
        encode_value(d.payload, t.payload, blobs)
    else:
        encode_value(d, out.value, blobs)
    return out


def decode_event(e: pb.Event, blobs: dict[int, bytearray] | None = None,
                 peer: PeerFetch | None = None) -> RemoteEvent:
    which = e.WhichOneof("data")
    if which == "transfer":
        t = e.transfer
        data: Any = Transfer(t.src, t.dst, t.src_name, t.dst_name, t.seq, decode_value(t.tag, blobs, 0, peer),
                             decode_value(t.payload, blobs, 0, peer), t.nbytes, t.sent_at, t.e0, t.latency,
                             t.tail if t.HasField("tail") else None, t.cap)
    elif which == "value":
        data = decode_value(e.value, blobs, 0, peer)
    else:
        raise WireError(f"event of kind {e.kind!r} without data")
    effect = e.effect if e.HasField("effect") else None
    if effect is not None and effect < e.time:
        raise WireError(f"event at {e.time} ns claims to act earlier, at {effect} ns")
    return RemoteEvent(e.time, e.priority, e.origin, e.seq, e.dst, e.kind, data, effect)


def encode_stats(s: Stats, out: pb.Stats) -> pb.Stats:
    out.events, out.messages_local, out.messages_remote = s.events, s.messages_local, s.messages_remote
    out.bytes_local, out.bytes_remote = s.bytes_local, s.bytes_remote
    out.compute_wall_s.update(s.compute_wall_s)
    out.compute_virtual_ns.update(s.compute_virtual_ns)
    return out


def decode_stats(s: pb.Stats) -> Stats:
    return Stats(s.events, s.messages_local, s.messages_remote, s.bytes_local, s.bytes_remote,
                 dict(s.compute_wall_s), dict(s.compute_virtual_ns))


# ----------------------------------------------------------------- frames
def serialize_frame(frame: Any) -> bytes:
    """The Session stream's serializer, both ways: a frame message, or the bytes of one already serialized
    (:func:`append_bytes`), which gRPC then sends as they are."""
    return frame if type(frame) is bytes else frame.SerializeToString()


def _len_field(number: int, length: int) -> bytes:
    """A length-delimited field's tag and length (protobuf's wire format: varints)."""
    out = bytearray()
    for n in (number << 3 | 2, length):
        while n > 0x7F:
            out.append(n & 0x7F | 0x80)
            n >>= 7
        out.append(n)
    return bytes(out)


_SEQ_ITEMS, _TUPLE, _RAW = (pb.Seq.DESCRIPTOR.fields_by_name["items"].number,
                            pb.Value.DESCRIPTOR.fields_by_name["tuple"].number,
                            pb.Value.DESCRIPTOR.fields_by_name["raw"].number)
_PATHS: dict[tuple[type, tuple[str, ...]], tuple[int, ...]] = {}


def _field_numbers(frame_cls: type, path: tuple[str, ...]) -> tuple[int, ...]:
    """The field numbers of ``path`` (field names from ``frame_cls`` down to a ``Value``)."""
    got = _PATHS.get((frame_cls, path))
    if got is None:
        desc, numbers = frame_cls.DESCRIPTOR, []
        for name in path:
            f = desc.fields_by_name[name]
            numbers.append(f.number)
            desc = f.message_type
        if desc is not pb.Value.DESCRIPTOR:
            raise ValueError(f"{'.'.join(path)} of {frame_cls.__name__} is not a Value")
        got = _PATHS[(frame_cls, path)] = tuple(numbers)
    return got


def append_bytes(frame: Any, path: tuple[str, ...], data: Any) -> bytes:
    """``frame`` serialized with ``bytes(data)`` appended as the last item of the tuple ``Value`` at ``path``
    (e.g. ``("reply", "value")`` of an ``AgentFrame``), with ``data`` (any bytes-like object) copied once, into
    the result.

    Building the frame instead copies a 4 MiB checkpoint piece four times (into ``bytes``, into the message,
    ``ByteSize`` and gRPC's ``SerializeToString`` each encode it), each copy into freshly mapped pages in a
    compact agent (docs/benchmarks.md, "Checkpoints at 10 000 vworkers on agents"). Here ``frame`` is serialized
    as it is and the item follows as a second message holding only it: protobuf's parser merges concatenated
    messages (a repeated field appends), so the peer reads the frame the message would have made
    (``tests/distributed/test_wire.py``). The stream must send bytes as they are (:func:`serialize_frame`)."""
    n = memoryview(data).nbytes
    parts = [_len_field(_RAW, n)]
    size = len(parts[0]) + n
    for number in (_SEQ_ITEMS, _TUPLE, *reversed(_field_numbers(type(frame), path))):  # from the inside out
        parts.append(_len_field(number, size))
        size += len(parts[-1])
    return b"".join((frame.SerializeToString(), *reversed(parts), data))


def reply_bytes(call_id: int, items: tuple, data: Any) -> bytes:
    """The serialized ``AgentFrame`` replying ``(*items, bytes(data))`` to call ``call_id`` (:func:`append_bytes`)."""
    head = pb.AgentFrame()
    head.reply.id = call_id
    encode_value(tuple(items), head.reply.value)
    return append_bytes(head, ("reply", "value"), data)


class FrameWriter:
    """Turns one logical frame into gRPC messages of at most ``max_message_bytes`` each.

    Usage: ``blobs = w.blobs()``; fill the frame with ``encode_*(..., blobs)``;
    ``yield from w.frames(frame, blobs)``.
    """

    def __init__(self, frame_cls: type, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
        if max_message_bytes < 4 * _FRAME_OVERHEAD:
            raise ValueError(f"max_message_bytes={max_message_bytes} is too small; accepted: >= {4 * _FRAME_OVERHEAD}")
        self.frame_cls = frame_cls
        self.max_message_bytes = max_message_bytes
        self.chunk_bytes = max_message_bytes - _FRAME_OVERHEAD
        self.inline_limit = min(64 * 1024, max_message_bytes // 16)
        self._next_blob = 0

    def new_blob_id(self) -> int:
        self._next_blob += 1
        return self._next_blob

    def blobs(self) -> _Blobs:
        return _Blobs(self)

    def _chunks(self, bid: int, mv: memoryview) -> Iterator[Any]:
        total = mv.nbytes
        step = self.chunk_bytes
        mv = mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv
        off = 0
        while True:
            f = self.frame_cls()
            f.chunk.blob, f.chunk.total, f.chunk.offset = bid, total, off
            f.chunk.data = mv[off:off + step].tobytes()
            yield f
            off += step
            if off >= total:
                return

    def frames(self, frame: Any, blobs: _Blobs | None = None) -> Iterator[Any]:
        """The chunk frames of ``blobs``, then ``frame`` (as an envelope blob when it is too large)."""
        if blobs is not None:
            for bid, mv in blobs.out:
                yield from self._chunks(bid, mv)
            blobs.out = []
        if frame.ByteSize() > self.max_message_bytes - _FRAME_OVERHEAD:
            bid = self.new_blob_id()
            yield from self._chunks(bid, memoryview(frame.SerializeToString()))
            env = self.frame_cls()
            env.envelope = bid
            yield env
        else:
            yield frame


class FrameReader:
    """Reassembles frames: ``feed`` keeps chunks and returns each complete logical frame (else None).

    After a frame is returned, ``self.blobs`` holds the blobs its tensors reference. A blob's
    buffer grows with the chunks that arrive; what the peer declares (``total``) is only checked
    against ``limits`` — a 10-byte chunk announcing a gigabyte costs 10 bytes, then an error.
    """

    def __init__(self, frame_cls: type, limits: Limits | None = None):
        self.frame_cls = frame_cls
        self.limits = limits or Limits()
        self.partial: dict[int, tuple[bytearray, int]] = {}  # blob -> (bytes so far, declared total)
        self.blobs: dict[int, bytearray] = {}
        self.held = 0  # bytes in partial and complete blobs not yet used by a frame

    def feed(self, frame: Any) -> Any | None:
        body = frame.WhichOneof("body")
        if body is None:
            raise WireError("empty frame")
        if body == "chunk":
            self._chunk(frame.chunk)
            return None
        if body == "envelope":
            buf = self.blobs.pop(frame.envelope, None)
            if buf is None:
                raise WireError(f"envelope references blob {frame.envelope}, which was not sent before it")
            self.held -= len(buf)
            inner = self.frame_cls()
            try:
                inner.ParseFromString(bytes(buf))
            except Exception as e:  # noqa: BLE001 - protobuf raises DecodeError (a plain Exception)
                raise WireError(f"envelope blob {frame.envelope} is not a valid frame: {e}") from e
            if inner.WhichOneof("body") in ("chunk", "envelope", None):
                raise WireError("an envelope must hold a message frame")
            return inner
        return frame

    def _chunk(self, c: Any) -> None:
        lim = self.limits
        if not 0 <= c.total <= lim.max_blob_bytes:
            raise WireError(f"blob {c.blob} announces {c.total} bytes; at most {lim.max_blob_bytes} accepted "
                            "(controller.max_blob_bytes)")
        entry = self.partial.get(c.blob)
        if entry is None:
            if c.blob in self.blobs:
                raise WireError(f"blob {c.blob} sent twice")
            if len(self.partial) + len(self.blobs) >= lim.max_pending_blobs:
                raise WireError(f"more than {lim.max_pending_blobs} blobs held before a frame used them")
            buf, total = bytearray(), c.total
        else:
            buf, total = entry
        got, n = len(buf), len(c.data)
        if total != c.total or c.offset != got or got + n > total:
            raise WireError(f"blob {c.blob}: chunk at offset {c.offset} (+{n} B) does not continue "
                            f"{got} of {total} bytes")
        if self.held + n > lim.max_pending_bytes:
            raise WireError(f"more than {lim.max_pending_bytes} bytes of blobs held before a frame used them "
                            "(controller.max_held_bytes)")
        buf += c.data  # grows with what arrived, never to the declared size up front
        self.held += n
        if got + n == total:
            self.partial.pop(c.blob, None)
            self.blobs[c.blob] = buf
        else:
            self.partial[c.blob] = (buf, total)

    def hand_over(self) -> dict[int, bytearray]:
        """The blobs of the frame just returned, now the caller's (held bytes drop to the partial ones)."""
        blobs, self.blobs = self.blobs, {}
        self.held = sum(len(b) for b, _ in self.partial.values())
        return blobs

    def done(self) -> None:
        """Forget blobs no tensor used (a well-behaved peer leaves none)."""
        self.hand_over()

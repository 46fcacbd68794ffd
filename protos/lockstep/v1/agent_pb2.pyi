from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterRequest(_message.Message):
    __slots__ = ("agent_id", "protocol_version", "device", "run_id", "hostname", "pid", "data_address", "data_secret")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    DATA_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DATA_SECRET_FIELD_NUMBER: _ClassVar[int]
    agent_id: int
    protocol_version: int
    device: str
    run_id: str
    hostname: str
    pid: int
    data_address: str
    data_secret: bytes
    def __init__(self, agent_id: _Optional[int] = ..., protocol_version: _Optional[int] = ..., device: _Optional[str] = ..., run_id: _Optional[str] = ..., hostname: _Optional[str] = ..., pid: _Optional[int] = ..., data_address: _Optional[str] = ..., data_secret: _Optional[bytes] = ...) -> None: ...

class Assignment(_message.Message):
    __slots__ = ("agent_id", "plan_json", "ticket", "max_message_bytes", "heartbeat_s", "protocol_version")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    TICKET_FIELD_NUMBER: _ClassVar[int]
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_S_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    agent_id: int
    plan_json: str
    ticket: str
    max_message_bytes: int
    heartbeat_s: float
    protocol_version: int
    def __init__(self, agent_id: _Optional[int] = ..., plan_json: _Optional[str] = ..., ticket: _Optional[str] = ..., max_message_bytes: _Optional[int] = ..., heartbeat_s: _Optional[float] = ..., protocol_version: _Optional[int] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("none", "b", "i", "f", "s", "raw", "tensor", "tuple", "list", "dict")
    NONE_FIELD_NUMBER: _ClassVar[int]
    B_FIELD_NUMBER: _ClassVar[int]
    I_FIELD_NUMBER: _ClassVar[int]
    F_FIELD_NUMBER: _ClassVar[int]
    S_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    TUPLE_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    DICT_FIELD_NUMBER: _ClassVar[int]
    none: bool
    b: bool
    i: int
    f: float
    s: str
    raw: bytes
    tensor: Tensor
    tuple: Seq
    list: Seq
    dict: Dict
    def __init__(self, none: _Optional[bool] = ..., b: _Optional[bool] = ..., i: _Optional[int] = ..., f: _Optional[float] = ..., s: _Optional[str] = ..., raw: _Optional[bytes] = ..., tensor: _Optional[_Union[Tensor, _Mapping]] = ..., tuple: _Optional[_Union[Seq, _Mapping]] = ..., list: _Optional[_Union[Seq, _Mapping]] = ..., dict: _Optional[_Union[Dict, _Mapping]] = ...) -> None: ...

class Seq(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, items: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class Dict(_message.Message):
    __slots__ = ("keys", "values")
    KEYS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[Value]
    values: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, keys: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., values: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "numpy", "data", "blob", "peer")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NUMPY_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    BLOB_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    numpy: bool
    data: bytes
    blob: int
    peer: PeerBlob
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., numpy: _Optional[bool] = ..., data: _Optional[bytes] = ..., blob: _Optional[int] = ..., peer: _Optional[_Union[PeerBlob, _Mapping]] = ...) -> None: ...

class PeerBlob(_message.Message):
    __slots__ = ("agent", "id", "nbytes")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    agent: int
    id: int
    nbytes: int
    def __init__(self, agent: _Optional[int] = ..., id: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class Peer(_message.Message):
    __slots__ = ("agent_id", "address", "secret")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    agent_id: int
    address: str
    secret: bytes
    def __init__(self, agent_id: _Optional[int] = ..., address: _Optional[str] = ..., secret: _Optional[bytes] = ...) -> None: ...

class Peers(_message.Message):
    __slots__ = ("peers",)
    PEERS_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.RepeatedCompositeFieldContainer[Peer]
    def __init__(self, peers: _Optional[_Iterable[_Union[Peer, _Mapping]]] = ...) -> None: ...

class BlobChunk(_message.Message):
    __slots__ = ("blob", "total", "offset", "data")
    BLOB_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    blob: int
    total: int
    offset: int
    data: bytes
    def __init__(self, blob: _Optional[int] = ..., total: _Optional[int] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class Transfer(_message.Message):
    __slots__ = ("src", "dst", "src_name", "dst_name", "seq", "tag", "payload", "nbytes", "sent_at", "e0", "latency", "tail", "cap")
    SRC_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    SRC_NAME_FIELD_NUMBER: _ClassVar[int]
    DST_NAME_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TAG_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    E0_FIELD_NUMBER: _ClassVar[int]
    LATENCY_FIELD_NUMBER: _ClassVar[int]
    TAIL_FIELD_NUMBER: _ClassVar[int]
    CAP_FIELD_NUMBER: _ClassVar[int]
    src: int
    dst: int
    src_name: str
    dst_name: str
    seq: int
    tag: Value
    payload: Value
    nbytes: int
    sent_at: int
    e0: int
    latency: int
    tail: int
    cap: float
    def __init__(self, src: _Optional[int] = ..., dst: _Optional[int] = ..., src_name: _Optional[str] = ..., dst_name: _Optional[str] = ..., seq: _Optional[int] = ..., tag: _Optional[_Union[Value, _Mapping]] = ..., payload: _Optional[_Union[Value, _Mapping]] = ..., nbytes: _Optional[int] = ..., sent_at: _Optional[int] = ..., e0: _Optional[int] = ..., latency: _Optional[int] = ..., tail: _Optional[int] = ..., cap: _Optional[float] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("time", "priority", "origin", "seq", "dst", "kind", "transfer", "value", "effect")
    TIME_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DST_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    time: int
    priority: int
    origin: int
    seq: int
    dst: int
    kind: str
    transfer: Transfer
    value: Value
    effect: int
    def __init__(self, time: _Optional[int] = ..., priority: _Optional[int] = ..., origin: _Optional[int] = ..., seq: _Optional[int] = ..., dst: _Optional[int] = ..., kind: _Optional[str] = ..., transfer: _Optional[_Union[Transfer, _Mapping]] = ..., value: _Optional[_Union[Value, _Mapping]] = ..., effect: _Optional[int] = ...) -> None: ...

class Stats(_message.Message):
    __slots__ = ("events", "messages_local", "messages_remote", "bytes_local", "bytes_remote", "compute_wall_s", "compute_virtual_ns")
    class ComputeWallSEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class ComputeVirtualNsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_LOCAL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_REMOTE_FIELD_NUMBER: _ClassVar[int]
    BYTES_LOCAL_FIELD_NUMBER: _ClassVar[int]
    BYTES_REMOTE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_WALL_S_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_VIRTUAL_NS_FIELD_NUMBER: _ClassVar[int]
    events: int
    messages_local: int
    messages_remote: int
    bytes_local: int
    bytes_remote: int
    compute_wall_s: _containers.ScalarMap[str, float]
    compute_virtual_ns: _containers.ScalarMap[str, int]
    def __init__(self, events: _Optional[int] = ..., messages_local: _Optional[int] = ..., messages_remote: _Optional[int] = ..., bytes_local: _Optional[int] = ..., bytes_remote: _Optional[int] = ..., compute_wall_s: _Optional[_Mapping[str, float]] = ..., compute_virtual_ns: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Advance(_message.Message):
    __slots__ = ("window", "window_end", "stop_at", "max_events", "inbound")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    WINDOW_END_FIELD_NUMBER: _ClassVar[int]
    STOP_AT_FIELD_NUMBER: _ClassVar[int]
    MAX_EVENTS_FIELD_NUMBER: _ClassVar[int]
    INBOUND_FIELD_NUMBER: _ClassVar[int]
    window: int
    window_end: int
    stop_at: int
    max_events: int
    inbound: _containers.RepeatedCompositeFieldContainer[Event]
    def __init__(self, window: _Optional[int] = ..., window_end: _Optional[int] = ..., stop_at: _Optional[int] = ..., max_events: _Optional[int] = ..., inbound: _Optional[_Iterable[_Union[Event, _Mapping]]] = ...) -> None: ...

class Call(_message.Message):
    __slots__ = ("id", "method", "args")
    ID_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    id: int
    method: str
    args: Value
    def __init__(self, id: _Optional[int] = ..., method: _Optional[str] = ..., args: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...

class Shutdown(_message.Message):
    __slots__ = ("abort", "reason")
    ABORT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    abort: bool
    reason: str
    def __init__(self, abort: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class ControllerFrame(_message.Message):
    __slots__ = ("chunk", "advance", "call", "shutdown", "envelope", "peers")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    ADVANCE_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    chunk: BlobChunk
    advance: Advance
    call: Call
    shutdown: Shutdown
    envelope: int
    peers: Peers
    def __init__(self, chunk: _Optional[_Union[BlobChunk, _Mapping]] = ..., advance: _Optional[_Union[Advance, _Mapping]] = ..., call: _Optional[_Union[Call, _Mapping]] = ..., shutdown: _Optional[_Union[Shutdown, _Mapping]] = ..., envelope: _Optional[int] = ..., peers: _Optional[_Union[Peers, _Mapping]] = ...) -> None: ...

class Ready(_message.Message):
    __slots__ = ("next_time", "metrics_address", "horizon")
    NEXT_TIME_FIELD_NUMBER: _ClassVar[int]
    METRICS_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HORIZON_FIELD_NUMBER: _ClassVar[int]
    next_time: int
    metrics_address: str
    horizon: int
    def __init__(self, next_time: _Optional[int] = ..., metrics_address: _Optional[str] = ..., horizon: _Optional[int] = ...) -> None: ...

class Reached(_message.Message):
    __slots__ = ("window", "next_time", "outbound", "stop_time", "updates", "evals", "events", "stats", "horizon")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    NEXT_TIME_FIELD_NUMBER: _ClassVar[int]
    OUTBOUND_FIELD_NUMBER: _ClassVar[int]
    STOP_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    EVALS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    HORIZON_FIELD_NUMBER: _ClassVar[int]
    window: int
    next_time: int
    outbound: _containers.RepeatedCompositeFieldContainer[Event]
    stop_time: int
    updates: Value
    evals: Value
    events: Value
    stats: Stats
    horizon: int
    def __init__(self, window: _Optional[int] = ..., next_time: _Optional[int] = ..., outbound: _Optional[_Iterable[_Union[Event, _Mapping]]] = ..., stop_time: _Optional[int] = ..., updates: _Optional[_Union[Value, _Mapping]] = ..., evals: _Optional[_Union[Value, _Mapping]] = ..., events: _Optional[_Union[Value, _Mapping]] = ..., stats: _Optional[_Union[Stats, _Mapping]] = ..., horizon: _Optional[int] = ...) -> None: ...

class Reply(_message.Message):
    __slots__ = ("id", "value")
    ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    id: int
    value: Value
    def __init__(self, id: _Optional[int] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("sent_unix_ns",)
    SENT_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    sent_unix_ns: int
    def __init__(self, sent_unix_ns: _Optional[int] = ...) -> None: ...

class Failure(_message.Message):
    __slots__ = ("error",)
    ERROR_FIELD_NUMBER: _ClassVar[int]
    error: str
    def __init__(self, error: _Optional[str] = ...) -> None: ...

class AgentFrame(_message.Message):
    __slots__ = ("chunk", "ready", "reached", "reply", "failure", "envelope")
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    REACHED_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    chunk: BlobChunk
    ready: Ready
    reached: Reached
    reply: Reply
    failure: Failure
    envelope: int
    def __init__(self, chunk: _Optional[_Union[BlobChunk, _Mapping]] = ..., ready: _Optional[_Union[Ready, _Mapping]] = ..., reached: _Optional[_Union[Reached, _Mapping]] = ..., reply: _Optional[_Union[Reply, _Mapping]] = ..., failure: _Optional[_Union[Failure, _Mapping]] = ..., envelope: _Optional[int] = ...) -> None: ...

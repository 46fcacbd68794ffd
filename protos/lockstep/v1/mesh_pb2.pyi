from protos.lockstep.v1 import agent_pb2 as _agent_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Routed(_message.Message):
    __slots__ = ("agent", "count", "min_time", "min_effect")
    AGENT_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MIN_TIME_FIELD_NUMBER: _ClassVar[int]
    MIN_EFFECT_FIELD_NUMBER: _ClassVar[int]
    agent: int
    count: int
    min_time: int
    min_effect: int
    def __init__(self, agent: _Optional[int] = ..., count: _Optional[int] = ..., min_time: _Optional[int] = ..., min_effect: _Optional[int] = ...) -> None: ...

class MeshReport(_message.Message):
    __slots__ = ("window", "next_time", "horizon", "stop_time", "events", "routed")
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    NEXT_TIME_FIELD_NUMBER: _ClassVar[int]
    HORIZON_FIELD_NUMBER: _ClassVar[int]
    STOP_TIME_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ROUTED_FIELD_NUMBER: _ClassVar[int]
    window: int
    next_time: int
    horizon: int
    stop_time: int
    events: _containers.RepeatedCompositeFieldContainer[_agent_pb2.Event]
    routed: _containers.RepeatedCompositeFieldContainer[Routed]
    def __init__(self, window: _Optional[int] = ..., next_time: _Optional[int] = ..., horizon: _Optional[int] = ..., stop_time: _Optional[int] = ..., events: _Optional[_Iterable[_Union[_agent_pb2.Event, _Mapping]]] = ..., routed: _Optional[_Iterable[_Union[Routed, _Mapping]]] = ...) -> None: ...

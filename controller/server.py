"""The controller's gRPC service: authenticate agents, hand out assignments, carry the window streams.

``Register`` checks the shared token (constant-time) and the protocol version
before anything else: a client that fails gets UNAUTHENTICATED or
FAILED_PRECONDITION and never sees the plan or touches the run. A successful
registration returns the plan and a per-agent *ticket*; the ``Session`` stream
must present that ticket in its metadata. Each session's frames are
reassembled and decoded on the stream's own thread; a malformed frame fails
that agent's session (the run then stops with an error naming it) but never
the controller process.
"""
from __future__ import annotations

import hmac
import logging
import queue
import secrets
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Iterator

import grpc

from agents import wire
from protos.lockstep.v1 import agent_pb2 as pb
from protos.lockstep.v1 import agent_pb2_grpc as pb_grpc

__all__ = ["ControllerServer", "AgentSession", "ControllerSettings"]

log = logging.getLogger("lockstep.controller")


@dataclass(frozen=True)
class ControllerSettings:
    """The ``controller:`` section of the config (see conf/config.yaml); the server reads the first four."""

    host: str = "127.0.0.1"
    port: int = 0
    max_message_bytes: int = wire.DEFAULT_MAX_MESSAGE_BYTES
    heartbeat_s: float = 1.0
    agent_timeout_s: float = 30.0
    startup_timeout_s: float = 120.0
    token_file: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> "ControllerSettings":
        d = dict(d or {})
        return cls(**{f: d[f] for f in cls.__dataclass_fields__ if f in d})


class AgentSession:
    """One registered agent: its inbox of decoded frames, its outbox of frames, liveness."""

    def __init__(self, agent_id: int, ticket: str, info: dict[str, Any], max_message_bytes: int):
        self.agent_id, self.ticket, self.info = agent_id, ticket, info
        self.inbox: queue.Queue = queue.Queue()  # ("frame", msg, blobs) | ("closed", reason)
        self.outbox: queue.Queue = queue.Queue()  # ControllerFrame | None (end of stream)
        self.writer = wire.FrameWriter(pb.ControllerFrame, max_message_bytes)
        self.attached = False
        self.closed = threading.Event()
        self.last_seen = time.monotonic()
        self.registered_at = self.last_seen

    def send(self, frame: pb.ControllerFrame, blobs: Any = None) -> None:
        for f in self.writer.frames(frame, blobs):
            self.outbox.put(f)

    def end(self) -> None:
        """Close the stream from our side (after a Shutdown frame)."""
        self.outbox.put(None)

    def _read(self, requests: Iterator[pb.AgentFrame], context: grpc.ServicerContext) -> None:
        reader = wire.FrameReader(pb.AgentFrame)
        reason = "the agent closed its stream"
        try:
            for frame in requests:
                self.last_seen = time.monotonic()
                msg = reader.feed(frame)
                if msg is None or msg.WhichOneof("body") == "heartbeat":
                    continue
                blobs, reader.blobs = reader.blobs, {}
                self.inbox.put(("frame", msg, blobs))
        except wire.WireError as e:
            reason = f"sent a malformed message: {e}"
            context.cancel()
        except grpc.RpcError as e:  # the stream broke: the process died, or garbage bytes
            code = getattr(e, "code", lambda: None)()
            detail = getattr(e, "details", lambda: None)() or "connection lost"
            reason = f"its stream broke ({code.name if code else 'cancelled'}: {detail})"
        except Exception as e:  # noqa: BLE001 - e.g. a frame the deserializer refused
            reason = f"its stream failed ({type(e).__name__}: {e})"
        self.inbox.put(("closed", reason))
        self.closed.set()


class _Servicer(pb_grpc.ControllerServicer):
    def __init__(self, server: "ControllerServer"):
        self.s = server

    def Register(self, request: pb.RegisterRequest, context: grpc.ServicerContext) -> pb.Assignment:
        s = self.s
        peer = context.peer()
        if not request.token or not hmac.compare_digest(request.token.encode(), s.token.encode()):
            s.refused.append((peer, "UNAUTHENTICATED"))
            log.warning("refused a registration from %s: missing or wrong token", peer)
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "missing or wrong token: agents must present this run's token ($LOCKSTEP_TOKEN)")
        if request.protocol_version != wire.PROTOCOL_VERSION:
            s.refused.append((peer, "FAILED_PRECONDITION"))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"agent speaks protocol version {request.protocol_version}; this controller speaks "
                          f"version {wire.PROTOCOL_VERSION}: run the same lockstep version on both sides")
        if request.run_id and request.run_id != s.run_id:
            s.refused.append((peer, "FAILED_PRECONDITION"))
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"agent was started for run {request.run_id!r}; this controller runs {s.run_id!r}")
        if not 0 <= request.agent_id < s.n_agents:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"agent id {request.agent_id} is out of range; this run has agents 0..{s.n_agents - 1}")
        with s.lock:
            if request.agent_id in s.sessions:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"agent {request.agent_id} is already registered")
            ticket = secrets.token_urlsafe(16)
            info = {"peer": peer, "hostname": request.hostname, "pid": request.pid, "device": request.device,
                    "data_address": request.data_address, "data_secret": request.data_secret}
            s.sessions[request.agent_id] = AgentSession(request.agent_id, ticket, info, s.settings.max_message_bytes)
            s.changed.notify_all()
        log.info("agent %d registered from %s (pid %d on %s, %s)", request.agent_id, peer, request.pid,
                 request.hostname, request.device)
        return pb.Assignment(agent_id=request.agent_id, plan_json=s.plan_json, ticket=ticket,
                             max_message_bytes=s.settings.max_message_bytes, heartbeat_s=s.settings.heartbeat_s,
                             protocol_version=wire.PROTOCOL_VERSION)

    def Session(self, request_iterator: Iterator[pb.AgentFrame], context: grpc.ServicerContext):
        s = self.s
        md = dict(context.invocation_metadata())
        try:
            aid = int(md.get("lockstep-agent-id", ""))
        except ValueError:
            aid = -1
        with s.lock:
            sess = s.sessions.get(aid)
            ok = sess is not None and hmac.compare_digest(str(md.get("lockstep-ticket", "")).encode(),
                                                          sess.ticket.encode())
            if ok and sess.attached:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"agent {aid} already has a session")
            if ok:
                sess.attached = True
        if not ok:
            s.refused.append((context.peer(), "UNAUTHENTICATED"))
            context.abort(grpc.StatusCode.UNAUTHENTICATED,
                          "a Session needs the lockstep-agent-id and lockstep-ticket metadata returned by Register")
        threading.Thread(target=sess._read, args=(request_iterator, context), daemon=True,
                         name=f"agent-{aid}-reader").start()
        while True:
            try:
                f = sess.outbox.get(timeout=0.5)
            except queue.Empty:
                if sess.closed.is_set() or not context.is_active():
                    return
                continue
            if f is None:
                return
            yield f


class ControllerServer:
    """The gRPC server of one run."""

    def __init__(self, token: str, run_id: str, plan_json: str, n_agents: int,
                 settings: ControllerSettings = ControllerSettings()):
        if not token:
            raise ValueError("the controller needs a non-empty token")
        self.token, self.run_id, self.plan_json, self.n_agents = token, run_id, plan_json, n_agents
        self.settings = settings
        self.sessions: dict[int, AgentSession] = {}
        self.refused: list[tuple[str, str]] = []  # (peer, status) of clients turned away
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        limit = settings.max_message_bytes + 64 * 1024
        # every session holds a thread (plus one reader): size the pool for all agents and a few intruders
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=2 * n_agents + 8, thread_name_prefix="grpc"),
            options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit),
                     ("grpc.so_reuseport", 0)],
            maximum_concurrent_rpcs=2 * n_agents + 8)
        pb_grpc.add_ControllerServicer_to_server(_Servicer(self), self._server)
        self.port: int | None = None

    @property
    def address(self) -> str:
        return f"{self.settings.host}:{self.port}"

    def start(self) -> str:
        port = self._server.add_insecure_port(f"{self.settings.host}:{self.settings.port}")
        if port == 0:
            raise OSError(f"cannot listen on {self.settings.host}:{self.settings.port} "
                          "(controller.host / controller.port)")
        self.port = port
        self._server.start()
        log.info("controller listening on %s", self.address)
        return self.address

    def stop(self, grace: float | None = 0.5) -> None:
        for sess in list(self.sessions.values()):
            sess.end()
        self._server.stop(grace).wait(5)

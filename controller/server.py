"""The controller's gRPC service: authenticate agents, hand out assignments, carry the window streams.

``Register`` checks the shared token (constant-time) and the protocol version
before anything else: a client that fails gets UNAUTHENTICATED or
FAILED_PRECONDITION and never sees the plan or touches the run. A successful
registration returns the plan and a per-agent *ticket*; the ``Session`` stream
must present that ticket in its metadata (so must each ``Beat``, the
agent's heartbeat). The server runs on a ``grpc.aio`` event loop in a thread
of its own; each session's frames are reassembled and decoded there, and a
malformed frame fails that agent's session (the run then stops with an error
naming it) but never the controller process.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import queue
import secrets
import threading
import time
from typing import Any

import grpc

from agents.common import wire
from controller.config.schema import ControllerConfig
from protos.lockstep.v1 import agent_pb2 as pb
from protos.lockstep.v1 import agent_pb2_grpc as pb_grpc

__all__ = ["ControllerServer", "AgentSession", "ControllerSettings"]

log = logging.getLogger("lockstep.controller")


ControllerSettings = ControllerConfig
"""The ``controller:`` section of the config (its schema, with the one set of defaults); the server reads it."""


class AgentSession:
    """One registered agent: its inbox of decoded frames, its outbox of frames, liveness.

    The stream itself lives on the server's event loop; :meth:`send` and
    :meth:`end` may be called from any thread, and the inbox is a plain
    ``queue.Queue`` the window loop blocks on.
    """

    def __init__(self, agent_id: int, ticket: str, info: dict[str, Any], max_message_bytes: int,
                 loop: asyncio.AbstractEventLoop):
        self.agent_id, self.ticket, self.info = agent_id, ticket, info
        self.inbox: queue.Queue = queue.Queue()  # ("frame", msg, blobs) | ("closed", reason)
        self.loop = loop
        self.outbox: asyncio.Queue = asyncio.Queue()  # lists of ControllerFrames | None (end of stream)
        self.writer = wire.FrameWriter(pb.ControllerFrame, max_message_bytes)
        self.attached = False
        self.closed = threading.Event()
        self.last_seen = time.monotonic()
        self.registered_at = self.last_seen

    def send(self, frame: pb.ControllerFrame, blobs: Any = None) -> None:
        self._post(list(self.writer.frames(frame, blobs)))

    def end(self) -> None:
        """Close the stream from our side (after a Shutdown frame)."""
        self._post(None)

    def _post(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.outbox.put_nowait, item)
        except RuntimeError:  # the server has stopped: nothing can reach the agent any more
            log.debug("agent %d: frame dropped, the server has stopped", self.agent_id)

    async def _read(self, context: grpc.aio.ServicerContext) -> None:
        reader = wire.FrameReader(pb.AgentFrame)
        reason = "the agent closed its stream"
        try:
            while True:
                frame = await context.read()
                if frame is grpc.aio.EOF:
                    break
                self.last_seen = time.monotonic()
                msg = reader.feed(frame)
                if msg is None:
                    continue
                blobs, reader.blobs = reader.blobs, {}
                self.inbox.put(("frame", msg, blobs))
        except wire.WireError as e:
            reason = f"sent a malformed message: {e}"
            context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
            context.set_details(reason)
        except asyncio.CancelledError:
            reason = "its stream was cancelled"
        except grpc.RpcError as e:  # the stream broke: the process died, or garbage bytes
            code = getattr(e, "code", lambda: None)()
            detail = getattr(e, "details", lambda: None)() or "connection lost"
            reason = f"its stream broke ({code.name if code else 'cancelled'}: {detail})"
        except Exception as e:  # noqa: BLE001 - e.g. a frame the deserializer refused
            reason = f"its stream failed ({type(e).__name__}: {e})"
            context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
            context.set_details(reason)
        self.inbox.put(("closed", reason))
        self.closed.set()
        self.outbox.put_nowait(None)  # ends the handler, which ends the call


class _Servicer(pb_grpc.ControllerServicer):
    def __init__(self, server: "ControllerServer"):
        self.s = server

    async def Register(self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext) -> pb.Assignment:
        s = self.s
        peer = context.peer()
        if not request.token or not hmac.compare_digest(request.token.encode(), s.token.encode()):
            s.refused.append((peer, "UNAUTHENTICATED"))
            log.warning("refused a registration from %s: missing or wrong token", peer)
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "missing or wrong token: agents must present this run's token ($LOCKSTEP_TOKEN)")
        if request.protocol_version != wire.PROTOCOL_VERSION:
            s.refused.append((peer, "FAILED_PRECONDITION"))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"agent speaks protocol version {request.protocol_version}; this controller speaks "
                                f"version {wire.PROTOCOL_VERSION}: run the same lockstep version on both sides")
        if request.run_id and request.run_id != s.run_id:
            s.refused.append((peer, "FAILED_PRECONDITION"))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"agent was started for run {request.run_id!r}; this controller runs {s.run_id!r}")
        if not 0 <= request.agent_id < s.n_agents:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"agent id {request.agent_id} is out of range; this run has agents 0..{s.n_agents - 1}")
        with s.lock:
            if request.agent_id in s.sessions:
                exists = True
            else:
                exists = False
                ticket = secrets.token_urlsafe(16)
                info = {"peer": peer, "hostname": request.hostname, "pid": request.pid, "device": request.device,
                        "data_address": request.data_address, "data_secret": request.data_secret}
                s.sessions[request.agent_id] = AgentSession(request.agent_id, ticket, info,
                                                            s.settings.max_message_bytes, s.loop)
                s.changed.notify_all()
        if exists:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"agent {request.agent_id} is already registered")
        log.info("agent %d registered from %s (pid %d on %s, %s)", request.agent_id, peer, request.pid,
                 request.hostname, request.device)
        return pb.Assignment(agent_id=request.agent_id, plan_json=s.plan_json, ticket=ticket,
                             max_message_bytes=s.settings.max_message_bytes, heartbeat_s=s.settings.heartbeat_s,
                             protocol_version=wire.PROTOCOL_VERSION)

    def _ticket_holder(self, context: grpc.aio.ServicerContext) -> AgentSession | None:
        """The session whose id and ticket the call's metadata present, or None."""
        md = dict(context.invocation_metadata() or ())
        try:
            aid = int(md.get("lockstep-agent-id", ""))
        except ValueError:
            return None
        sess = self.s.sessions.get(aid)
        if sess is None or not hmac.compare_digest(str(md.get("lockstep-ticket", "")).encode(),
                                                   sess.ticket.encode()):
            return None
        return sess

    async def Beat(self, request: pb.Heartbeat, context: grpc.aio.ServicerContext) -> pb.Heartbeat:
        sess = self._ticket_holder(context)
        if sess is None:
            self.s.refused.append((context.peer(), "UNAUTHENTICATED"))
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "a Beat needs the lockstep-agent-id and lockstep-ticket metadata returned by Register")
        sess.last_seen = time.monotonic()
        return request

    async def Session(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        s = self.s
        with s.lock:
            sess = self._ticket_holder(context)
            busy = sess is not None and sess.attached
            if sess is not None and not busy:
                sess.attached = True
        if sess is None:
            s.refused.append((context.peer(), "UNAUTHENTICATED"))
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                "a Session needs the lockstep-agent-id and lockstep-ticket metadata returned by Register")
        if busy:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"agent {sess.agent_id} already has a session")
        reader = asyncio.ensure_future(sess._read(context))
        try:
            while True:
                frames = await sess.outbox.get()
                if frames is None:
                    break
                for f in frames:
                    await context.write(f)
        finally:
            if not reader.done():
                reader.cancel()
                try:
                    await reader
                except asyncio.CancelledError:
                    pass


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
        self.port: int | None = None
        # the streams run on an event loop of their own (grpc.aio): one thread for every agent, and no
        # thread hand-off per frame; the window loop talks to it through AgentSession.send / inbox
        self.loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = None
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"{self.settings.host}:{self.port}"

    def _on_loop(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> int:
        limit = self.settings.max_message_bytes + 64 * 1024
        self._server = grpc.aio.server(
            options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit),
                     ("grpc.so_reuseport", 0)],
            maximum_concurrent_rpcs=4 * self.n_agents + 8)
        pb_grpc.add_ControllerServicer_to_server(_Servicer(self), self._server)
        port = self._server.add_insecure_port(f"{self.settings.host}:{self.settings.port}")
        if port:
            await self._server.start()
        return port

    def start(self) -> str:
        self._thread = threading.Thread(target=self.loop.run_forever, name="controller-io", daemon=True)
        self._thread.start()
        try:
            port = self._on_loop(self._start(), timeout=30)
        except Exception as e:  # noqa: BLE001 - e.g. the address is taken
            self._halt()
            raise OSError(f"cannot listen on {self.settings.host}:{self.settings.port} "
                          f"(controller.host / controller.port): {e}") from e
        if port == 0:
            self._halt()
            raise OSError(f"cannot listen on {self.settings.host}:{self.settings.port} "
                          "(controller.host / controller.port)")
        self.port = port
        log.info("controller listening on %s", self.address)
        return self.address

    def stop(self, grace: float | None = 0.5) -> None:
        if self._thread is None:
            return
        for sess in list(self.sessions.values()):
            sess.end()
        if self._server is not None:
            try:
                self._on_loop(self._server.stop(grace), timeout=(grace or 0) + 5)
            except Exception:  # noqa: BLE001 - stopping goes on
                log.debug("stopping the gRPC server", exc_info=True)
        self._halt()

    def _halt(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self._thread = None
        if not self.loop.is_running():
            self.loop.close()

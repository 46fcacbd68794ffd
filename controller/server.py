"""The controller's gRPC service: authenticate agents, hand out assignments, carry the window streams.

Every call is authenticated by :class:`_Gate`, a server interceptor, from its
metadata alone — before any request body is read (docs/security.md): a
``Register`` must carry the run's token (``lockstep-token``, compared in
constant time) and the protocol version, a ``Session`` or ``Beat`` the agent
id and the ticket ``Register`` returned. A caller that fails is refused at
once, costs no handler and never sees the plan; refusals are counted and
kept in a short, bounded log. Authenticated calls are limited per agent
(one Register, one Session, two Beats at a time) and a unary request that
does not arrive within ``call_timeout_s`` is cancelled, so a stalled or
flooding client cannot take the slots a real agent needs.

The server runs on a ``grpc.aio`` event loop in a thread of its own; each
session's frames are reassembled and decoded there (within the plan's
:class:`~agents.common.wire.Limits`), and a malformed frame fails that
agent's session (the run then stops with an error naming it) but never the
controller process. With ``controller.tls`` the port speaks TLS, and with
``client_auth`` an agent must also present a certificate signed by the CA.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
import queue
import secrets
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import grpc

from agents.common import wire
from controller.config.schema import ControllerConfig, TLSConfig
from protos.lockstep.v1 import agent_pb2 as pb
from protos.lockstep.v1 import agent_pb2_grpc as pb_grpc

__all__ = ["ControllerServer", "AgentSession", "ControllerSettings", "Refusals", "agent_tls_env", "server_credentials"]

log = logging.getLogger("lockstep.controller")


class ListenError(OSError):
    """The controller cannot listen where its config says (a port taken, an address not this host's): one
    sentence naming the keys; ``lockstep run`` prints it and exits 1, without a traceback."""


METADATA_TOKEN, METADATA_AGENT = wire.METADATA_TOKEN, wire.METADATA_AGENT
METADATA_TICKET, METADATA_PROTOCOL = wire.METADATA_TICKET, wire.METADATA_PROTOCOL
_SERVICE = "/lockstep.v1.Controller/"
# authenticated calls one agent may have open at once: a Register, its Session, a Beat (and one late)
_PER_AGENT = {"Register": 1, "Session": 1, "Beat": 2}
_INBOX_FRAMES = 16  # frames of an agent the controller holds before it stops reading the agent's stream
_INBOX_WAIT_S = 0.002  # how often a stopped reader looks whether the controller took a frame


ControllerSettings = ControllerConfig
"""The ``controller:`` section of the config (its schema, with the one set of defaults); the server reads it."""



def agent_tls_env(tls: TLSConfig) -> dict[str, str]:
    """The environment that makes an agent verify the controller and present its certificate."""
    if not tls.enabled:
        return {}
    from agents.common.trust import AgentTLS

    return AgentTLS(ca=tls.ca, cert=tls.agent_cert or tls.cert, key=tls.agent_key or tls.key,
                    server_name=tls.server_name).env()


@dataclass
class Refusals:
    """Calls turned away: counted by status, the last few kept with their peer (bounded, whoever floods)."""

    recent: deque = field(default_factory=lambda: deque(maxlen=32))
    by_code: Counter = field(default_factory=Counter)
    _logged_at: float = 0.0
    _unlogged: int = 0

    def add(self, peer: str, code: grpc.StatusCode, why: str) -> None:
        self.recent.append((peer, code.name, why))
        self.by_code[code.name] += 1
        now = time.monotonic()
        if now - self._logged_at >= 1.0:  # at most one warning a second, however many strangers call
            more = f" (and {self._unlogged} more refusals since the last warning)" if self._unlogged else ""
            log.warning("refused a call from %s: %s: %s%s", peer, code.name, why, more)
            self._logged_at, self._unlogged = now, 0
        else:
            self._unlogged += 1

    @property
    def total(self) -> int:
        return sum(self.by_code.values())


class AgentSession:
    """One registered agent: its inbox of decoded frames, its outbox of frames, liveness.

    The stream itself lives on the server's event loop; :meth:`send` and
    :meth:`end` may be called from any thread, and the inbox is a plain
    ``queue.Queue`` the window loop blocks on. An agent that sends more frames
    than the loop asked for fails its session (the inbox is bounded).
    """

    def __init__(self, agent_id: int, ticket: str, info: dict[str, Any], max_message_bytes: int,
                 loop: asyncio.AbstractEventLoop, limits: wire.Limits | None = None):
        self.agent_id, self.ticket, self.info = agent_id, ticket, info
        self.limits = limits or wire.Limits()
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

    def send_serialized(self, frame: bytes) -> None:
        """A frame already serialized (:func:`agents.common.wire.append_bytes`), below the message limit."""
        self._post([frame])

    def end(self) -> None:
        """Close the stream from our side (after a Shutdown frame)."""
        self._post(None)

    def _post(self, item: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.outbox.put_nowait, item)
        except RuntimeError:  # the server has stopped: nothing can reach the agent any more
            log.debug("agent %d: frame dropped, the server has stopped", self.agent_id)

    async def _read(self, context: grpc.aio.ServicerContext) -> None:
        reader = wire.FrameReader(pb.AgentFrame, self.limits)
        reason = "the agent closed its stream"
        try:
            while True:
                while self.inbox.qsize() >= _INBOX_FRAMES:
                    # the controller is behind (a slow check, a busy machine): read no more of this stream, so
                    # gRPC's flow control holds the agent back and the controller never holds more than this
                    await asyncio.sleep(_INBOX_WAIT_S)
                frame = await context.read()
                if frame is grpc.aio.EOF:
                    break
                self.last_seen = time.monotonic()
                msg = reader.feed(frame)
                if msg is None:
                    continue
                self.inbox.put(("frame", msg, reader.hand_over()))
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


def _refusal(kind: str, code: grpc.StatusCode, details: str, refusals: Refusals) -> grpc.RpcMethodHandler:
    """A handler that refuses without reading the request (a unary one would wait for the whole body)."""
    async def refuse(request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        refusals.add(context.peer(), code, details)
        await context.abort(code, details)

    if kind == "stream":
        return grpc.stream_stream_rpc_method_handler(refuse)
    return grpc.stream_unary_rpc_method_handler(refuse)


class _Gate(grpc.aio.ServerInterceptor):
    """Authenticates each call from its metadata, limits calls per agent, and bounds unary reads in time."""

    def __init__(self, server: "ControllerServer"):
        self.s = server
        self.in_flight: Counter = Counter()  # (method, agent id) -> open calls

    def _check(self, method: str, md: dict[str, str]) -> tuple[grpc.StatusCode, str] | int:
        """The agent id the call may act for, or (status, why) to refuse it."""
        s = self.s
        try:
            aid = int(md.get(METADATA_AGENT, ""))
        except ValueError:
            aid = None
        if method == "Register":
            token = md.get(METADATA_TOKEN, "")
            if not token or not hmac.compare_digest(token.encode(), s.token.encode()):
                return (grpc.StatusCode.UNAUTHENTICATED,
                        "missing or wrong token: agents must present this run's token ($LOCKSTEP_TOKEN) in the "
                        f"{METADATA_TOKEN} metadata (protocol version {wire.PROTOCOL_VERSION}; older agents sent "
                        "it in the request: run the same lockstep version on both sides)")
            if md.get(METADATA_PROTOCOL) != str(wire.PROTOCOL_VERSION):
                return (grpc.StatusCode.FAILED_PRECONDITION,
                        f"agent speaks protocol version {md.get(METADATA_PROTOCOL) or 'unknown'}; this controller "
                        f"speaks version {wire.PROTOCOL_VERSION}: run the same lockstep version on both sides")
            if aid is None or not 0 <= aid < s.n_agents:
                return (grpc.StatusCode.INVALID_ARGUMENT,
                        f"agent id {md.get(METADATA_AGENT)!r:.20} is out of range; this run has agents "
                        f"0..{s.n_agents - 1}")
            return aid
        sess = s.sessions.get(aid) if aid is not None else None
        if sess is None or not hmac.compare_digest(str(md.get(METADATA_TICKET, "")).encode(), sess.ticket.encode()):
            return (grpc.StatusCode.UNAUTHENTICATED,
                    f"a {method} needs the {METADATA_AGENT} and {METADATA_TICKET} metadata returned by Register")
        return aid

    async def intercept_service(self, continuation: Callable[[Any], Awaitable[Any]],
                                details: grpc.HandlerCallDetails) -> Any:
        full = details.method or ""
        method = full[len(_SERVICE):] if full.startswith(_SERVICE) else ""
        if method not in _PER_AGENT:
            return await continuation(details)  # UNIMPLEMENTED, from grpc itself
        kind = "stream" if method == "Session" else "unary"
        md = {k: v for k, v in (details.invocation_metadata or ()) if isinstance(v, str)}
        who = self._check(method, md)
        if isinstance(who, tuple):
            return _refusal(kind, *who, self.s.refusals)
        key = (method, who)
        if self.in_flight[key] >= _PER_AGENT[method]:
            why = f"agent {who} already has {self.in_flight[key]} {method} call(s) open"
            return _refusal(kind, grpc.StatusCode.RESOURCE_EXHAUSTED, why, self.s.refusals)
        handler = await continuation(details)
        if handler is None:
            return None
        return self._bounded(handler, key)

    def _bounded(self, handler: grpc.RpcMethodHandler, key: tuple[str, int]) -> grpc.RpcMethodHandler:
        """The handler, counted in ``in_flight``; a unary one reads its request with a deadline."""
        flight, timeout = self.in_flight, self.s.settings.call_timeout_s
        flight[key] += 1

        def done() -> None:
            flight[key] -= 1
            if flight[key] <= 0:
                del flight[key]

        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    try:
                        request = await asyncio.wait_for(context.read(), timeout)
                    except asyncio.TimeoutError:
                        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED,
                                            f"the request did not arrive within {timeout:g} s")
                    if request is grpc.aio.EOF:
                        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the call ended without a request")
                    return await inner(request, context)
                finally:
                    done()

            return grpc.stream_unary_rpc_method_handler(unary, request_deserializer=handler.request_deserializer,
                                                        response_serializer=handler.response_serializer)
        inner_stream = handler.stream_stream

        async def stream(request_iterator: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await inner_stream(request_iterator, context)
            finally:
                done()

        # frames, or frames already serialized (a checkpoint's pieces for a restore: wire.append_bytes)
        return grpc.stream_stream_rpc_method_handler(stream, request_deserializer=handler.request_deserializer,
                                                     response_serializer=wire.serialize_frame)


class _Servicer(pb_grpc.ControllerServicer):
    """The calls themselves; :class:`_Gate` has authenticated each one before it gets here."""

    def __init__(self, server: "ControllerServer"):
        self.s = server

    async def Register(self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext) -> pb.Assignment:
        s = self.s
        peer = context.peer()
        md_id = dict(context.invocation_metadata() or ()).get(METADATA_AGENT)
        if str(request.agent_id) != md_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"agent id {request.agent_id} in the request, {md_id} in the metadata")
        if request.run_id and request.run_id != s.run_id:
            s.refusals.add(peer, grpc.StatusCode.FAILED_PRECONDITION, f"run {request.run_id!r:.40}")
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"agent was started for run {request.run_id!r}; this controller runs {s.run_id!r}")
        with s.lock:
            if request.agent_id in s.sessions:
                exists = True
            else:
                exists = False
                ticket = secrets.token_urlsafe(16)
                info = {"peer": peer, "hostname": request.hostname, "pid": request.pid, "device": request.device,
                        "data_address": request.data_address, "data_secret": request.data_secret}
                s.sessions[request.agent_id] = AgentSession(request.agent_id, ticket, info,
                                                            s.settings.max_message_bytes, s.loop, s.limits)
                s.changed.notify_all()
        if exists:
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"agent {request.agent_id} is already registered")
        log.info("agent %d registered from %s (pid %d on %s, %s)", request.agent_id, peer, request.pid,
                 request.hostname, request.device)
        return pb.Assignment(agent_id=request.agent_id, plan_json=s.plan_json, ticket=ticket,
                             max_message_bytes=s.settings.max_message_bytes, heartbeat_s=s.settings.heartbeat_s,
                             protocol_version=wire.PROTOCOL_VERSION)

    def _session_of(self, context: grpc.aio.ServicerContext) -> AgentSession:
        return self.s.sessions[int(dict(context.invocation_metadata())[METADATA_AGENT])]

    async def Beat(self, request: pb.Heartbeat, context: grpc.aio.ServicerContext) -> pb.Heartbeat:
        self._session_of(context).last_seen = time.monotonic()
        return request

    async def Session(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        s = self.s
        sess = self._session_of(context)
        with s.lock:
            busy = sess.attached
            sess.attached = True
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


def server_credentials(tls: TLSConfig) -> grpc.ServerCredentials:
    """gRPC server credentials from ``controller.tls`` (mTLS when ``client_auth``)."""
    cert, key = Path(tls.cert).read_bytes(), Path(tls.key).read_bytes()
    ca = Path(tls.ca).read_bytes() if tls.ca else None
    if tls.client_auth and ca is None:
        raise ValueError("controller.tls.client_auth needs controller.tls.ca (the CA that signed the agents' "
                         "certificates)")
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=tls.client_auth)


class ControllerServer:
    """The gRPC server of one run."""

    def __init__(self, token: str, run_id: str, plan_json: str, n_agents: int,
                 settings: ControllerSettings = ControllerSettings(), limits: wire.Limits | None = None):
        if not token:
            raise ValueError("the controller needs a non-empty token")
        self.token, self.run_id, self.plan_json, self.n_agents = token, run_id, plan_json, n_agents
        self.settings = settings
        self.limits = limits or wire.Limits()
        self.sessions: dict[int, AgentSession] = {}
        self.refusals = Refusals()
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
        # what agents send stays within the limit; what the controller sends may be larger only by the plan it
        # assigns (100 000 vworkers: 17 MB of JSON), which only the authenticated controller sends
        send_limit = max(limit, len(self.plan_json.encode()) + 64 * 1024)
        self.gate = _Gate(self)  # its in_flight counts the open calls of each agent (read by tests)
        self._server = grpc.aio.server(
            interceptors=[self.gate],
            options=[("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", send_limit),
                     ("grpc.so_reuseport", 0),
                     # one connection cannot open streams without end, nor stall its TLS handshake
                     ("grpc.max_concurrent_streams", 16),
                     ("grpc.server_handshake_timeout_ms", int(self.settings.call_timeout_s * 1000))])
        pb_grpc.add_ControllerServicer_to_server(_Servicer(self), self._server)
        where = f"{self.settings.host}:{self.settings.port}"
        tls = self.settings.tls
        port = (self._server.add_secure_port(where, server_credentials(tls)) if tls.enabled
                else self._server.add_insecure_port(where))
        if port:
            await self._server.start()
        return port

    def start(self) -> str:
        self._thread = threading.Thread(target=self.loop.run_forever, name="controller-io", daemon=True)
        self._thread.start()
        try:
            port = self._on_loop(self._start(), timeout=30)
        except Exception as e:  # noqa: BLE001 - e.g. the address is taken, a certificate file is missing
            self._halt()
            raise ListenError(f"cannot listen on {self.settings.host}:{self.settings.port} "
                              f"(controller.host / controller.port / controller.tls): {e}") from e
        if port == 0:
            self._halt()
            raise ListenError(f"cannot listen on {self.settings.host}:{self.settings.port} "
                              "(controller.host / controller.port)")
        self.port = port
        log.info("controller listening on %s%s", self.address, " (TLS)" if self.settings.tls.enabled else "")
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

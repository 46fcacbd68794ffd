"""The agent process: register with the controller, build the assigned vworkers, serve windows.

One :class:`AgentProcess` per OS process (a local subprocess, a Kubernetes pod):

1. ``Register`` with the shared token and the protocol version; the controller
   answers with the run's plan (JSON) and a session ticket, or refuses with
   UNAUTHENTICATED / FAILED_PRECONDITION (the agent then exits with status 3).
2. Open the ``Session`` stream (grpc.aio: windows run on the thread that
   reads the stream, with no hand-off per frame), start heartbeats (the
   ``Beat`` call, from a thread of its own), build an
   :class:`~agents.core.AgentCore` for the vworkers placed here, serve its
   Prometheus ``/metrics`` when the plan says so (``plan.metrics``),
   send ``Ready`` with that address.
3. For every ``Advance``: inject the inbound events, run the window, answer
   ``Reached``. ``Call`` asks for the final parameters / evaluation / info /
   metrics exposition.
4. ``Shutdown`` ends the process (status 0); losing the controller ends it too
   (status 1). Messages between vworkers of this agent never leave the process.

Checkpoints (docs/recovery.md): with direct windows, ``checkpoint(K)`` is answered by the window
thread at the top of window K (agents/mesh.py); ``restore(part, parts, bytes)``, before the windows
start, replaces the core built in step 2 by the checkpoint's (``agents.checkpoint.restore``).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import threading
import time
from typing import Any, Iterator

import grpc

from prometheus_client import CollectorRegistry, generate_latest

from agents.common import wire
from agents.common.trust import AgentTLS, Trust, client_ssl_context, server_ssl_context
from agents.core import AgentCore, passing_buffers, peak_memory
from agents.direct import DIRECT_MIN_BYTES, DirectLinks, DirectServer, local_address_towards
from agents.observe.metrics import AgentMetricsSpec, Metrics, serve
from agents.common.plan import Plan
from protos.lockstep.v1 import agent_pb2 as pb
from protos.lockstep.v1 import agent_pb2_grpc as pb_grpc

__all__ = ["AgentProcess", "EXIT_OK", "EXIT_FAILED", "EXIT_REFUSED"]

log = logging.getLogger("lockstep.agent")

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 3
CHANNEL_OPTIONS = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


class AgentProcess:
    def __init__(self, controller: str, agent_id: int, run_id: str, token: str,
                 protocol_version: int = wire.PROTOCOL_VERSION, connect_timeout_s: float = 60.0,
                 direct: bool = True, tls: AgentTLS | None = None, trust: Trust | None = None):
        self.controller, self.agent_id, self.run_id, self.token = controller, agent_id, run_id, token
        self.tls = tls or AgentTLS()
        self.trust = trust or Trust()
        self.protocol_version = protocol_version
        self.connect_timeout_s = connect_timeout_s
        self.direct = direct
        self.direct_server: DirectServer | None = None
        self.links: DirectLinks | None = None
        self.call: Any = None  # the Session stream (grpc.aio)
        self._stop = threading.Event()
        self.core: AgentCore | None = None
        self.registry: CollectorRegistry | None = None
        self.metrics_server: Any = None
        self.metrics_address = ""
        self.mesh: Any = None  # agents.mesh.MeshSession: direct windows (controller.windows=direct)
        self._mesh_task: Any = None
        self._view: dict | None = None  # a restored checkpoint's window-loop view, for mesh_run
        self._taking: Any = None  # the checkpoint being restored, taken piece by piece (agents.checkpoint.Taking)
        self._taking_error: Exception | None = None  # why its pieces could not be taken (answered after the last)
        self._restore_parts = 0
        self._passing = False  # the allocator serves a restore's pieces from the heap (agents.core.passing_buffers)
        self._write_lock = asyncio.Lock()  # one write at a time on the Session stream (_write)

    # ------------------------------------------------------------- plumbing
    async def _write(self, frame: Any) -> None:
        """One frame (or its bytes) on the Session stream. grpc.aio takes one write at a time per call, and two
        writers share it: the answers to calls on this loop, and the direct windows' task (its progress, its
        checkpoints); a checkpoint answered *ended* here while that task still wrote its last frames made two
        at once (GRPC_CALL_ERROR_TOO_MANY_OPERATIONS, and the agent took the controller for lost)."""
        async with self._write_lock:
            await self.call.write(frame)

    async def _send(self, frame: pb.AgentFrame, blobs: Any = None) -> None:
        for f in self.writer.frames(frame, blobs):
            await self._write(f)

    def _heartbeats(self, every_s: float, metadata: tuple) -> None:
        """Beat every ``every_s`` from this thread, on a channel of its own: a long window keeps beating."""
        with self.tls.channel(grpc, self.controller, CHANNEL_OPTIONS) as channel:
            beat = pb_grpc.ControllerStub(channel).Beat
            while not self._stop.wait(every_s):
                try:
                    beat(pb.Heartbeat(sent_unix_ns=time.time_ns()), metadata=metadata, timeout=max(every_s, 1.0))
                except grpc.RpcError:  # the Session stream tells when the controller is gone
                    log.debug("heartbeat failed", exc_info=True)

    # ----------------------------------------------------------------- main
    def _open_direct(self) -> None:
        """Listen for the other agents' direct tensor streams on the interface that reaches the controller."""
        host = local_address_towards(self.controller) if self.direct else None
        if host is None:
            return
        try:
            ctx = (server_ssl_context(self.tls.ca, self.tls.cert, self.tls.key) if self.tls.enabled and self.tls.cert
                   else None)
            self.direct_server = DirectServer(host, self.agent_id, ctx)
        except (OSError, ssl.SSLError) as e:
            log.warning("no direct tensor streams (cannot listen on %s: %s); tensors go through the controller",
                        host, e)

    def run(self) -> int:
        self._open_direct()
        try:
            return self._run()
        finally:
            if self.links is not None:
                self.links.close()
            if self.direct_server is not None:
                self.direct_server.close()
            if self.metrics_server is not None:
                self.metrics_server.shutdown()
                self.metrics_server.server_close()

    def _run(self) -> int:
        return asyncio.run(self._run_async())

    async def _run_async(self) -> int:
        async with self.tls.channel(grpc.aio, self.controller, CHANNEL_OPTIONS) as channel:
            stub = pb_grpc.ControllerStub(channel)
            ds = self.direct_server
            md = ((wire.METADATA_TOKEN, self.token), (wire.METADATA_PROTOCOL, str(self.protocol_version)),
                  (wire.METADATA_AGENT, str(self.agent_id)))
            try:
                a = await stub.Register(pb.RegisterRequest(
                    agent_id=self.agent_id, protocol_version=self.protocol_version,
                    device=_device(), run_id=self.run_id, hostname=socket.gethostname(), pid=os.getpid(),
                    data_address=ds.address if ds else "", data_secret=ds.secret if ds else b""),
                    metadata=md, timeout=self.connect_timeout_s, wait_for_ready=True)
            except grpc.RpcError as e:
                code = e.code()
                log.error("controller %s refused registration: %s: %s", self.controller,
                          code.name if code else "?", e.details())
                return EXIT_REFUSED if code in (grpc.StatusCode.UNAUTHENTICATED,
                                                 grpc.StatusCode.FAILED_PRECONDITION) else EXIT_FAILED
            log.info("registered with %s as agent %d (protocol v%d)", self.controller, a.agent_id,
                     a.protocol_version)
            self.writer = wire.FrameWriter(pb.AgentFrame, int(a.max_message_bytes))
            md = ((wire.METADATA_AGENT, str(self.agent_id)), (wire.METADATA_TICKET, a.ticket))
            session = channel.stream_stream(  # stub.Session, taking frames already serialized too (checkpoints)
                "/lockstep.v1.Controller/Session", request_serializer=wire.serialize_frame,
                response_deserializer=pb.ControllerFrame.FromString)
            self.call = session(metadata=md)
            hb = threading.Thread(target=self._heartbeats, args=(max(a.heartbeat_s, 0.01), md),
                                  name="heartbeat", daemon=True)
            hb.start()
            try:
                status = await self._serve(a)
                await self.call.done_writing()  # a Failure just written must reach the controller before a cancel
                if status != EXIT_OK:  # ... and be read there: wait (briefly) for the controller to end the call
                    with contextlib.suppress(asyncio.TimeoutError, grpc.RpcError):
                        await asyncio.wait_for(self.call.code(), timeout=5.0)
                return status
            except grpc.RpcError as e:
                if self._stop.is_set():
                    return EXIT_OK
                log.error("lost the controller: %s: %s", e.code().name if e.code() else "?", e.details())
                return EXIT_FAILED
            finally:
                self._stop.set()
                if self.mesh is not None:  # a window thread of direct windows must not outlive the session
                    self.mesh.stop()
                self.call.cancel()

    async def _serve(self, a: pb.Assignment) -> int:
        """Build the vworkers, then answer the controller's frames in order (windows run on this thread)."""
        try:
            plan = Plan.from_json(a.plan_json)
            self.trust.check_plan(plan)  # only registered strategies and models, unless the user opted in
            limits = plan.limits
            if self.direct_server is not None:
                self.direct_server.limits = limits
            metrics = self._open_metrics(plan.metrics)
            self.core = AgentCore(plan, self.agent_id, data=_prepare(plan), metrics=metrics, own_process=True)
        except Exception as e:  # noqa: BLE001 - reported to the controller, which stops the run
            log.exception("could not build the vworkers of agent %d", self.agent_id)
            await self._fail(f"could not build its vworkers: {type(e).__name__}: {e}")
            return EXIT_FAILED
        core = self.core
        log.info("pid %d hosting %d vworkers: %s", os.getpid(), len(core.local), ", ".join(plan.names[v] for v in core.local[:20])
                 + (" ..." if len(core.local) > 20 else ""))
        f = pb.AgentFrame()
        f.ready.next_time, f.ready.horizon = core.next_time(), core.output_bound()
        f.ready.metrics_address = self.metrics_address
        await self._send(f)
        reader = wire.FrameReader(pb.ControllerFrame, limits)
        while True:
            frame = await self.call.read()
            if frame is grpc.aio.EOF:
                break
            msg = reader.feed(frame)
            if msg is None:
                continue
            body = msg.WhichOneof("body")
            if body == "advance":
                if not await self._advance(msg.advance, reader):
                    return EXIT_FAILED
            elif body == "call" and msg.call.method in ("mesh_open", "mesh_run"):
                if not await self._mesh_call(msg.call):
                    return EXIT_FAILED
            elif body == "call" and msg.call.method == "checkpoint":
                await self._checkpoint(msg.call)
            elif body == "call" and msg.call.method == "restore":
                if not await self._restore(msg.call, reader):
                    return EXIT_FAILED
            elif body == "call":
                if not await self._call(msg.call):
                    return EXIT_FAILED
            elif body == "peers":
                peers = {p.agent_id: (p.address, p.secret) for p in msg.peers.peers
                         if p.agent_id != self.agent_id and p.address}
                if self.links is not None:
                    self.links.close()
                ctx = client_ssl_context(self.tls.ca, self.tls.cert, self.tls.key) if self.tls.enabled else None
                self.links = DirectLinks(self.agent_id, peers, ssl_context=ctx) if self.direct else None
                for dst in peers if self.links is not None else ():
                    self.links.usable(dst)  # connect now, not inside the first window that needs it
            elif body == "shutdown":
                if self.mesh is not None:
                    self.mesh.stop()
                s = msg.shutdown
                if s.abort:
                    log.warning("the controller aborted the run: %s", s.reason)
                else:
                    log.info("run finished; exiting")
                self._stop.set()
                return EXIT_OK
        log.error("the controller closed the stream without a Shutdown")
        return EXIT_FAILED

    async def _advance(self, adv: pb.Advance, reader: wire.FrameReader) -> bool:
        try:
            fetch = self.direct_server.take if self.direct_server is not None else None
            inbound = [wire.decode_event(e, reader.blobs, fetch) for e in adv.inbound]
            reader.done()
            r = self.core.advance(adv.window_end, inbound, adv.stop_at if adv.HasField("stop_at") else None,
                                  adv.max_events if adv.HasField("max_events") else None)
            f = pb.AgentFrame()
            rm = f.reached
            rm.window, rm.next_time, rm.horizon = adv.window, r.next_time, r.horizon
            if r.stop_time is not None:
                rm.stop_time = r.stop_time
            blobs = self.writer.blobs()
            if self.links is not None:
                blobs.self_agent, blobs.direct_ok, blobs.direct_min = self.agent_id, self.links.usable, DIRECT_MIN_BYTES
            placement = self.core.plan.placement
            for ev in r.outbound:
                blobs.dst_agent = placement[ev.dst]
                wire.encode_event(ev, rm.outbound.add(), blobs)
            blobs.dst_agent = None
            wire.encode_value(r.updates, rm.updates)
            wire.encode_value(r.evals, rm.evals)
            wire.encode_value(r.events, rm.events)
            wire.encode_stats(r.stats, rm.stats)
        except Exception as e:  # noqa: BLE001 - a strategy bug or a bad message: report, then stop
            log.exception("window ending at %d failed", adv.window_end)
            await self._fail(f"{type(e).__name__}: {e}")
            return False
        try:  # the bytes go first, so they are on their way before the controller routes the references
            for dst, bid, mv in blobs.direct:
                self.links.send(dst, bid, mv)
        except wire.WireError as e:
            log.exception("window ending at %d: direct stream failed", adv.window_end)
            await self._fail(str(e))
            return False
        blobs.direct = []
        await self._send(f, blobs)
        return True

    async def _call(self, call: pb.Call) -> bool:
        core = self.core
        try:
            args = wire.decode_value(call.args) or ()
            if call.method == "result_params":
                value = core.result_params()
            elif call.method == "final_eval":
                value = core.final_eval(*args)
            elif call.method == "info":
                value = core.info()
            elif call.method == "metrics":  # the final exposition, which the controller writes to the run dir
                value = generate_latest(self.registry).decode() if self.registry is not None else ""
            else:
                raise wire.WireError(f"unknown call {call.method!r}")
            f = pb.AgentFrame()
            f.reply.id = call.id
            blobs = self.writer.blobs()
            wire.encode_value(value, f.reply.value, blobs)
        except Exception as e:  # noqa: BLE001
            log.exception("call %s failed", call.method)
            await self._fail(f"{call.method}: {type(e).__name__}: {e}")
            return False
        await self._send(f, blobs)
        return True

    async def _mesh_call(self, call: pb.Call) -> bool:
        """Direct windows (agents/mesh.py): ``mesh_open`` answers at once; ``mesh_run`` runs on a
        thread while this loop keeps reading (a Shutdown stops it) and writes its progress and reply."""
        from agents.mesh import MeshSession

        try:
            if self.mesh is None:
                tls = self.tls.enabled and bool(self.tls.cert)  # the streams speak mutual TLS too
                self.mesh = MeshSession(
                    self.core, self.run_id, local_address_towards(self.controller), self.writer,
                    server_ssl_context(self.tls.ca, self.tls.cert, self.tls.key) if tls else None,
                    client_ssl_context(self.tls.ca, self.tls.cert, self.tls.key) if tls else None)
                self.mesh.view, self._view = self._view, None
            if call.method == "mesh_open":
                f = pb.AgentFrame()
                f.reply.id = call.id
                wire.encode_value(self.mesh.open(), f.reply.value)
                await self._send(f)
                return True
            args = wire.decode_value(call.args) or ()
        except Exception as e:  # noqa: BLE001 - reported to the controller, which stops the run
            log.exception("call %s failed", call.method)
            await self._fail(f"{call.method}: {type(e).__name__}: {e}")
            return False
        self._mesh_task = asyncio.ensure_future(self.mesh.run(call.id, args, self._write))
        return True

    async def _checkpoint(self, call: pb.Call) -> None:
        """Call ``checkpoint(K)`` (docs/recovery.md): the direct windows answer it at the top of window K."""
        from agents.mesh import checkpoint_reply

        try:
            (window,) = wire.decode_value(call.args)
            window = int(window)
        except (wire.WireError, TypeError, ValueError) as e:
            await self._fail(f"checkpoint: malformed arguments: {e}")
            return
        if self.mesh is not None:
            if self.mesh.checkpoint(call.id, window):
                return  # the window thread answers, in order with its progress
            frames = checkpoint_reply(self.writer, call.id, "ended", window)
        else:  # the controller's own window loop: this agent is between two windows now
            frames = self._snapshot_reply(call.id, window)
        for f in frames:
            await self._write(f)

    def _snapshot_reply(self, call_id: int, window: int) -> Iterator[Any]:
        from agents.checkpoint import NotCheckpointable, snapshot
        from agents.mesh import checkpoint_reply, pack_checkpoint

        try:
            blob = pack_checkpoint(window, None, snapshot(self.core))
        except NotCheckpointable as e:
            status = "refused_permanent" if getattr(e, "permanent", False) else "refused"
            return checkpoint_reply(self.writer, call_id, status, window, reason=str(e))
        except Exception as e:  # noqa: BLE001 - a checkpoint that cannot be taken must not stop the run
            log.warning("checkpoint of window %d failed: %s: %s", window, type(e).__name__, e, exc_info=True)
            return checkpoint_reply(self.writer, call_id, "refused", window, reason=f"{type(e).__name__}: {e}")
        return checkpoint_reply(self.writer, call_id, "ok", window, blob=blob)

    async def _restore(self, call: pb.Call, reader: wire.FrameReader) -> bool:
        """Call ``restore(part, parts, bytes)``: this agent's checkpoint, in pieces; after the last, the core
        becomes the checkpoint's (agents.checkpoint.restore) and the direct windows start from its view.

        Answers ``("ok", window)`` or ``("error", sentence)``: a checkpoint that cannot be restored is the
        controller's to handle (it replays from virtual time 0), not a failure of this agent."""
        try:
            part, parts, piece = wire.decode_value(call.args, reader.blobs)
            reader.done()
            if not (isinstance(part, int) and isinstance(parts, int) and isinstance(piece, bytes)
                    and 0 <= part < parts):
                raise wire.WireError("expected (part, parts, bytes)")
        except (wire.WireError, TypeError, ValueError) as e:
            await self._fail(f"restore: malformed arguments: {e}")
            return False
        if part == 0:
            from agents.checkpoint import Taking

            self._taking, self._taking_error, self._restore_parts = Taking(self._compact_meanwhile), None, 0
            if parts > 1 and self.core is not None and self.core.compact_memory:
                self._passing = passing_buffers(True)  # the pieces' copies reuse the heap's pages (agents/core.py)
        if self._restore_parts != part:
            self._end_passing()
            await self._fail(f"restore: part {part} after {self._restore_parts} parts")
            return False
        if self._taking_error is None:
            try:  # each storage's bytes straight into its tensor: no buffer of the whole checkpoint
                self._taking.feed(piece)
            except Exception as e:  # noqa: BLE001 - answered after the last piece: the controller replays
                self._taking_error = e
        del piece
        self._restore_parts += 1
        value: Any = None
        if part == parts - 1:
            taking, error = self._taking, self._taking_error
            self._taking, self._taking_error, self._restore_parts = None, None, 0
            heap = self._passing
            self._end_passing()  # compact again before the core's own tensors are allocated
            if error is None:
                try:
                    value = ("ok", self._restore_from(taking, parts, heap))
                except Exception as e:  # noqa: BLE001 - answered: the controller falls back to a replay
                    error = e
            if error is not None:
                from agents.checkpoint import NotCheckpointable

                log.warning("could not restore the checkpoint: %s: %s", type(error).__name__, error,
                            exc_info=not isinstance(error, (NotCheckpointable, ValueError)))
                value = ("error", f"{type(error).__name__}: {error}")
            del taking
        f = pb.AgentFrame()
        f.reply.id = call.id
        wire.encode_value(value, f.reply.value)
        await self._send(f)
        return True

    def _end_passing(self) -> None:
        if self._passing:
            self._passing = False
            passing_buffers(False)

    @contextlib.contextmanager
    def _compact_meanwhile(self) -> Iterator[None]:
        """Compact while a restore allocates its storages' tensors (they live on), back to the heap after."""
        if not self._passing:
            yield
            return
        passing_buffers(False)
        try:
            yield
        finally:
            passing_buffers(True)

    def _restore_from(self, taking: Any, parts: int = 1, heap: bool = False) -> int:
        from agents.checkpoint import restore
        from agents.mesh import taken_checkpoint

        taking.done()
        d = taken_checkpoint(taking)
        old = self.core
        data = old.training.data if old is not None and old.training is not None else None
        core = restore(old.plan, self.agent_id, taken=taking, data=data, metrics=old.metrics)
        self.core = core
        with contextlib.suppress(Exception):
            old.close()
        self._view = d["view"]
        if self.mesh is not None:
            self.mesh.core, self.mesh.view = core, d["view"]
        log.info("restored the checkpoint of window %d (%d pieces%s; peak resident set so far %.2f GB)", d["window"],
                 parts, ", taken through the heap" if heap else "", peak_memory()["peak_rss_bytes"] / 1e9)
        return int(d["window"])

    def _open_metrics(self, spec: AgentMetricsSpec) -> Metrics | None:
        """This agent's own registry, served on ``spec.host:spec.port`` when ``spec.serve``.

        The controller decides (``metrics.port`` not null: every process serves). The address sent
        in ``Ready`` names the interface that reaches the controller when bound to all interfaces.
        """
        if not spec.serve:
            return None
        self.registry = CollectorRegistry()
        m = Metrics(self.registry, role="agent", per_worker=spec.per_worker)
        host, want = spec.host, spec.port
        try:
            self.metrics_server, port = serve(self.registry, host, want)
        except OSError as e:  # e.g. metrics.agent_port fixed while several agents share one host
            raise OSError(f"cannot serve /metrics on {host}:{want} (metrics.host, metrics.agent_port; "
                          f"0 picks a free port): {e}") from e
        if host in ("0.0.0.0", "::", ""):
            host = local_address_towards(self.controller) or socket.getfqdn()
        self.metrics_address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        log.info("metrics on http://%s/metrics", self.metrics_address)
        return m

    async def _fail(self, error: str) -> None:
        f = pb.AgentFrame()
        f.failure.error = error
        await self._send(f)


def _prepare(plan: Plan) -> Any:
    """The data set of the plan's workload (None when no vworker holds data).

    Read once per process and cached by file: an agent forked from the warm forkserver finds it read already
    (agents/forked.py). torch's compiler is not imported: nothing in a run needs it (docs/benchmarks.md, "A
    run's start without torch's compiler"), and importing it here cost every agent about a second before Ready.
    """
    wl = plan.workload
    if not getattr(wl, "data_holders", None):
        return None
    from agents.workloads.data import load_fashion_mnist

    return load_fashion_mnist(wl.data_root)


def _device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:  # noqa: BLE001 - informational only
        return "cpu"

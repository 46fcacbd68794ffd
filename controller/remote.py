"""Agents in other processes: the gRPC handle the window loop drives, and the pool that starts them.

:class:`RemoteAgents` is what :func:`controller.run.execute` receives as its
``launcher``: it serves the protocol (:mod:`controller.server`), starts the
agents through a :class:`~controller.launchers.base.Launcher` (local
subprocesses, Kubernetes pods, Ray actors), waits until each has registered and built its
vworkers, and returns one :class:`RemoteAgent` per agent. Every wait polls
the launcher (a dead process fails the run at once) and the agent's last
sign of life (a silent one fails it after ``agent_timeout_s``), so a run
never hangs on a lost agent.
"""
from __future__ import annotations

import logging
import os
import queue
import secrets
import threading
import time
from pathlib import Path
from typing import Any, Callable

from agents.common import wire
from agents.common.trust import TRUST_ENV, modules_to_trust
from agents.core import Reached
from agents.direct import pair_key
from agents.sim.env import EvalRow, RowKey, UpdateRow
from agents.sim.kernel import RemoteEvent
from agents.common.plan import Plan
from controller.checks import RowError, check_rows
from controller.config import RunConfig
from controller.config.schema import (InprocessLauncherConfig, KubernetesLauncherConfig,
                                      LocalLauncherConfig, RayLauncherConfig)
from controller.launchers.base import AgentFailure, LaunchSpec
from controller import signals
from controller.server import AgentSession, ControllerServer, ControllerSettings, agent_tls_env
from protos.lockstep.v1 import agent_pb2 as pb

__all__ = ["RemoteAgent", "RemoteAgents", "ControllerSettings", "resolve_token", "launcher_for"]

log = logging.getLogger("lockstep.controller")

_POLL_S = 0.05


def resolve_token(token_file: str | None = None) -> str:
    """$LOCKSTEP_TOKEN, else the file ``token_file``, else a fresh random token for this run."""
    env = os.environ.get("LOCKSTEP_TOKEN")
    if env:
        return env
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as e:
            raise ValueError(f"controller.token_file={token_file!r} cannot be read: {e}") from e
        if not token:
            raise ValueError(f"controller.token_file={token_file!r} is empty; it must hold the shared token")
        return token
    return secrets.token_urlsafe(32)


class RemoteAgent:
    """An agent process behind the AgentHandle interface of :func:`controller.clock.run_windows`.

    ``begin_advance`` sends the window; ``end_advance`` waits for its Reached, so
    the loop can run all agents of a window in parallel.
    """

    def __init__(self, agent_id: int, session: AgentSession, plan: Plan, next_time: int,
                 poll: Callable[[], None], timeout_s: float, log_tail: Callable[[int], str]):
        self.agent_id, self.session, self.plan = agent_id, session, plan
        self._next = self._horizon = next_time
        self._poll, self.timeout_s, self._log_tail = poll, timeout_s, log_tail
        self._window = 0
        self._calls = 0
        self._closed = False
        self.metrics_address = ""  # HOST:PORT of the agent's /metrics, from Ready ("" = not serving)

    # ------------------------------------------------------------ waiting
    def fail(self, reason: str, lost: bool = False) -> AgentFailure:
        return AgentFailure(str(self.agent_id), reason, self._log_tail(self.agent_id), lost=lost)

    def _receive(self, what: str) -> tuple[pb.AgentFrame, dict]:
        """The next decoded frame of this agent; raises AgentFailure when it died, fell silent or erred."""
        sess = self.session
        while True:
            try:
                item = sess.inbox.get(timeout=_POLL_S)
            except queue.Empty:
                self._poll()
                silent = time.monotonic() - sess.last_seen
                if silent > self.timeout_s:
                    raise self.fail(f"sent nothing for {silent:.1f} s while the controller waited for its {what} "
                                    f"(controller.agent_timeout_s={self.timeout_s:g})", lost=True) from None
                continue
            return self.interpret(item)

    def interpret(self, item: tuple) -> tuple[pb.AgentFrame, dict]:
        """A frame taken from the session's inbox; raises AgentFailure when it says the agent closed or failed."""
        if item[0] == "closed":
            # prefer the launcher's account (exit status) when the process died: give it a moment to show
            deadline, nap = time.monotonic() + 1.0, threading.Event()
            while time.monotonic() < deadline:
                self._poll()
                nap.wait(0.02)
            raise self.fail(item[1], lost=True)
        msg, blobs = item[1], item[2]
        if msg.WhichOneof("body") == "failure":
            raise self.fail(f"reported an error: {msg.failure.error}")
        return msg, blobs

    # ------------------------------------------------------------- handle
    def next_time(self) -> int:
        return self._next

    def output_bound(self) -> int:
        return self._horizon

    def _set_times(self, what: str, next_time: int, horizon: int) -> None:
        if horizon < next_time:
            raise self.fail(f"sent a malformed {what}: horizon {horizon} before its next event {next_time}")
        self._next, self._horizon = next_time, horizon

    def begin_advance(self, window_end: int, inbound: list[RemoteEvent], stop_at: int | None,
                      max_events: int | None) -> None:
        self._window += 1
        f = pb.ControllerFrame()
        a = f.advance
        a.window, a.window_end = self._window, window_end
        if stop_at is not None:
            a.stop_at = stop_at
        if max_events is not None:
            a.max_events = max_events
        blobs = self.session.writer.blobs()
        for ev in inbound:
            wire.encode_event(ev, a.inbound.add(), blobs)
        self.session.send(f, blobs)

    def end_advance(self) -> Reached:
        msg, blobs = self._receive("Reached")
        body = msg.WhichOneof("body")
        if body != "reached" or msg.reached.window != self._window:
            got = f"Reached of window {msg.reached.window}" if body == "reached" else body
            raise self.fail(f"protocol error: expected the Reached of window {self._window}, got {got}")
        r = msg.reached
        try:
            outbound = [wire.decode_event(e, blobs, wire.keep_refs(self.agent_id)) for e in r.outbound]
        except wire.WireError as e:
            raise self.fail(f"sent a malformed Reached: {e}") from e
        self._check_events(outbound)
        updates, evals, events, stats = self.decode_rows(r, blobs, "Reached")
        self._set_times("Reached", r.next_time, r.horizon)
        return Reached(r.next_time, outbound, r.stop_time if r.HasField("stop_time") else None,
                       r.horizon, updates, evals, events, stats)

    def decode_rows(self, r: pb.Reached, blobs: dict, what: str) -> tuple[list, list, list, Any]:
        """The rows (checked against the plan, as RowKey/UpdateRow/EvalRow), state-log events and counters of a
        Reached frame."""
        try:
            rows = [[] if v.WhichOneof("kind") in (None, "none") else wire.decode_value(v, blobs)
                    for v in (r.updates, r.evals, r.events)]
            stats = wire.decode_stats(r.stats)
        except wire.WireError as e:
            raise self.fail(f"sent a malformed {what}: {e}") from e
        try:
            check_rows(self.plan, self.agent_id, *rows, self.session.limits.max_blob_bytes)
        except RowError as e:
            raise self.fail(f"sent a malformed {what}: {e}") from e
        try:
            updates = [(RowKey(*k), UpdateRow(*row)) for k, row in rows[0]]
            evals = [(RowKey(*k), EvalRow(*row)) for k, row in rows[1]]
        except TypeError as e:
            raise self.fail(f"sent a malformed {what}: a row of the wrong length ({e})") from None
        return updates, evals, rows[2], stats

    def _check_events(self, events: list[RemoteEvent]) -> None:
        placement = self.plan.placement
        n = len(placement)
        for ev in events:
            if not 0 <= ev.dst < n:
                raise self.fail(f"sent a malformed Reached: an event for unknown vworker {ev.dst} "
                                f"(the plan has vworkers 0..{n - 1})")
            if not 0 <= ev.origin < n or placement[ev.origin] != self.agent_id:
                raise self.fail(f"sent a malformed Reached: an event from vworker {ev.origin}, "
                                "which this agent does not host")
            if placement[ev.dst] == self.agent_id:
                raise self.fail(f"sent a malformed Reached: an event for its own vworker {ev.dst}")

    def advance(self, window_end: int, inbound: list[RemoteEvent], stop_at: int | None,
                max_events: int | None) -> Reached:
        self.begin_advance(window_end, inbound, stop_at, max_events)
        return self.end_advance()

    def _call(self, method: str, *args: Any) -> Any:
        self._calls += 1
        f = pb.ControllerFrame()
        f.call.id, f.call.method = self._calls, method
        wire.encode_value(tuple(args), f.call.args)
        self.session.send(f)
        msg, blobs = self._receive(f"reply to {method}")
        if msg.WhichOneof("body") != "reply" or msg.reply.id != self._calls:
            raise self.fail(f"protocol error: expected the reply to {method}, got {msg.WhichOneof('body')}")
        try:
            return wire.decode_value(msg.reply.value, blobs)
        except wire.WireError as e:
            raise self.fail(f"sent a malformed reply to {method}: {e}") from e

    def begin_checkpoint(self, window: int) -> None:
        """Between two windows of the controller's loop: ask for ``checkpoint(window)`` (every agent saves at
        once; :meth:`end_checkpoint` reads the answer)."""
        self._calls += 1
        f = pb.ControllerFrame()
        f.call.id, f.call.method = self._calls, "checkpoint"
        wire.encode_value((window,), f.call.args)
        self.session.send(f)

    def end_checkpoint(self) -> list:
        """The values of the agent's reply frames to ``checkpoint`` (controller/checkpoints.py reads them)."""
        out = []
        while True:
            msg, blobs = self._receive("reply to checkpoint")
            if msg.WhichOneof("body") != "reply" or msg.reply.id != self._calls:
                raise self.fail(f"protocol error: expected the reply to checkpoint, got {msg.WhichOneof('body')}")
            try:
                value = wire.decode_value(msg.reply.value, blobs)
            except wire.WireError as e:
                raise self.fail(f"sent a malformed reply to checkpoint: {e}") from e
            out.append(value)
            if not (isinstance(value, tuple) and len(value) == 5 and value[0] == "ok"
                    and isinstance(value[2], int) and isinstance(value[3], int) and value[2] < value[3] - 1):
                return out

    def result_params(self):
        return self._call("result_params")

    def final_eval(self, t: int, iteration: int):
        return self._call("final_eval", t, iteration)

    def info(self) -> dict[str, Any]:
        return self._call("info") or {}

    def metrics_text(self) -> str:
        """The agent's Prometheus exposition now (its final values after the last window)."""
        return self._call("metrics") or ""

    def close(self, abort: str | None = None) -> None:
        """Tell the agent the run is over (Done, or Abort with a reason) and end the stream."""
        if self._closed:
            return
        self._closed = True
        f = pb.ControllerFrame()
        f.shutdown.abort = abort is not None
        f.shutdown.reason = abort or ""
        self.session.send(f)
        self.session.end()


class RemoteAgents:
    """Serve the protocol, start agents with ``launcher``, and hand out :class:`RemoteAgent` handles.

    Used as ``execute(..., launcher=RemoteAgents(LocalLauncher(), settings))``.
    """

    def __init__(self, launcher: Any, settings: ControllerSettings = ControllerSettings(),
                 log_level: str = "INFO", extra_env: dict[str, str] | None = None):
        self.launcher, self.settings, self.log_level = launcher, settings, log_level
        self.extra_env = dict(extra_env or {})
        self.server: ControllerServer | None = None
        self.handles: list[RemoteAgent] = []
        self._started = False
        self._failed: str | None = None

    def log_tail(self, agent_id: int) -> str:
        fn = getattr(self.launcher, "log_tail", None)
        return fn(agent_id) if fn is not None else ""

    def check(self) -> None:
        """Raise Stopped on a requested stop (SIGINT, SIGTERM), AgentFailure when an agent process died."""
        signals.check()
        if self._started:
            self.launcher.check()

    def start_agents(self, plan: Plan, run_dir: Path, plan_json: str | None = None) -> list[RemoteAgent]:
        """Serve ``plan`` and start its agents; ``plan_json``: ``plan.to_json()`` when the caller made it already."""
        s = self.settings
        token = resolve_token(s.token_file)
        prepare = getattr(self.launcher, "prepare", None)
        if prepare is not None:  # e.g. start a Ray cluster: before the server's threads, which forks disturb
            self._started = True
            try:
                prepare(plan.n_agents)
            except BaseException:
                self.close(abort="the agents could not be started")
                raise
        self.server = ControllerServer(token, plan.run_id, plan.to_json() if plan_json is None else plan_json,
                                       plan.n_agents, s, plan.limits)
        address = self.server.start()
        m = plan.metrics
        # the agents this controller starts trust the modules of its own config, and verify it with TLS
        env = {**self.extra_env, TRUST_ENV: ",".join(modules_to_trust(plan)), **agent_tls_env(s.tls)}
        spec = LaunchSpec(run_id=plan.run_id, n_agents=plan.n_agents, controller_address=address, token=token,
                          run_dir=Path(run_dir), log_level=self.log_level, extra_env=env,
                          metrics_port=m.port if m.serve else 0)
        try:
            self._started = True
            self.launcher.start(spec)
            self.handles = self._await_ready(plan)
        except BaseException:
            self.close(abort="the agents could not be started")
            raise
        return self.handles

    def _await_ready(self, plan: Plan) -> list[RemoteAgent]:
        """Wait until every agent registered, opened its session and built its vworkers (Ready)."""
        srv, s = self.server, self.settings
        deadline = time.monotonic() + s.startup_timeout_s
        ready: dict[int, RemoteAgent] = {}
        while len(ready) < plan.n_agents:
            self.check()
            now = time.monotonic()
            with srv.lock:
                sessions = dict(srv.sessions)
            for aid, sess in sessions.items():
                if aid in ready:
                    continue
                h = RemoteAgent(aid, sess, plan, 0, self.check, s.agent_timeout_s, self.log_tail)
                try:
                    item = sess.inbox.get_nowait()
                except queue.Empty:
                    if now - sess.last_seen > s.agent_timeout_s:
                        raise h.fail(f"registered but sent nothing for {now - sess.last_seen:.1f} s "
                                     f"(controller.agent_timeout_s={s.agent_timeout_s:g})")
                    continue
                sess.inbox.put(item)  # let _receive interpret it (closed / failure / ready)
                msg, _ = h._receive("Ready")
                if msg.WhichOneof("body") != "ready":
                    raise h.fail(f"protocol error: expected Ready, got {msg.WhichOneof('body')}")
                h._set_times("Ready", msg.ready.next_time, msg.ready.horizon)
                h.metrics_address = msg.ready.metrics_address
                ready[aid] = h
            if len(ready) < plan.n_agents:
                if now > deadline:
                    missing = [a for a in range(plan.n_agents) if a not in ready]
                    first = missing[0]
                    raise AgentFailure(str(first), f"not ready after {s.startup_timeout_s:g} s "
                                       f"(controller.startup_timeout_s); agents not ready: {missing}",
                                       self.log_tail(first))
                with srv.lock:
                    srv.changed.wait(_POLL_S)
        handles = [ready[a] for a in range(plan.n_agents)]
        # where each agent takes direct tensor streams (agents/direct.py), before the first Advance: every
        # agent gets its own key for each peer, so none can present itself as another
        for h in handles:
            f = pb.ControllerFrame()
            f.peers.SetInParent()
            for peer in handles:
                info = peer.session.info
                if peer is not h and info.get("data_address") and len(info.get("data_secret") or b"") == 32:
                    f.peers.peers.add(agent_id=peer.agent_id, address=info["data_address"],
                                      secret=pair_key(info["data_secret"], h.agent_id, peer.agent_id))
            h.session.send(f)
        return handles

    def close(self, abort: str | None = None, restart: bool = False) -> None:
        """Shut the agents down (Done, or Abort), stop the launcher and the server. Idempotent.

        ``restart``: new agents follow (docs/recovery.md); the launcher may keep what they share (Ray's
        cluster), which the next ``close`` without ``restart`` releases.
        """
        for h in self.handles:
            try:
                h.close(abort)
            except Exception:  # noqa: BLE001 - closing must go on for the others
                log.debug("closing agent %d", h.agent_id, exc_info=True)
        if self.server is not None:
            handled = {h.agent_id for h in self.handles}
            with self.server.lock:
                for aid, sess in self.server.sessions.items():
                    if aid not in handled:
                        sess.end()
        if self._started:
            self._started = restart  # a restarted launcher still holds its cluster: the last close stops it
            if restart:
                self.launcher.stop(restart=True)
            else:
                self.launcher.stop()
        if self.server is not None:
            self.server.stop(grace=0 if abort else 0.5)
            self.server = None


def launcher_for(rc: RunConfig) -> RemoteAgents | None:
    """The ``launcher=`` of a validated config: None for inprocess, else RemoteAgents over it."""
    cfg = rc.launcher
    if isinstance(cfg, InprocessLauncherConfig):
        return None
    if isinstance(cfg, LocalLauncherConfig):
        from controller.launchers.local import LocalLauncher

        impl: Any = LocalLauncher(cfg)
    elif isinstance(cfg, KubernetesLauncherConfig):
        from controller.launchers.kubernetes import KubernetesLauncher  # imports the kubernetes client lazily

        impl = KubernetesLauncher(cfg)
    elif isinstance(cfg, RayLauncherConfig):
        from controller.launchers.ray import RayLauncher  # imports Ray lazily, when the run starts its agents

        impl = RayLauncher(cfg)
    else:
        raise ValueError(f"launcher={cfg.name!r} is not available in this version; accepted: inprocess | local | "
                         "kubernetes | ray")
    return RemoteAgents(impl, rc.controller, log_level=rc.log_level)

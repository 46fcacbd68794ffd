"""What a run shows besides its CSVs (DESIGN §8–§9): metrics endpoints, trace.json, the state log, logs.

:class:`Observer` is made by the session before the run and handed to
:func:`controller.run.execute`:

* ``prepare(plan)`` sets the plan's trace, state-log and agent-metrics specs
  (so every agent, in-process or remote, traces alike), starts the controller's
  ``/metrics`` endpoint when ``metrics.port`` is not null and writes
  ``endpoints.json`` and ``prometheus-targets.json``, and a copy of the latter in :func:`targets_dir`, where
  one Prometheus finds every run of the machine (removed when the run stops serving);
* ``agent_metrics(agent_id)`` gives an in-process agent its own registry and
  endpoint; a remote agent serves its own (``plan.metrics``, see
  ``agents/agent.py``), reports the address in ``Ready``, and ``execute()``
  lists it with ``add_agent_endpoint``; its final exposition comes back through
  ``add_agent_exposition``;
* ``hold(close)``: while lingering, remote agents must keep serving, so
  ``execute()`` hands the launcher's ``close`` here and ``finish`` calls it;
* ``on_events(rows)`` receives each window's ``Reached.events``;
* ``close_outputs(stop_time)`` writes ``trace.json`` and ``statelog.jsonl``;
* ``finish(summary)`` sets the final values, writes ``metrics.prom``, keeps
  serving ``metrics.linger_s`` wall seconds so Prometheus scrapes the end of
  the run, then stops the endpoints.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from agents.common.plan import Plan
from agents.observe.metrics import AgentMetricsSpec, Metrics, serve, write_exposition, write_scrape_targets
from agents.observe.statelog import StateLogWriter, StatelogSpec
from agents.observe.trace import TRACE_KIND, TraceWriter, trace_spec
from agents.sim.env import RowKey
from agents.workloads.datanet import FETCH_KIND
from controller import signals
from controller.config import RunConfig
from controller.outputs import write_json_atomic

__all__ = ["Observer", "TARGETS_DIR_ENV", "agent_log_path", "targets_dir"]

log = logging.getLogger(__name__)


def agent_log_path(run_dir: Path, agent_id: int) -> Path:
    """Where a launcher that can (``local``) sends agent ``agent_id``'s stdout and stderr."""
    d = Path(run_dir) / "agents"
    d.mkdir(parents=True, exist_ok=True)
    return d / f"agent-{agent_id}.log"


TARGETS_DIR_ENV = "LOCKSTEP_PROMETHEUS_TARGETS_DIR"


def targets_dir() -> Path:
    """The directory where every serving run of this machine also writes its ``prometheus-targets.json``:
    Prometheus' file discovery takes a wildcard only in a path's last element, so ``outputs/*/*/`` cannot
    be watched. ``$LOCKSTEP_PROMETHEUS_TARGETS_DIR``, else ``${XDG_CACHE_HOME:-~/.cache}/lockstep/prometheus-targets``
    (as the profile database, agents.sim.compute.default_profile_db)."""
    env = os.environ.get(TARGETS_DIR_ENV)
    if env:
        return Path(env)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lockstep" / "prometheus-targets"


def _scrape_host(host: str) -> str:
    return socket.getfqdn() if host in ("0.0.0.0", "::", "") else host


class Observer:
    def __init__(self, rc: RunConfig, run_dir: Path):
        self.rc, self.run_dir = rc, Path(run_dir)
        m = rc.metrics
        self.port: int | None = m.port
        self.host: str = m.host
        self.per_worker: bool = m.per_worker
        self.linger_s: float = m.linger_s
        self.agent_port: int = m.agent_port
        self.expositions: dict[int, bytes] = {}  # remote agents' final /metrics text
        self._held: list[Any] = []
        self.registry = CollectorRegistry()
        self.metrics = Metrics(self.registry, role="controller", per_worker=self.per_worker)
        self.agents: dict[int, tuple[CollectorRegistry, Metrics]] = {}
        self.endpoints: dict[str, Any] = {"controller": None, "agents": {}}
        self._servers: list[Any] = []
        self.shared_targets: Path | None = None  # the run's copy in targets_dir(), while it serves
        self.trace: TraceWriter | None = None
        self.statelog: StateLogWriter | None = None
        self.plan: Plan | None = None
        self.interrupted = False  # SIGINT/SIGTERM stopped the run: its agents end "stopped", not "failed"
        self._stop = threading.Event()

    # ------------------------------------------------------------ start
    def configure(self, plan: Plan) -> None:
        """The plan's settings for the agents (trace, state log, metrics), which plan.json holds; nothing is
        written or served yet (a resume compares the plan first and may refuse it)."""
        t, s = self.rc.trace, self.rc.statelog
        plan.trace = trace_spec(t.mode, t.sample_every, t.window_s, t.max_events,
                                [v.holds_data for v in plan.vworkers])
        plan.statelog = StatelogSpec(s.enabled, s.checksum, s.snapshot_every)
        # remote agents serve their own /metrics whenever the controller serves (agents/agent.py)
        plan.metrics = AgentMetricsSpec(serve=self.port is not None, host=self.host, port=self.agent_port,
                                        per_worker=self.per_worker)

    def prepare(self, plan: Plan) -> None:
        """The output writers and the controller endpoint, for a plan :meth:`configure` has set."""
        self.plan = plan
        self._open_writers()
        self.metrics.set_agents({"registered": plan.n_agents})
        if self.port is not None:
            try:
                server, port = serve(self.registry, self.host, self.port)
            except OSError as e:
                from controller.server import ListenError

                raise ListenError(f"cannot serve metrics on {self.host}:{self.port} (metrics.host / metrics.port): "
                                  f"{e.strerror or e}") from e
            self._servers.append(server)
            self.endpoints["controller"] = f"{_scrape_host(self.host)}:{port}"
            # named by run id and run directory: two runs never share a file, a resumed run takes its own again
            digest = hashlib.sha256(str(self.run_dir.resolve()).encode()).hexdigest()[:8]
            self.shared_targets = targets_dir() / f"{plan.run_id}-{digest}.json"
            print(f"lockstep: metrics on http://{self.endpoints['controller']}/metrics", file=sys.stderr)
            self._write_endpoints()

    def _open_writers(self) -> None:
        plan, ts, s = self.plan, self.plan.trace, self.rc.statelog
        if ts.mode != "off":
            self.trace = TraceWriter(self.run_dir / "trace.json", plan.names, plan.placement,
                                     keep=ts.keep, window_ns=ts.window_ns,
                                     max_events=ts.max_events,
                                     meta={"run_id": plan.run_id, "strategy": plan.strategy, "trace_mode": ts.mode})
        if s.enabled:
            self.statelog = StateLogWriter(self.run_dir)

    def rewind(self) -> None:
        """The run replays from virtual time 0 (docs/recovery.md): trace.json and the state log start over
        (both are written at the end of the run, from memory)."""
        if self.plan is not None:
            self._open_writers()

    def checkpoint_state(self) -> dict[str, Any]:
        """Where the state log and the trace's spool stand (after a window's flush), for a checkpoint."""
        state: dict[str, Any] = {"statelog": None, "trace": None}
        sl, tw = self.statelog, self.trace
        if sl is not None:
            if sl._f is not None:
                sl._f.flush()
            size = sl.path.stat().st_size if sl._f is not None else 0
            state["statelog"] = {"bytes": size, "rows": list(sl.rows), "snapshots": sl.snapshots}
        if tw is not None:
            tw.flush()
            size = tw.spool.stat().st_size if tw._spool is not None else 0
            state["trace"] = {"bytes": size, "truncated": tw.truncated}
        return state

    def restore_outputs(self, state: dict[str, Any]) -> None:
        """The run goes on from a checkpoint: the state log and the trace's spool are cut back to where they
        stood then (what follows is written again, the same) and the trace's records are read back."""
        from agents.observe.statelog import read_jsonl

        if self.plan is None:
            return
        self._open_writers()
        sl, tw = self.statelog, self.trace
        if (sl is None) != (state.get("statelog") is None) or (tw is None) != (state.get("trace") is None):
            raise ValueError("the checkpoint was taken with other statelog / trace settings")
        if sl is not None:
            st = state["statelog"]
            _cut_to(sl.path, st["bytes"])
            sl._f = open(sl.path, "a")
            sl.rows, sl.snapshots = list(st["rows"]), st["snapshots"]
        if tw is not None:
            st = state["trace"]
            _cut_to(tw.spool, st["bytes"])
            for rec in (read_jsonl(tw.spool) if st["bytes"] else ()):
                tw.add(tuple(rec))
            tw._unspooled = []
            tw.truncated = st["truncated"]
            tw._spool = open(tw.spool, "a")

    def agent_metrics(self, agent_id: int) -> Metrics:
        """An in-process agent's Metrics, on its own registry (and endpoint when serving)."""
        reg = CollectorRegistry()
        m = Metrics(reg, role="agent", per_worker=self.per_worker)
        self.agents[agent_id] = (reg, m)
        if self.port is not None:
            server, port = serve(reg, self.host, 0)
            self._servers.append(server)
            self.add_agent_endpoint(agent_id, f"{_scrape_host(self.host)}:{port}")
        return m

    def add_agent_endpoint(self, agent_id: int, address: str) -> None:
        """A (remote) agent serves its metrics on ``address`` (host:port): list it for Prometheus."""
        self.endpoints["agents"][str(agent_id)] = address
        if self.endpoints["controller"] is not None:
            self._write_endpoints()

    def add_agent_exposition(self, agent_id: int, text: str | bytes) -> None:
        """A remote agent's final exposition: written to ``metrics-agent-N.prom`` by ``finish``."""
        self.expositions[agent_id] = text.encode() if isinstance(text, str) else bytes(text)

    @property
    def lingers(self) -> bool:
        return self.port is not None and self.linger_s > 0

    def hold(self, close: Any) -> bool:
        """Call ``close()`` after the linger instead of now, so Prometheus scrapes the agents' final values.

        Returns False (and keeps nothing) when this run does not linger: the caller closes at once.
        """
        if not self.lingers:
            return False
        self._held.append(close)
        return True

    def _write_endpoints(self) -> None:
        write_json_atomic(self.run_dir / "endpoints.json", self.endpoints)
        targets = {"controller": [self.endpoints["controller"]]}
        agents = [self.endpoints["agents"][k] for k in sorted(self.endpoints["agents"], key=int)]
        if agents:
            targets["agent"] = agents
        run_id = self.plan.run_id if self.plan is not None else ""
        write_scrape_targets(self.run_dir / "prometheus-targets.json", targets, run_id=run_id)
        if self.shared_targets is not None:
            try:
                self.shared_targets.parent.mkdir(parents=True, exist_ok=True)
                write_scrape_targets(self.shared_targets, targets, run_id=run_id)
            except OSError as e:  # the run's own file is there: a Prometheus can still be pointed at it
                log.warning("cannot list the run's metrics endpoints in %s (%s; $%s names another directory); "
                            "they are in %s", self.shared_targets.parent, e.strerror or e, TARGETS_DIR_ENV,
                            self.run_dir / "prometheus-targets.json")
                self.shared_targets = None

    def running(self) -> None:
        if self.plan is not None:
            self.metrics.set_agents({"running": self.plan.n_agents})

    # ------------------------------------------------------------ during
    def on_events(self, rows: list[tuple]) -> None:
        """One agent's ``Reached.events`` of a window: trace records and state-log rows."""
        tw, sl = self.trace, self.statelog
        for key, kind, name, fields in rows:
            if kind == TRACE_KIND:
                if tw is not None:
                    tw.add(fields)
            elif kind != FETCH_KIND:  # state, a crash and its recovery, a strategy's own records
                if sl is not None:
                    sl.add(RowKey(*key), kind, name, fields)  # (a plain tuple when it crossed the wire)

    def flush(self, before: int) -> None:
        """After every window, before its rows: final state-log rows and trace records go to disk."""
        if self.statelog is not None:
            self.statelog.flush(before)
        if self.trace is not None:
            self.trace.flush()

    # ------------------------------------------------------------ end
    def close_outputs(self, stop_time: int | None, complete: bool = True) -> None:
        """Write trace.json and statelog.jsonl (also after a failed run: they help find out why). A run that
        is not ``complete`` keeps the trace's spool, which its checkpoints count on when it is resumed."""
        if self.trace is not None:
            self.trace.close(stop_time, keep_spool=not complete)
            if self.trace.truncated:
                log.warning("trace.json stops at trace.max_events=%s events; use trace.mode=sample or window, "
                            "or raise trace.max_events", self.trace.max_events)
        if self.statelog is not None:
            self.statelog.close(stop_time)

    def stopping(self, timeout_s: float = 2.0) -> None:
        """SIGINT/SIGTERM, before the agents are told to stop: their values now, scraped from the ``/metrics``
        they serve (the control stream may be in the middle of a window), for ``metrics-agent-N.prom``; and
        ``lockstep_agents{state="stopped"}`` at the end. An agent that does not answer within ``timeout_s``
        gets no file (a warning says so): the stop must not wait on it."""
        import urllib.request

        self.interrupted = True
        for key, address in sorted(self.endpoints["agents"].items(), key=lambda kv: int(kv[0])):
            agent_id = int(key)
            if agent_id in self.agents:  # in-process: finish writes its registry
                continue
            try:
                with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout_s) as r:
                    self.add_agent_exposition(agent_id, r.read())
            except OSError as e:
                log.warning("agent %d's metrics at %s could not be read before it was stopped (%s): no "
                            "metrics-agent-%d.prom", agent_id, address, e, agent_id)

    def finish(self, summary: dict[str, Any] | None) -> None:
        """Final values and ``metrics.prom``; linger (after a successful run); stop serving."""
        try:
            if summary is not None:
                self.metrics.set_virtual_time(summary["virtual_time_ns"])
                self.metrics.set_speed_ratio(summary["speed_ratio"])
            if self.plan is None:  # the run never started (e.g. a refused resume): the files stay as they were
                return
            state = "stopped" if self.interrupted else "done" if summary is not None else "failed"
            self.metrics.set_agents({state: self.plan.n_agents})
            write_exposition(self.registry, self.run_dir / "metrics.prom")
            for agent_id, (reg, _) in sorted(self.agents.items()):
                write_exposition(reg, self.run_dir / f"metrics-agent-{agent_id}.prom")
            for agent_id, text in sorted(self.expositions.items()):
                (self.run_dir / f"metrics-agent-{agent_id}.prom").write_bytes(text)
            if summary is not None and self._servers and self.linger_s > 0:
                self._linger()
        finally:
            held, self._held = self._held, []
            for close in held:
                try:
                    close()
                except Exception:  # noqa: BLE001 - the servers below must stop too
                    log.warning("stopping the agents after the linger failed", exc_info=True)
            for server in self._servers:
                server.shutdown()
                server.server_close()
            self._servers.clear()
            if self.shared_targets is not None:  # Prometheus stops scraping the run
                try:
                    self.shared_targets.unlink(missing_ok=True)
                except OSError as e:
                    log.warning("could not remove %s (%s): Prometheus keeps trying the run's endpoints",
                                self.shared_targets, e.strerror or e)
                self.shared_targets = None

    def _linger(self) -> None:
        print(f"lockstep: run done; serving metrics {self.linger_s:g} s more (metrics.linger_s; "
              "SIGTERM or Ctrl-C ends it)", file=sys.stderr)
        deadline = time.monotonic() + self.linger_s
        try:
            while not self._stop.is_set() and (left := deadline - time.monotonic()) > 0:
                if signals.wait(min(left, 0.1)):  # controller/signals.py records SIGTERM and SIGINT
                    break
        except KeyboardInterrupt:  # signals not installed (an API caller): Ctrl-C still ends it
            pass

    def stop_lingering(self) -> None:
        self._stop.set()


def _cut_to(path: Path, size: int) -> None:
    """Cut ``path`` back to its first ``size`` bytes (a checkpoint's offset); it must have them."""
    have = path.stat().st_size if path.exists() else 0
    if have < size:
        raise ValueError(f"{path} has {have} bytes, fewer than the {size} a checkpoint counted")
    if size == 0:
        path.unlink(missing_ok=True)
        return
    with open(path, "rb+") as f:
        f.truncate(size)


def endpoints(run_dir: Path) -> dict[str, Any]:
    """The run's ``endpoints.json`` (controller and agent ``host:port``)."""
    return json.loads((Path(run_dir) / "endpoints.json").read_text())

"""Prometheus metrics of a run — DESIGN §9, docs/observability.md.

One :class:`Metrics` per process, built on a ``CollectorRegistry`` that the
caller passes in: library code never touches prometheus_client's global
registry, and each test makes its own. The controller and the agents register
different families (``role``), so a family exists on exactly the processes
that know its value and a dashboard ``sum()`` never counts a thing twice:

* controller — the global clock and window barrier, the run's updates, loss,
  staleness and accuracy (agents report them in ``Reached`` stats), speed
  ratio, agents by state, run info;
* agent — its local clock, events, messages and bytes sent (local/remote),
  compute time by kind.

Virtual time arrives as integer nanoseconds and is converted to seconds only
here, at the edge. No label names a vworker unless ``per_worker=True``: a
1 024-worker run must not create 1 024 series per family.

This module is shared by controller and agents and so lives in ``agents/``,
which never imports ``controller/``.
"""
from __future__ import annotations

import json
import math
import os
import re
import socket
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Literal
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.exposition import make_wsgi_app
from prometheus_client.metrics_core import Metric

from agents.common.files import write_atomic
from agents.common.net import LOOPBACK
from agents.sim.types import NS_PER_S, VirtualTime

__all__ = [
    "AgentMetricsSpec",
    "AGENT_STATES",
    "BARRIER_BUCKETS_S",
    "Metrics",
    "Role",
    "STALENESS_BUCKETS",
    "serve",
    "write_exposition",
    "write_scrape_targets",
]

Role = Literal["controller", "agent"]
ROLES: tuple[Role, ...] = ("controller", "agent")

AGENT_STATES = ("registered", "running", "done", "failed", "stopped")
"""Values of the ``state`` label of ``lockstep_agents``."""

STALENESS_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128)
"""Upper bounds, in model updates, of ``lockstep_staleness_updates`` (+Inf is implied)."""

BARRIER_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                     0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds, in wall seconds, of ``lockstep_barrier_wait_seconds``: from an
in-process barrier (~100 µs) to a slow remote agent (tens of seconds)."""

_NAMESPACE = "lockstep"
_LABEL_VALUE = re.compile(r"[a-z][a-z0-9_]*\Z")
_RUN_INFO_KEYS = ("run_id", "config_hash", "strategy", "workers", "agents")


@dataclass(frozen=True)
class AgentMetricsSpec:
    """Whether and where an agent process serves its own /metrics (``Plan.metrics``; the controller decides)."""

    serve: bool = False
    host: str = LOOPBACK
    port: int = 0
    per_worker: bool = False


class Metrics:
    """The ``lockstep_*`` metric families of one process, registered on ``registry``.

    Registering twice on one registry raises ``ValueError`` (prometheus_client
    refuses duplicate names). Calling a method whose family belongs to the other
    role raises ``ValueError`` too: that is a wiring bug, not a runtime state.
    """

    def __init__(self, registry: CollectorRegistry, role: Role = "controller", *,
                 per_worker: bool = False) -> None:
        if role not in ROLES:
            raise ValueError(f"metrics role {role!r} is not one of {', '.join(ROLES)}")
        self.registry = registry
        self.role: Role = role
        self.per_worker = per_worker
        self._lock = threading.Lock()
        self._virtual_time_ns: VirtualTime = 0
        self._loss_time_ns: VirtualTime = -1

        def reg(kw: dict) -> dict:  # registered below, together, without their _created samples
            return dict(namespace=_NAMESPACE, registry=None, **kw)

        self.virtual_time = Gauge(
            "virtual_time", "Virtual time reached: the global clock on the controller, "
            "the local clock on an agent.", **reg(dict(unit="seconds")))

        if role == "controller":
            self.windows = Counter(
                "windows", "Time windows completed by the controller's barrier.", **reg({}))
            self.barrier_wait = Histogram(
                "barrier_wait", "Wall seconds the controller waited at a window barrier "
                "for every agent's Reached.", buckets=BARRIER_BUCKETS_S, **reg(dict(unit="seconds")))
            self.updates = Counter(
                "updates", "Global model updates applied.", **reg({}))
            self.training_loss = Gauge(
                "training_loss", "Training loss of the update with the latest virtual time.", **reg({}))
            self.test_accuracy = Gauge(
                "test_accuracy", "Test accuracy of the global model at the last evaluation, "
                "0 to 1.", **reg(dict(unit="ratio")))
            self.staleness = Histogram(
                "staleness", "Staleness of each update: global model versions applied between "
                "the read of the model and the update.", buckets=STALENESS_BUCKETS,
                **reg(dict(unit="updates")))
            self.speed = Gauge(
                "speed", "Speed ratio: virtual seconds emulated per wall second.",
                **reg(dict(unit="ratio")))
            self.agents = Gauge(
                "agents", "Agents by state.", labelnames=("state",), **reg({}))
            for state in AGENT_STATES:
                self.agents.labels(state=state).set(0)
            self.run_info = Info(
                "run", "The run: id, config hash, strategy, number of vworkers and agents.", **reg({}))
            self.data_hits = Counter(
                "data_cache_hits", "Samples a training worker found in its node's cache (data.placement="
                "end_devices).", **reg({}))
            self.data_misses = Counter(
                "data_cache_misses", "Samples a training worker had to fetch from its end devices.", **reg({}))
            self.data_bytes = Counter(
                "data_moved", "Bytes of training samples moved over the network.", **reg(dict(unit="bytes")))
            self.data_wait = Counter(
                "data_wait", "Virtual seconds training workers waited for their samples.",
                **reg(dict(unit="seconds")))
            if per_worker:
                self.worker_updates = Counter(
                    "worker_updates", "Global model updates contributed by each vworker.",
                    labelnames=("vworker",), **reg({}))
                self.worker_training_loss = Gauge(
                    "worker_training_loss", "Training loss of each vworker's latest update.",
                    labelnames=("vworker",), **reg({}))
        else:
            self.events = Counter(
                "events", "Kernel events processed.", **reg({}))
            self.messages = Counter(
                "messages", "Messages sent, by scope: local (same agent) or remote.",
                labelnames=("scope",), **reg({}))
            self.message_bytes = Counter(
                "message", "Payload bytes of messages sent, by scope.",
                labelnames=("scope",), **reg(dict(unit="bytes")))
            self.compute = Counter(
                "compute", "Real wall seconds spent computing, by kind.",
                labelnames=("kind",), **reg(dict(unit="seconds")))
            self.compute_virtual = Counter(
                "compute_virtual", "Virtual seconds charged for computing by the compute model, "
                "by kind.", labelnames=("kind",), **reg(dict(unit="seconds")))
            for scope in ("local", "remote"):
                self.messages.labels(scope=scope)
                self.message_bytes.labels(scope=scope)
            if per_worker:
                self.worker_compute = Counter(
                    "worker_compute", "Real wall seconds spent computing, by vworker and kind.",
                    labelnames=("vworker", "kind"), **reg(dict(unit="seconds")))
        registry.register(_WithoutCreated([v for v in vars(self).values()
                                           if isinstance(v, (Counter, Gauge, Histogram, Info))]))

    # -- both roles ---------------------------------------------------------

    def set_virtual_time(self, virtual_time_ns: VirtualTime) -> None:
        """Advance the clock gauge to ``virtual_time_ns``; it never moves backwards."""
        with self._lock:
            self._advance(virtual_time_ns)

    @property
    def virtual_time_ns(self) -> VirtualTime:
        """The clock gauge's value, in ns."""
        return self._virtual_time_ns

    # -- controller ---------------------------------------------------------

    def set_run_info(self, *, run_id: str, config_hash: str, strategy: str, workers: int,
                     agents: int, **extra: str) -> None:
        """Set ``lockstep_run_info``; ``extra`` adds labels such as ``launcher``."""
        self._need("controller", "set_run_info")
        labels = dict(run_id=run_id, config_hash=config_hash, strategy=strategy,
                      workers=workers, agents=agents, **extra)
        for key in extra:
            if not _LABEL_VALUE.match(key):
                raise ValueError(f"run info label {key!r} is not a lower-case identifier")
        self.run_info.info({k: str(v) for k, v in labels.items()})

    def observe_window(self, virtual_time_ns: VirtualTime, barrier_wall_s: float, windows: int = 1) -> None:
        """A window that started at ``virtual_time_ns`` ended after the barrier waited ``barrier_wall_s``.

        ``windows`` > 1: that many windows, reported together (direct windows), ``barrier_wall_s`` for all.
        """
        self._need("controller", "observe_window")
        if not barrier_wall_s >= 0:
            raise ValueError(f"barrier wait must be >= 0 wall seconds, got {barrier_wall_s!r}")
        with self._lock:
            self._advance(virtual_time_ns)
        if windows > 0:
            self.windows.inc(windows)
            self.barrier_wait.observe(barrier_wall_s / windows)

    def add_windows(self, windows: int) -> None:
        """Windows a resumed run had done before the checkpoint it restarts from (``lockstep resume``): they
        count as they did for the controller that ran them, with no barrier wait of this one."""
        self._need("controller", "add_windows")
        if windows > 0:
            self.windows.inc(windows)

    def record_update(self, virtual_time_ns: VirtualTime, loss: float, staleness: int,
                      vworker: str | int | None = None) -> None:
        """One global model update at ``virtual_time_ns`` with its training loss and staleness.

        Updates of one window may arrive out of virtual-time order (from several
        agents); the loss gauge keeps the loss of the latest update in virtual time.
        """
        self._need("controller", "record_update")
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0 updates, got {staleness!r}")
        with self._lock:
            self._advance(virtual_time_ns)
            if virtual_time_ns >= self._loss_time_ns:
                self._loss_time_ns = virtual_time_ns
                self.training_loss.set(loss)
        self.updates.inc()
        self.staleness.observe(staleness)
        if self.per_worker and vworker is not None:
            self.worker_updates.labels(vworker=str(vworker)).inc()
            self.worker_training_loss.labels(vworker=str(vworker)).set(loss)

    def add_data(self, hits: int, misses: int, nbytes: int, wait_s: float) -> None:
        """One data fetch of a training worker (data.placement=end_devices)."""
        self._need("controller", "add_data")
        self.data_hits.inc(hits)
        self.data_misses.inc(misses)
        self.data_bytes.inc(nbytes)
        self.data_wait.inc(wait_s)

    def set_accuracy(self, accuracy: float) -> None:
        """Test accuracy of the global model, a ratio in [0, 1] (not a percentage)."""
        self._need("controller", "set_accuracy")
        if not 0.0 <= accuracy <= 1.0:
            raise ValueError(f"test accuracy must be a ratio in [0, 1], got {accuracy!r}")
        self.test_accuracy.set(accuracy)

    def set_speed_ratio(self, ratio: float) -> None:
        """Virtual seconds emulated per wall second so far."""
        self._need("controller", "set_speed_ratio")
        if not (ratio >= 0 and math.isfinite(ratio)):
            raise ValueError(f"speed ratio must be a finite number >= 0, got {ratio!r}")
        self.speed.set(ratio)

    def set_agents(self, state_counts: Mapping[str, int]) -> None:
        """Number of agents in each state; states left out are set to 0."""
        self._need("controller", "set_agents")
        unknown = set(state_counts) - set(AGENT_STATES)
        if unknown:
            raise ValueError(f"unknown agent state(s) {sorted(unknown)}; "
                             f"accepted: {', '.join(AGENT_STATES)}")
        for state in AGENT_STATES:
            self.agents.labels(state=state).set(state_counts.get(state, 0))

    # -- agent --------------------------------------------------------------

    def add_events(self, n: int) -> None:
        """``n`` kernel events were processed."""
        self._need("agent", "add_events")
        if n < 0:
            raise ValueError(f"event count must be >= 0, got {n!r}")
        self.events.inc(n)

    def add_message(self, nbytes: int, remote: bool) -> None:
        """One message of ``nbytes`` payload bytes was sent, to another agent if ``remote``."""
        self._need("agent", "add_message")
        if nbytes < 0:
            raise ValueError(f"message size must be >= 0 bytes, got {nbytes!r}")
        scope = "remote" if remote else "local"
        self.messages.labels(scope=scope).inc()
        self.message_bytes.labels(scope=scope).inc(nbytes)

    def add_messages(self, count: int, nbytes: int, remote: bool) -> None:
        """``count`` messages with ``nbytes`` payload bytes in all were sent (a window's worth)."""
        self._need("agent", "add_messages")
        if count < 0 or nbytes < 0:
            raise ValueError(f"message count and size must be >= 0, got {count!r} and {nbytes!r}")
        scope = "remote" if remote else "local"
        self.messages.labels(scope=scope).inc(count)
        self.message_bytes.labels(scope=scope).inc(nbytes)

    def add_compute(self, kind: str, wall_s: float, virtual_ns: VirtualTime,
                    vworker: str | int | None = None) -> None:
        """A compute step of ``kind`` (gradient, update, aggregate, or a custom strategy's own) took
        ``wall_s`` real seconds and was charged ``virtual_ns`` of virtual time."""
        self._need("agent", "add_compute")
        if not _LABEL_VALUE.match(kind):
            raise ValueError(f"compute kind {kind!r} is not a lower-case identifier "
                             "such as gradient, update or aggregate")
        if wall_s < 0 or virtual_ns < 0:
            raise ValueError(f"compute times must be >= 0, got wall_s={wall_s!r}, "
                             f"virtual_ns={virtual_ns!r}")
        self.compute.labels(kind=kind).inc(wall_s)
        self.compute_virtual.labels(kind=kind).inc(virtual_ns / NS_PER_S)
        if vworker is not None:
            self.add_worker_compute(vworker, kind, wall_s)

    def add_worker_compute(self, vworker: str | int, kind: str, wall_s: float) -> None:
        """``vworker`` spent ``wall_s`` real seconds computing ``kind`` (only with ``per_worker``; the
        totals by kind come through :meth:`add_compute`)."""
        self._need("agent", "add_worker_compute")
        if not _LABEL_VALUE.match(kind):
            raise ValueError(f"compute kind {kind!r} is not a lower-case identifier "
                             "such as gradient, update or aggregate")
        if wall_s < 0:
            raise ValueError(f"compute time must be >= 0, got wall_s={wall_s!r}")
        if self.per_worker:
            self.worker_compute.labels(vworker=str(vworker), kind=kind).inc(wall_s)

    # -- internals ----------------------------------------------------------

    def _advance(self, virtual_time_ns: VirtualTime) -> None:
        if virtual_time_ns < 0:
            raise ValueError(f"virtual time must be >= 0 ns, got {virtual_time_ns!r}")
        if virtual_time_ns > self._virtual_time_ns:
            self._virtual_time_ns = virtual_time_ns
        self.virtual_time.set(self._virtual_time_ns / NS_PER_S)

    def _need(self, role: Role, method: str) -> None:
        if self.role != role:
            raise ValueError(f"Metrics.{method} records a {role} metric, but this Metrics "
                             f"was built with role={self.role!r}")


class _WithoutCreated:
    """A collector of one :class:`Metrics`' families, less the ``<name>_created`` sample prometheus_client adds
    to each counter and histogram: Prometheus 2 stores it as a series of its own (``lockstep_updates_created``)
    in either exposition format, and nothing reads it. Per registry, unlike prometheus_client's process-wide
    ``disable_created_metrics()``, which would change an embedding application's metrics too."""

    def __init__(self, metrics: Sequence[Counter | Gauge | Histogram | Info]) -> None:
        self._metrics = tuple(metrics)

    def describe(self) -> list[Metric]:
        """The families' names, so that a registry refuses a second Metrics (duplicate names)."""
        return [family for m in self._metrics for family in m.describe()]

    def collect(self) -> Iterator[Metric]:
        for m in self._metrics:
            for family in m.collect():  # a new Metric object on every call: ours to change
                created = family.name + "_created"
                family.samples = [s for s in family.samples if s.name != created]
                yield family


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _IPv6WSGIServer(_ThreadingWSGIServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        """Scrapes every second would flood stderr; stay quiet."""


def serve(registry: CollectorRegistry, host: str = LOOPBACK,
          port: int = 0) -> tuple[WSGIServer, int]:
    """Serve ``registry`` as Prometheus text on ``http://host:port/metrics`` from a daemon thread.

    ``port=0`` lets the OS pick a free port; the port actually bound is
    returned. Stop with ``server.shutdown(); server.server_close()``.
    (prometheus_client's ``start_http_server`` only returns its server from
    0.20 on; this works with every version the project accepts.)
    """
    server_class = _IPv6WSGIServer if ":" in host else _ThreadingWSGIServer
    server = make_server(host, port, make_wsgi_app(registry), server_class, handler_class=_QuietHandler)
    # A short poll interval makes shutdown() return promptly (it waits for the loop's next turn).
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                              name=f"metrics-{host}:{port}", daemon=True)
    thread.start()
    return server, server.server_address[1]


def write_exposition(registry: CollectorRegistry, path: str | os.PathLike[str]) -> Path:
    """Write the registry's Prometheus text exposition to ``path`` (e.g. ``metrics.prom``)."""
    return write_atomic(path, generate_latest(registry))


def write_scrape_targets(path: str | os.PathLike[str], targets: Mapping[str, Sequence[str]],
                         **labels: str) -> Path:
    """Write the run's endpoints as a Prometheus ``file_sd_configs`` file.

    ``targets`` maps a job (``controller``, ``agent``) to ``host:port`` addresses;
    ``labels`` (e.g. ``run_id``) are attached to every target. A Prometheus whose
    config lists this file in ``file_sd_configs`` (a wildcard only in its last element,
    ``dir/*.json``) starts scraping a run as soon as it appears, and stops when it goes.
    """
    groups = [{"targets": list(addrs), "labels": {"job": job, **labels}}
              for job, addrs in targets.items()]
    return write_atomic(path, json.dumps(groups, indent=2) + "\n")

"""``launcher=ray``: every agent is a Ray actor; and the Ray cluster of a ``hydra/launcher=ray`` sweep (DESIGN §10).

The only module of lockstep that imports ``ray``, and only when a run or a sweep uses it, so the
package works without Ray: :func:`available` asks ``importlib.util.find_spec`` (as Flower registers
its Ray backend), and config validation names the extra to install.

* **Cluster** (:class:`Connection`): ``launcher.address`` null starts a private cluster of one node for
  the run, every Ray server on 127.0.0.1, and stops it after the run; ``auto``, ``HOST:PORT`` or
  ``ray://HOST:PORT`` connect to a running cluster, which is left running. Inside a Ray worker (a job
  of a ``hydra/launcher=ray`` sweep) the worker's own connection is used.
* **Placement**: one placement group per run, one bundle per agent (``cpus_per_agent``, fractional
  ``gpus_per_agent``, ``memory_per_agent``, ``resources_per_agent``), ``launcher.strategy`` PACK,
  SPREAD, STRICT_PACK or STRICT_SPREAD. Agent ``i`` is the actor ``lockstep-<run id>-agent-<i>`` on
  bundle ``i``: an :class:`agents.hosted.HostedAgent` made remote at creation.
* **Protocol**: the actor runs the agent process's code: it dials the controller over gRPC as a pod
  does, with the same token, protocol version and run id checks. The token travels as an object in
  Ray's object store, passed by reference to ``HostedAgent.run``: it is never an actor argument, an
  option or part of the ``runtime_env``, which Ray's dashboard and state API show to anyone who can
  read them.
* **Logs**: a thread copies each actor's log lines into ``RUN_DIR/agents/agent-N.log`` every
  ``launcher.log_poll_s`` (and once more when the run stops).
* **Failures**: :meth:`RayLauncher.check` turns an actor that died, raised or returned into an
  :class:`AgentFailure` naming the agent, its node and Ray's reason; a placement group that cannot be
  placed fails the run after ``launcher.startup_timeout_s``.
* **Restarts** (``recovery.agents=restart``, docs/recovery.md): an actor that died, raised or returned is
  a lost agent, as a subprocess that exited is for ``launcher=local``. The controller stops every actor
  and starts a new set — the whole set, since the run is replayed from virtual time 0, which Ray's own
  ``max_restarts`` (one actor, with none of its state) cannot do — on the same connection and cluster,
  in a new placement group. The k-th set after the first is named ``lockstep-<run id>-r<k>-agent-<i>``
  (placement group ``lockstep-<run id>-r<k>``): no new actor waits for Ray to release a dead one's name.
"""
from __future__ import annotations

import importlib.util
import ipaddress
import logging
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from controller.config.schema import RayLauncherConfig, RayLocalClusterConfig, typed
from controller.launchers.base import AgentFailure, LauncherConfigError, LaunchSpec, first_line
from controller.launchers.local import log_tail

__all__ = ["RayLauncher", "Connection", "SweepCluster", "available", "bundle", "as_config", "INSTALL_HINT"]

log = logging.getLogger("lockstep.controller")

INSTALL_HINT = "pip install 'lockstep[ray]'"
HYDRA_RAY_LAUNCHER = "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"
PROBE_TIMEOUT_S = 5.0

# Ray turns 127.0.0.1 into this machine's routable address and listens on every interface unless
# multi-node clusters are off (its default on macOS and Windows). With them off, a cluster of one node
# lives on 127.0.0.1 alone: Ray's servers, workers and drivers. Read by every Ray process at import.
_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
_PRIVATE_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}  # a private cluster reports nothing anywhere


def available() -> bool:
    """Whether Ray is installed (without importing it)."""
    return importlib.util.find_spec("ray") is not None


def _ray():
    try:
        import ray  # noqa: PLC0415 - the one place lockstep imports Ray, on purpose lazily
    except ImportError as e:
        raise LauncherConfigError(f"launcher=ray needs Ray, which is not installed: {INSTALL_HINT}") from e
    return ray


def bundle(cfg: RayLauncherConfig) -> dict[str, float]:
    """What one agent reserves: its placement group bundle (and the actor's own request)."""
    b: dict[str, float] = {"CPU": float(cfg.cpus_per_agent)}
    if cfg.gpus_per_agent:
        b["GPU"] = float(cfg.gpus_per_agent)
    if cfg.memory_per_agent:
        b["memory"] = float(cfg.memory_per_agent)
    b.update({k: float(v) for k, v in (cfg.resources_per_agent or {}).items()})
    return b


def as_config(cfg: RayLauncherConfig | Mapping[str, Any] | None) -> RayLauncherConfig:
    """The typed ``launcher`` config from a validated config, or from a mapping (tests, tools)."""
    if isinstance(cfg, RayLauncherConfig):
        return cfg
    return typed(RayLauncherConfig, {**dict(cfg or {}), "name": "ray"})


# --- addresses ---------------------------------------------------------------------------------
def split_address(address: str) -> tuple[str, int] | None:
    """``HOST:PORT``, ``[V6]:PORT`` or ``ray://HOST:PORT`` as (host, port); None when it is not one."""
    m = re.fullmatch(r"(?:ray://)?(\[[^\]]+\]|[^:/\[\]]+):(\d{1,5})", address.strip())
    if m is None or not 0 < int(m.group(2)) < 65536:
        return None
    return m.group(1).strip("[]"), int(m.group(2))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Fail at once, with one sentence, when nothing listens at ``address`` (Ray itself retries for minutes)."""
    hp = split_address(address)
    if hp is None:
        return
    try:
        socket.create_connection(hp, timeout=timeout_s).close()
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise LauncherConfigError(
            f"launcher.address={address} is not reachable ({why}); accepted: null (a private Ray cluster "
            "for the run), auto (the cluster `ray start --head` runs on this machine) or the HOST:PORT "
            "(ray://HOST:PORT) of a running cluster's head") from e


# --- the cluster ---------------------------------------------------------------------------------
class Connection:
    """Ray for one run or one sweep: a running cluster, or a private one started here and stopped by close()."""

    def __init__(self, address: str | None, local: RayLocalClusterConfig | None = None, *, namespace: str | None = None,
                 log_to_driver: bool = False, min_cpus: float = 0, init_kwargs: Mapping[str, Any] | None = None):
        self.address, self.local, self.namespace = address, local or RayLocalClusterConfig(), namespace
        self.log_to_driver, self.min_cpus = log_to_driver, min_cpus
        self.init_kwargs = dict(init_kwargs or {})
        self.owned = False  # this connection started the cluster (and stops it)
        self.connected = False  # this connection called ray.init (and calls ray.shutdown)
        self._saved: dict[str, str | None] = {}
        self._saved_flag: Any = None

    @property
    def private(self) -> bool:
        return self.address is None

    def open(self) -> "Connection":
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            log.info("using this process's Ray connection (launcher.address is not used)")
            return self
        address = self.address
        if address is not None and address != "auto":
            probe(address)
        loopback = self.private or (address != "auto" and is_loopback((split_address(address) or ("",))[0]))
        if loopback:
            self._set_env({**_LOOPBACK_ENV, **(_PRIVATE_ENV if self.private else {})})
        ray = _ray()
        if address == "auto":
            self._check_auto(ray)
        if loopback:
            self._loopback_flag(ray)
        kwargs: dict[str, Any] = {"log_to_driver": self.log_to_driver, **self.init_kwargs}
        if self.namespace:
            kwargs["namespace"] = self.namespace
        if self.private:
            loc = self.local
            kwargs.update(include_dashboard=False,
                          num_cpus=loc.num_cpus or max(int(-(-self.min_cpus // 1)), os.cpu_count() or 1))
            if loc.num_gpus is not None:
                kwargs["num_gpus"] = loc.num_gpus
            if loc.resources:
                kwargs["resources"] = dict(loc.resources)
            if loc.object_store_memory is not None:
                kwargs["object_store_memory"] = int(loc.object_store_memory)
        else:
            kwargs["address"] = address
        t0 = time.monotonic()
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
            self._restore()
            if self.private:
                raise LauncherConfigError(f"a private Ray cluster could not start (launcher.local): {e}") from e
            auth = "" if os.environ.get("RAY_AUTH_MODE") else (
                " (a cluster with Ray's token authentication needs RAY_AUTH_MODE=token and its token in "
                "$RAY_AUTH_TOKEN or ~/.ray/auth_token)")
            raise LauncherConfigError(
                f"launcher.address={self.address}: Ray could not connect there ({first_line(e)}){auth}; accepted: "
                "null (a private cluster for the run), auto, or the HOST:PORT (ray://HOST:PORT) of a running "
                "cluster's head") from e
        self.connected, self.owned = True, self.private
        log.info("%s Ray cluster in %.1f s", "started a private" if self.owned else "connected to the",
                 time.monotonic() - t0)
        return self

    def _check_auto(self, ray: Any) -> None:
        """The cluster ``auto`` names as Ray resolves it ($RAY_ADDRESS, else the cluster `ray start` recorded)
        answers; ray.init itself is given ``auto``, which alone finds a token-authenticated cluster's token."""
        try:  # Ray's own lookup; a private API, hence the fallback to letting ray.init resolve it
            from ray._private.services import get_ray_address_from_environment  # noqa: PLC0415
        except ImportError:
            return
        try:
            found = get_ray_address_from_environment("auto", None)
        except ConnectionError:  # "Could not find any running Ray instance"
            found = None
        if not found:
            raise LauncherConfigError(
                "launcher.address=auto: no Ray cluster runs on this machine; accepted: start one with "
                "`ray start --head`, set $RAY_ADDRESS, or launcher.address=null for a private cluster per run")
        probe(found)
        if is_loopback((split_address(found) or ("",))[0]):
            self._set_env(_LOOPBACK_ENV)
            self._loopback_flag(ray)

    def _set_env(self, env: Mapping[str, str]) -> None:
        for k, v in env.items():
            self._saved.setdefault(k, os.environ.get(k))
            os.environ[k] = v

    def _loopback_flag(self, ray: Any) -> None:
        """Ray read the environment when it was imported; an earlier import needs its flag set too."""
        from ray._private import ray_constants  # noqa: PLC0415

        if self._saved_flag is None:
            self._saved_flag = ray_constants.ENABLE_RAY_CLUSTER
        ray_constants.ENABLE_RAY_CLUSTER = False

    def _restore(self) -> None:
        for k, v in self._saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved = {}
        if self._saved_flag is not None:
            from ray._private import ray_constants  # noqa: PLC0415

            ray_constants.ENABLE_RAY_CLUSTER = self._saved_flag
            self._saved_flag = None

    def close(self) -> None:
        """Disconnect; a private cluster is stopped with every process it started. Idempotent."""
        if self.connected:
            self.connected = False
            try:
                _ray().shutdown()
            finally:
                self._restore()
            if self.owned:
                log.info("stopped the private Ray cluster")
        self.owned = False

    def __getstate__(self) -> dict[str, Any]:  # a SweepCluster is pickled into every job of the sweep
        return {**self.__dict__, "connected": False, "owned": False, "_saved": {}, "_saved_flag": None}


# --- the launcher --------------------------------------------------------------------------------
class RayLauncher:
    """Runs each agent as a Ray actor; see the module docstring. ``cfg`` is the ``launcher`` config node.

    ``start`` may be called again after ``stop(restart=True)`` (docs/recovery.md), which keeps the connection
    (and a private cluster) for the new actors; ``stop()`` closes it.
    """

    restartable = True
    loss_grace_s = 3.0  # recovery waits this long for Ray to report a dead actor a peer already misses

    def __init__(self, cfg: RayLauncherConfig | Mapping[str, Any] | None = None):
        self.cfg = as_config(cfg)
        if not available():
            raise LauncherConfigError(f"launcher=ray needs Ray, which is not installed: {INSTALL_HINT}")
        if self.cfg.address not in (None, "auto"):
            probe(self.cfg.address)  # before the run writes anything
        self.conn: Connection | None = None
        self.pg: Any = None
        self.actors: list[Any] = []
        self.runs: list[Any] = []  # ObjectRef of each actor's run(): ready when the agent ended or died
        self._where: list[Any] = []  # ObjectRef of each actor's where()
        self.logs: list[Path] = []
        self._log_guard = threading.Lock()
        self._log_stop = threading.Event()
        self._log_thread: threading.Thread | None = None
        self._gone: set[int] = set()  # actors whose log can no longer be taken
        self._dial = ""  # the controller address the actors dial
        self._started_at = 0.0
        self._placed = False
        self._last_pg_check = -float("inf")
        self._stopping = False
        self._failure: AgentFailure | None = None
        self.incarnation = -1  # the set of actors started last: 0 the first, k the k-th restart's (names)
        self._prefix = ""  # lockstep-<run id>[-r<k>]: the placement group's name, and the actors' but -agent-<i>

    # --- the Launcher protocol -------------------------------------------------------------
    def prepare(self, n_agents: int) -> None:
        """Join the cluster, or start the private one (before the controller serves: Ray forks its servers)."""
        if self.conn is not None:
            return
        self._stopping = False
        cfg = self.cfg
        self.conn = Connection(cfg.address, cfg.local, min_cpus=n_agents * cfg.cpus_per_agent)
        try:
            self.conn.open()
        except BaseException:
            self.stop()
            raise
        from controller import signals

        signals.reclaim()  # ray.init took SIGTERM (an abort, exit 134): a stop must finalise the run's outputs

    def start(self, spec: LaunchSpec) -> None:
        if self.actors:
            raise RuntimeError("start() called twice; call stop() first")
        # what the previous set of actors (a restart's) left
        self._stopping, self._failure, self._gone, self._placed = False, None, set(), False
        self._last_pg_check = -float("inf")
        self._log_stop = threading.Event()
        self.prepare(spec.n_agents)
        try:
            self._start_actors(spec)
        except LauncherConfigError:
            self.stop()
            raise
        except (ValueError, TypeError, _ray().exceptions.RayError) as e:  # e.g. a runtime_env Ray cannot use
            self.stop()
            raise LauncherConfigError(f"Ray refused the run's placement group or agent actors: {first_line(e)}; "
                                      "check launcher.runtime_env, launcher.resources_per_agent and "
                                      "launcher.namespace") from e
        except BaseException:
            self.stop()
            raise

    def _start_actors(self, spec: LaunchSpec) -> None:
        from ray.util.placement_group import placement_group  # noqa: PLC0415
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # noqa: PLC0415

        from agents.hosted import HostedAgent  # noqa: PLC0415

        ray, cfg = _ray(), self.cfg
        bundle_ = bundle(cfg)
        if self.conn.owned:
            self._check_private_cluster_fits(ray, bundle_, spec.n_agents)
        controller = self._dial = self.controller_address(spec, ray)
        log_dir = Path(spec.run_dir) / "agents"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.logs = [log_dir / f"agent-{i}.log" for i in range(spec.n_agents)]
        self.incarnation += 1
        # the first free names from there: another run may hold these (two sweep jobs whose configs differ
        # only where the run id's hash does not look, started in the same second, get the same run id)
        while _name_taken(ray, _prefix(spec.run_id, self.incarnation), cfg.namespace):
            self.incarnation += 1
        self._prefix = _prefix(spec.run_id, self.incarnation)
        self.pg = placement_group([bundle_] * spec.n_agents, strategy=cfg.strategy.value, name=self._prefix)
        self._started_at = time.monotonic()
        token = ray.put(spec.token)  # by reference: see the module docstring
        remote = ray.remote(HostedAgent)
        for i in range(spec.n_agents):
            opts = self.actor_options(spec, i)
            opts["scheduling_strategy"] = PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i)
            actor = remote.options(**opts).remote(i, spec.log_level)
            self.actors.append(actor)
            self._where.append(actor.where.remote())
            self.runs.append(actor.run.remote(controller, spec.run_id, token))
        del token  # each pending run() holds the object until the agent has it
        self._log_thread = threading.Thread(target=self._copy_logs, args=(self._log_stop,), name="ray-agent-logs",
                                            daemon=True)
        self._log_thread.start()
        log.info("created %d agent actors (placement group %s, strategy %s, %s per agent)", spec.n_agents,
                 self._prefix, cfg.strategy.value, bundle_)

    def actor_options(self, spec: LaunchSpec, agent_id: int) -> dict[str, Any]:
        """The options of agent ``agent_id``'s actor (without its placement), all visible in Ray's state API."""
        cfg = self.cfg
        opts: dict[str, Any] = {
            "name": f"{_prefix(spec.run_id, max(self.incarnation, 0))}-agent-{agent_id}", "namespace": cfg.namespace,
            "num_cpus": cfg.cpus_per_agent, "num_gpus": cfg.gpus_per_agent,
            # run() holds one thread for the whole run; take_log() and where() need another
            "max_concurrency": 2, "max_restarts": 0, "max_task_retries": 0,
        }
        if cfg.memory_per_agent:
            opts["memory"] = cfg.memory_per_agent
        if cfg.resources_per_agent:
            opts["resources"] = {k: float(v) for k, v in cfg.resources_per_agent.items()}
        env = dict(cfg.runtime_env or {})
        env_vars = {**dict(env.get("env_vars") or {}), **spec.extra_env}
        if env_vars:
            env["env_vars"] = {k: str(v) for k, v in env_vars.items()}
        if env:
            opts["runtime_env"] = env
        return opts

    def controller_address(self, spec: LaunchSpec, ray: Any = None) -> str:
        """What the actors dial: launcher.controller_address, else the controller's listen address
        (with ``controller.host=0.0.0.0``, this machine's address as Ray knows it)."""
        if self.cfg.controller_address:
            return self.cfg.controller_address
        host, _, port = spec.controller_address.rpartition(":")
        if host.strip("[]") in ("0.0.0.0", "::", "") and ray is not None:
            return f"{ray.util.get_node_ip_address()}:{port}"
        return spec.controller_address

    def _check_private_cluster_fits(self, ray: Any, want: dict[str, float], n: int) -> None:
        """A private cluster gets no new nodes: what it cannot hold now never runs."""
        have = ray.cluster_resources()
        for res, amount in want.items():
            if have.get(res, 0.0) + 1e-9 < amount * n:
                key = {"CPU": "cpus_per_agent", "GPU": "gpus_per_agent", "memory": "memory_per_agent"}.get(
                    res, f"resources_per_agent.{res}")
                raise LauncherConfigError(
                    f"launcher.{key}={want[res]:g} for {n} agents needs {amount * n:g} {res} but the private Ray "
                    f"cluster has {have.get(res, 0.0):g}; accepted: what launcher.local provides (launcher.local."
                    f"{'num_gpus' if res == 'GPU' else 'resources' if key.startswith('resources') else 'num_cpus'}"
                    "), or launcher.address of a cluster that has it")

    def check(self) -> None:
        """Raise AgentFailure when an actor died, raised, returned early, or its bundle cannot be placed."""
        if self._stopping or not self.runs:
            return
        if self._failure is not None:
            f = self._failure
            raise AgentFailure(f.agent, f.reason, f.log_tail, lost=f.lost)
        try:
            self._check()
        except AgentFailure as failure:
            self._failure = failure
            raise

    def _check(self) -> None:
        ray = _ray()
        done, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=0, fetch_local=False)
        if done:
            i = min(self.runs.index(r) for r in done)
            # died, raised or returned mid-run: gone, as a subprocess that exited (recovery restarts it)
            raise AgentFailure(str(i), self._why_ended(ray, i), self.log_tail(i), lost=True)
        now = time.monotonic()
        if not self._placed and now - self._last_pg_check >= 1.0:
            self._last_pg_check = now
            self._check_placement(ray, now)

    def _check_placement(self, ray: Any, now: float) -> None:
        from ray.util import placement_group_table  # noqa: PLC0415

        table = placement_group_table(self.pg)
        if table.get("state") == "CREATED":
            self._placed = True
            self._check_reachable(ray, table)
            return
        waited = now - self._started_at
        if waited > self.cfg.startup_timeout_s:
            n = len(self.runs)
            raise AgentFailure(
                "all", f"the Ray placement group {self._prefix} ({n} bundles of {bundle(self.cfg)}, "
                       f"strategy {self.cfg.strategy.value}) is still {table.get('state', 'PENDING')} after {waited:.0f} s "
                       f"(launcher.startup_timeout_s); the cluster has {_resources(ray.available_resources())} free "
                       f"of {_resources(ray.cluster_resources())}")

    def _check_reachable(self, ray: Any, table: dict[str, Any]) -> None:
        """An agent on another node cannot dial a loopback address: say so now, not after its connect timeout."""
        if not is_loopback((split_address(self._dial) or ("",))[0]):
            return
        here = ray.get_runtime_context().get_node_id()
        for i, node in sorted(table.get("bundles_to_node_id", {}).items()):
            if node and node != here:
                raise AgentFailure(str(i), f"it was placed on {self._node(ray, node)}, from where it cannot reach the "
                                           f"controller at {self._dial}; run with controller.host=0.0.0.0 (and "
                                           "launcher.controller_address=HOST:PORT when Ray's address of this machine "
                                           "is not reachable from there)")

    def _why_ended(self, ray: Any, i: int) -> str:
        """Why agent ``i``'s run() is over: Ray's account of a dead actor, an exception, or the status it returned."""
        try:
            status = ray.get(self.runs[i], timeout=10)
        except ray.exceptions.RayActorError as e:
            return f"its Ray actor {self._who(ray, i, e)} died: {_ray_reason(e)}"
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if getattr(e, "cause", None) is not None else e
            return f"its Ray actor {self._who(ray, i)} raised {type(cause).__name__}: {first_line(cause)}"
        except ray.exceptions.RayError as e:
            return f"its Ray actor {self._who(ray, i)} failed: {first_line(e)}"
        return f"its agent in Ray actor {self._who(ray, i)} ended with status {status} before the run was over"

    def _who(self, ray: Any, i: int, error: BaseException | None = None) -> str:
        """``lockstep-RUN-agent-I (pid P on node IP, id ABCD1234)``, as far as Ray still knows."""
        parts = []
        pid = None
        try:
            pid = ray.get(self._where[i], timeout=0.5)["pid"]
        except Exception:  # noqa: BLE001 - the actor may have died before answering
            m = re.search(r"\bpid: (\d+)", getattr(error, "error_msg", "") or "")
            pid = int(m.group(1)) if m else None
        if pid is not None:
            parts.append(f"pid {pid}")
        try:
            from ray.util import placement_group_table  # noqa: PLC0415

            node = placement_group_table(self.pg).get("bundles_to_node_id", {}).get(i)
        except Exception:  # noqa: BLE001
            node = None
        if node:
            parts.append(f"on {self._node(ray, node)}")
        else:
            m = re.search(r"\bip: (\S+)", getattr(error, "error_msg", "") or "")
            if m:
                parts.append(f"on node {m.group(1)}")
        return f"{self._prefix}-agent-{i}" + (f" ({' '.join(parts)})" if parts else "")

    @staticmethod
    def _node(ray: Any, node_id: str) -> str:
        try:
            info = next((n for n in ray.nodes() if n.get("NodeID") == node_id), {})
        except Exception:  # noqa: BLE001
            info = {}
        ip = info.get("NodeManagerAddress")
        return f"node {ip}, id {node_id[:8]}" if ip else f"node {node_id[:8]}"

    def log_tail(self, agent_id: int, lines: int = 20) -> str:
        """The last log lines of agent ``agent_id`` (taken from its actor first, when it still answers)."""
        if not 0 <= agent_id < len(self.logs):
            return ""
        self._take_logs([agent_id], timeout_s=2.0)
        return log_tail(self.logs[agent_id], lines)

    def stop(self, restart: bool = False) -> None:
        """Let the agents finish, collect their last log lines, remove the actors, the placement group and a
        private cluster (not with ``restart``: the next actors use them). Idempotent."""
        self._stopping = True
        if self.conn is None:
            return
        try:
            if self.conn.connected or self.runs:
                self._stop_actors()
        finally:
            if not restart:
                self.conn.close()
                self.conn = None

    def _stop_actors(self) -> None:
        ray = _ray()
        if self.runs:
            ray.wait(self.runs, num_returns=len(self.runs), timeout=self.cfg.stop_grace_s, fetch_local=False)
        self._log_stop.set()
        if self._log_thread is not None:
            self._log_thread.join(self.cfg.log_poll_s + 10)
            self._log_thread = None
        self._take_logs(range(len(self.actors)), timeout_s=5.0)
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - removing the others goes on
                log.debug("killing an agent actor", exc_info=True)
        if self.pg is not None:
            from ray.util.placement_group import remove_placement_group  # noqa: PLC0415

            try:
                remove_placement_group(self.pg)
            except Exception:  # noqa: BLE001
                log.debug("removing the placement group", exc_info=True)
        self.actors, self.runs, self._where, self.pg = [], [], [], None

    # --- logs --------------------------------------------------------------------------------------
    def _copy_logs(self, stop: threading.Event) -> None:
        while not stop.wait(self.cfg.log_poll_s):
            try:
                self._take_logs(range(len(self.actors)), timeout_s=max(5.0, self.cfg.log_poll_s))
            except Exception:  # noqa: BLE001 - logs are a courtesy; failures are reported by check()
                log.debug("copying agent logs", exc_info=True)

    def _take_logs(self, agents: Any, timeout_s: float) -> None:
        """Append what each actor logged since the last take to its file in the run directory."""
        with self._log_guard:
            ray = _ray()
            want = [i for i in agents if i not in self._gone and i < len(self.actors)]
            if not want:
                return
            refs = {self.actors[i].take_log.remote(): i for i in want}
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s, fetch_local=True)
            for ref in ready:
                i = refs[ref]
                try:
                    lines = ray.get(ref)
                except ray.exceptions.RayError:
                    self._gone.add(i)
                    continue
                if lines:
                    with open(self.logs[i], "a") as f:
                        f.write("\n".join(lines) + "\n")


def _name(run_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", run_id).strip("-") or "run"


def _prefix(run_id: str, incarnation: int) -> str:
    """``lockstep-<run id>`` for a run's first set of actors, ``lockstep-<run id>-r<k>`` for the k-th after it."""
    return f"lockstep-{_name(run_id)}" + (f"-r{incarnation}" if incarnation else "")


def in_ray_task() -> bool:
    """Whether this process runs a Ray task or actor (a job of ``hydra/launcher=ray``), not a driver."""
    ray = _ray()
    try:
        return ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE
    except Exception:  # noqa: BLE001 - a Ray without these: not worth failing the job over
        return False


def _name_taken(ray: Any, prefix: str, namespace: str) -> bool:
    """Whether a placement group or an agent actor 0 of this name lives on the cluster (another run's)."""
    from ray.util import get_placement_group  # noqa: PLC0415

    try:
        get_placement_group(prefix)
        return True
    except ValueError:
        pass
    try:
        ray.get_actor(f"{prefix}-agent-0", namespace=namespace)
        return True
    except ValueError:
        return False


def _resources(res: Mapping[str, float]) -> str:
    keep = {k: v for k, v in res.items() if not k.startswith(("node:", "object_store_memory"))}
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(keep.items())) + "}"


def _ray_reason(e: BaseException) -> str:
    """Ray's account of a dead actor in a sentence or two: the exit type and detail, without its advice."""
    msg = getattr(e, "error_msg", None) or str(e)
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip() and not ln.startswith("\t")]
    if len(lines) > 1 and lines[0].startswith("The actor died unexpectedly before finishing"):
        lines = lines[1:]
    text = " ".join(lines)
    cut = text.find(" Some common causes")
    return (text[:cut] if cut > 0 else text).strip().rstrip(".") or type(e).__name__


# --- hydra/launcher=ray ----------------------------------------------------------------------------
def _sweep_callback_base() -> type:
    try:
        from hydra.experimental.callback import Callback  # noqa: PLC0415
    except ImportError:  # pragma: no cover - hydra-core is a dependency
        return object
    return Callback


class SweepCluster(_sweep_callback_base()):  # type: ignore[misc]
    """A Hydra callback (conf/config.yaml): the cluster of a ``hydra/launcher=ray`` sweep.

    Before the Ray launcher starts, this connects to the cluster named by ``hydra.launcher.ray.init.address``
    (or $RAY_ADDRESS) with only what a connection accepts, or — with neither — starts a private cluster on
    127.0.0.1 from the rest of ``hydra.launcher.ray.init`` (default: every CPU, a 200 MB object store, no
    dashboard) and stops it when the sweep ends. The launcher then finds Ray initialized and uses it.
    Any other launcher: nothing happens.
    """

    def __init__(self) -> None:
        self.conn: Connection | None = None

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        launcher = config.hydra.get("launcher") or {}
        if launcher.get("_target_") != HYDRA_RAY_LAUNCHER:
            return
        from omegaconf import OmegaConf  # noqa: PLC0415

        init = dict(OmegaConf.to_container(launcher.ray.init, resolve=True) or {})
        address = init.pop("address", None) or os.environ.get("RAY_ADDRESS") or None
        local = RayLocalClusterConfig(num_cpus=init.pop("num_cpus", None), num_gpus=init.pop("num_gpus", None),
                                      resources=init.pop("resources", None),
                                      object_store_memory=init.pop("object_store_memory",
                                                                   RayLocalClusterConfig.object_store_memory))
        if address is not None:
            init.pop("include_dashboard", None)
        log_to_driver = bool(init.pop("log_to_driver", True))
        try:
            self.conn = Connection(address, local, log_to_driver=log_to_driver, init_kwargs=init).open()
        except LauncherConfigError as e:
            print(f"lockstep: invalid configuration:\n  {e}", file=sys.stderr)
            sys.exit(2)

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

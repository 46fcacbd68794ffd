"""Nothing lost (DESIGN §11, docs/recovery.md): restarting lost agents, resuming a run whose controller died.

Both rest on one property the engine already has: a run is a deterministic function of its config and
seed (rerun identity, DESIGN §5). So a run that lost an agent, or its controller, is *replayed* from
virtual time 0 by fresh agents — the same plan, the same keyed draws, the same windows — and the rows it
already wrote are checked against the replay instead of being written again (``controller.outputs``);
from the first row past them it goes on as if nothing happened. Nothing but the run directory's
``config.yaml``, ``plan.json`` and CSVs is needed, so it works with every launcher and with direct
windows, and costs nothing while nothing fails. What it costs when something does — the wall time to
get back to where the run was — is measured in docs/benchmarks.md.

``recovery.jsonl`` in the run directory records each loss, restart, resume and catch-up, one JSON
object a line, appended.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from controller.config.schema import RecoveryAgents, RecoveryConfig
from controller.launchers.base import AgentFailure

__all__ = ["Recovery", "NotResumable", "resumable_run_id", "check_resumable", "resume_state", "load_run_config"]

log = logging.getLogger("lockstep.controller")

LOG_NAME = "recovery.jsonl"


class NotResumable(ValueError):
    """``lockstep resume RUN_DIR`` cannot resume that directory: one sentence, exit status 2."""


def resume_state(run_dir: Path) -> str:
    """``"unfinished"`` (resumable), ``"complete"``, or ``"empty"`` (no run was started there)."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file() or not (run_dir / "plan.json").is_file():
        return "empty"
    try:
        if json.loads((run_dir / "summary.json").read_text()).get("complete"):
            return "complete"
    except (OSError, ValueError):
        pass
    return "unfinished"


def load_run_config(run_dir: Path) -> Any:
    """The validated RunConfig of the run in ``run_dir``, from its ``config.yaml`` (the resolved config)."""
    import yaml
    from omegaconf import OmegaConf

    from controller.config import validate
    from controller.config.schema import GROUP_SCHEMAS

    path = Path(run_dir) / "config.yaml"
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise NotResumable(f"{path} cannot be read ({e})") from e
    if not isinstance(raw, dict):
        raise NotResumable(f"{path} does not hold a lockstep configuration")
    cfg = OmegaConf.create(raw)
    # group nodes are typed by the option Hydra composed; config.yaml keeps the launcher's name
    launchers = {cls.name: cls for cls in GROUP_SCHEMAS["launcher"].values()}
    node = raw.get("launcher")
    if isinstance(node, dict) and node.get("name") in launchers:
        cfg.launcher = OmegaConf.merge(OmegaConf.structured(launchers[node["name"]]), node)
    return validate(cfg)


def resumable_run_id(run_dir: Path) -> str:
    try:
        return str(json.loads((Path(run_dir) / "plan.json").read_text())["run_id"])
    except (OSError, ValueError, KeyError) as e:
        raise NotResumable(f"{Path(run_dir) / 'plan.json'} cannot be read ({e}); it is written when a run "
                           "starts, so this directory holds no run to resume") from e


def check_resumable(run_dir: Path, plan_json: str) -> None:
    """The plan rebuilt from ``config.yaml`` (``Plan.to_json``) must be the one the run started with: the same
    config.yaml and the same version of lockstep. The refusal names the plan's entries that differ."""
    on_disk = (Path(run_dir) / "plan.json").read_text()
    if on_disk.strip() == plan_json.strip():
        return
    try:
        diffs = plan_differences(json.loads(on_disk), json.loads(plan_json))
    except ValueError:  # not JSON: the file itself was damaged
        diffs = []
    shown = "; ".join(f"{path}: {was!r} in plan.json, {now!r} from config.yaml" for path, was, now in diffs[:3])
    more = f" and {len(diffs) - 3} more" if len(diffs) > 3 else ""
    where = f" ({shown}{more})" if diffs else ""
    raise NotResumable(f"{Path(run_dir) / 'plan.json'} differs from the plan its config.yaml gives{where}: "
                       "config.yaml was edited since the run started, or this is another version of lockstep; "
                       "resume it with the config.yaml and the version that started it")


def plan_differences(was: Any, now: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Where two plan.json documents differ, as (dotted path, value in ``was``, value in ``now``), leaves first
    found first (lists by index, mappings by sorted key)."""
    if isinstance(was, dict) and isinstance(now, dict):
        out: list[tuple[str, Any, Any]] = []
        for k in sorted(set(was) | set(now)):
            sub = f"{path}.{k}" if path else str(k)
            out += plan_differences(was.get(k), now.get(k), sub)
        return out
    if isinstance(was, list) and isinstance(now, list) and len(was) == len(now):
        out = []
        for i, (a, b) in enumerate(zip(was, now)):
            out += plan_differences(a, b, f"{path}[{i}]")
        return out
    return [] if was == now else [(path or "(the whole plan)", was, now)]


class Recovery:
    """Decides whether a lost agent is restarted, and records what recovery did."""

    def __init__(self, cfg: RecoveryConfig, launcher: Any, run_dir: Path):
        self.cfg, self.launcher, self.path = cfg, launcher, Path(run_dir) / LOG_NAME
        self.restarts = 0
        self.resumes = sum(1 for e in self._events() if e.get("event") == "resume")
        self.replay_wall_s = 0.0
        self._replay_from: float | None = None
        self.checkpoints = 0  # committed by this run (a resumed run counts on from its checkpoint's manifest)
        self.restored_from_window: int | None = None  # the checkpoint the last restart or resume started from

    def _events(self) -> list[dict[str, Any]]:
        try:
            return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError):
            return []

    def _record(self, **event: Any) -> None:
        event["wall_clock"] = time.time()
        with open(self.path, "a") as f:
            f.write(json.dumps(event, sort_keys=True) + "\n")

    def restartable(self, e: AgentFailure) -> bool:
        impl = getattr(self.launcher, "launcher", None)
        if self.cfg.agents != RecoveryAgents.restart:
            return False
        if not getattr(impl, "restartable", False):
            if e.lost and impl is not None:
                log.warning("recovery.agents=restart restarts the agents of launcher=local, kubernetes and ray only "
                            "(docs/recovery.md); this launcher's lost agent stops the run")
            return False
        if not e.lost:  # an error it reported may come from a peer that died: the launcher knows
            return self._peer_lost(getattr(impl, "loss_grace_s", 0.0))
        return True

    def _peer_lost(self, grace_s: float) -> bool:
        """Whether the launcher finds a lost agent within ``grace_s`` (a kubelet or Ray reports a death late)."""
        deadline, nap = time.monotonic() + grace_s, threading.Event()
        while True:
            try:
                self.launcher.check()
            except AgentFailure as dead:
                return dead.lost
            if time.monotonic() >= deadline:
                return False
            nap.wait(0.05)

    def restart(self, e: AgentFailure, out: Any) -> bool:
        """Whether to restart the agents after ``e`` (and, if so, record it)."""
        if not self.restartable(e):
            return False
        if self.restarts >= self.cfg.max_restarts:
            log.error("agent %s was lost (%s) and recovery.max_restarts=%d restarts are spent", e.agent, e.reason,
                      self.cfg.max_restarts)
            return False
        self.restarts += 1
        rows = out.metrics.rows + out.metrics.to_replay
        log.warning("agent %s was lost (%s); restarting every agent, which replay the run to the %d rows "
                    "already written (restart %d of at most %d, recovery.max_restarts)", e.agent, e.reason, rows,
                    self.restarts, self.cfg.max_restarts)
        self._record(event="restart", agent=e.agent, reason=e.reason, restart=self.restarts, rows_written=rows)
        self._finish_replay(None)
        self._replay_from = time.perf_counter()
        return True

    def resumed(self, out: Any, from_checkpoint: bool = False) -> None:
        self.resumes += 1
        rows = out.metrics.to_replay
        if from_checkpoint:
            log.warning("resuming the run from its latest checkpoint (%d rows of metrics.csv already written)",
                        rows)
        else:
            log.warning("resuming the run: replaying it to the %d rows of metrics.csv already written", rows)
        self._record(event="resume", rows_written=rows)
        self._replay_from = time.perf_counter()

    def checkpoint_committed(self, window: int, virtual_time_ns: int, took_s: float, nbytes: int,
                             waited_s: float = 0.0) -> None:
        self.checkpoints += 1
        log.info("checkpoint of window %d (virtual time %.6f s) committed: %.1f MB in %.2f wall s (the run "
                 "waited %.2f s)", window, virtual_time_ns / 1e9, nbytes / 1e6, took_s, waited_s)

    def restored(self, window: int, virtual_time_ns: int, out: Any) -> None:
        """The agents start from checkpoint ``window``: only the rows after it are replayed."""
        self.restored_from_window = window
        after = out.metrics.to_replay
        log.warning("restored from checkpoint %d (virtual time %.6f s): the %d rows before it are kept, the %d "
                    "written after it are replayed", window, virtual_time_ns / 1e9, out.metrics.rows, after)
        self._record(event="restored", window=window, virtual_time_ns=virtual_time_ns, rows_kept=out.metrics.rows,
                     rows_to_replay=after)
        if self._replay_from is None:
            self._replay_from = time.perf_counter()

    def unusable(self, reason: str) -> None:
        """The latest checkpoint cannot be used: the run replays from virtual time 0."""
        log.warning("the latest checkpoint cannot be used (%s); replaying the run from virtual time 0", reason)
        self._record(event="checkpoint_unusable", reason=reason)

    def progress(self, out: Any) -> None:
        """After each window: note when a replay has reproduced every row already written."""
        if self._replay_from is not None and not out.replaying:
            self._finish_replay(out.metrics.replayed)

    def _finish_replay(self, rows: int | None) -> None:
        if self._replay_from is None:
            return
        took = time.perf_counter() - self._replay_from
        self._replay_from = None
        self.replay_wall_s += took
        if rows is not None:
            log.warning("the replay caught up with the %d rows already written in %.1f wall s", rows, took)
            self._record(event="caught_up", rows=rows, replay_wall_s=took)

    def summary(self) -> dict[str, Any]:
        return {"agent_restarts": self.restarts, "resumes": self.resumes, "replay_wall_s": self.replay_wall_s,
                "checkpoints": self.checkpoints, "restored_from_window": self.restored_from_window}

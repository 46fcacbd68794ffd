"""Run one experiment: plan, start agents, drive windows, write the run directory."""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from agents.common import wire
from agents.core import AgentCore
from agents.sim.env import EvalRow, RowKey, Stats, UpdateRow
from agents.common.plan import Plan
from agents.sim.types import INFINITY, NS_PER_S
from controller import signals
from controller.clock import Window, run_windows
from controller.checkpoints import Checkpoint, Checkpointer, CheckpointStore, CheckpointUnusable
from controller.config import RunConfig, config_hash
from controller.launchers.base import AgentFailure
from controller.outputs import ReplayDiverged, RunDir, clear_earlier_run, write_json_atomic
from controller.plan import make_plan
from controller.recovery import Recovery, check_resumable, resumable_run_id
from protos.lockstep.v1 import agent_pb2 as pb

__all__ = ["execute", "RunResult", "InProcessAgent", "DATA_COLUMNS"]

DATA_COLUMNS = ("data_hits", "data_misses", "data_bytes", "data_wait_s")
"""metrics.csv's last columns with data.placement=end_devices: totals over every worker up to the row."""

log = logging.getLogger(__name__)


class InProcessAgent:
    """An AgentCore behind the AgentHandle interface (``launcher=inprocess``)."""

    def __init__(self, core: AgentCore):
        self.core = core

    def next_time(self) -> int:
        return self.core.next_time()

    def output_bound(self) -> int:
        return self.core.output_bound()

    def advance(self, window_end, inbound, stop_at, max_events):
        return self.core.advance(window_end, inbound, stop_at, max_events)

    def result_params(self):
        return self.core.result_params()

    def final_eval(self, t: int, iteration: int):
        return self.core.final_eval(t, iteration)

    def info(self) -> dict[str, Any]:
        return self.core.info()

    def close(self) -> None:
        self.core.close()

    def checkpoint(self, window: int) -> list:
        """This core between two windows, as the answer an agent process gives (controller/checkpoints.py)."""
        from agents.checkpoint import NotCheckpointable, snapshot
        from agents.mesh import pack_checkpoint

        try:
            # live: the controller writes it before this core runs again (controller.run: commit_checkpoint)
            return [("ok", window, 0, 1, pack_checkpoint(window, None, snapshot(self.core, live=True)))]
        except NotCheckpointable as e:
            return [("refused_permanent" if getattr(e, "permanent", False) else "refused", window, 0, 1, str(e))]

    def restore(self, blob: bytes, window: int) -> None:
        """Replace the core by the one checkpoint ``window`` saved in ``blob`` (CheckpointUnusable if it cannot)."""
        from agents.checkpoint import restore
        from agents.mesh import unpack_checkpoint

        old = self.core
        try:
            d = unpack_checkpoint(blob)
            if d["window"] != window:
                raise ValueError(f"it holds window {d['window']}")
            self.core = restore(old.plan, old.agent_id, d["core"], metrics=old.metrics,
                                data=old.training.data if old.training is not None else None)
        except Exception as e:  # noqa: BLE001 - one sentence; the run replays from virtual time 0
            raise CheckpointUnusable(f"agent {old.agent_id} could not restore checkpoint {window} "
                                     f"({type(e).__name__}: {e})") from e
        old.close()


@dataclass
class RunResult:
    summary: dict[str, Any]
    run_dir: Path
    params: torch.Tensor | None = None
    stats: Stats = field(default_factory=Stats)


def update_row(cells: list[str]) -> UpdateRow:
    """A metrics.csv row as the file holds it (strings; data columns after UpdateRow's are left out)."""
    return UpdateRow(int(cells[0]), float(cells[1]), cells[2], int(cells[3]), float(cells[4]), int(cells[5]),
                     int(cells[6]), int(cells[7]), float(cells[8]))


class _Collector:
    """Merges the rows agents report, in the global key order, and streams them to disk."""

    def __init__(self, out: RunDir, progress: Any, metrics: Any, observer: Any = None,
                 partial: Any = None, partial_every_s: float = 0.0, wall0: float | None = None):
        """``wall0``: the run's start (``time.perf_counter()``), for the live speed ratio."""
        self.out, self.progress, self.metrics, self.observer = out, progress, metrics, observer
        self.wall0 = time.perf_counter() if wall0 is None else wall0
        # partial(): the summary so far, rewritten every partial_every_s wall seconds (0: never)
        self.partial, self.partial_every_s = partial, partial_every_s
        self._partial_at = time.monotonic()
        self.updates: list[tuple] = []
        self.evals: list[tuple] = []
        self.stats = Stats()
        self.last_update: UpdateRow | None = None
        self.last_eval: EvalRow | None = None
        self.samples = 0
        self.n_updates = 0
        self.windows = 0
        self.barrier_s = 0.0
        self.max_time = 0
        self.stop_time: int | None = None
        self.done_before = 0  # every event before this virtual time is done (the last window's next start)
        # data.placement=end_devices: data.fetch rows, summed in key order into metrics.csv's last columns
        self.data_rows: list[tuple] | None = None
        self.data = {"data_hits": 0, "data_misses": 0, "data_bytes": 0, "data_wait_ns": 0}

    _STATE = ("updates", "evals", "stats", "last_update", "last_eval", "samples", "n_updates", "windows",
              "barrier_s", "max_time", "stop_time", "done_before", "data_rows", "data")

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the collector (rows not yet final, counters, the last rows)."""
        import copy

        return copy.deepcopy({k: getattr(self, k) for k in self._STATE})

    def restore(self, state: dict[str, Any]) -> None:
        for k in self._STATE:
            setattr(self, k, state[k])

    def on_window(self, w: Window) -> None:
        self.windows += w.count
        self.done_before = w.next_start
        self.barrier_s += w.barrier_wall_s
        for r in w.reached:
            self.updates.extend(r.updates)
            self.evals.extend(r.evals)
            self.stats.merge(r.stats)
            if self.observer is not None and r.events:
                self.observer.on_events(r.events)
            if self.data_rows is not None:
                self.data_rows.extend(e for e in r.events if e[1] == "data.fetch")
        self.stop_time = w.stop_time
        if self.metrics is not None:
            # the last report of direct windows starts at INFINITY: no agent has an event left. Direct windows
            # also run past the stop (an agent learns it from a peer's report): the clock stops there too, as
            # summary.json's virtual time does
            start = w.start if w.start < INFINITY else 0
            if w.stop_time is not None:
                start = min(start, w.stop_time)
            self.metrics.observe_window(start, w.barrier_wall_s, w.count)
            wall = time.perf_counter() - self.wall0
            if wall > 0:
                self.metrics.set_speed_ratio(self.metrics.virtual_time_ns / NS_PER_S / wall)
        if self.observer is not None:  # the state log and the trace go to disk before the rows they belong to,
            self.observer.flush(w.next_start)  # so a SIGKILL between the two never leaves rows without them
        self.flush(w.next_start)
        if self.partial is not None and self.partial_every_s > 0:
            now = time.monotonic()
            if now - self._partial_at >= self.partial_every_s:
                self._partial_at = now
                self.partial()

    def flush(self, before: int | None) -> None:
        """Write rows whose time is final (< ``before``; None = all), never past the stop time."""
        for buf, write in ((self.updates, self._write_updates), (self.evals, self._write_evals)):
            if not buf:
                continue
            buf.sort(key=lambda kr: kr[0])
            cut = len(buf) if before is None else next((i for i, (key, _) in enumerate(buf) if key.time >= before),
                                                       len(buf))
            ready = [(key, row) for key, row in buf[:cut] if self.stop_time is None or key.time <= self.stop_time]
            del buf[:cut]
            if ready and self.data_rows is not None and buf is self.updates:
                ready = [(key, (*row, *self._data_until(tuple(key)))) for key, row in ready]
            if ready:
                write([row for _, row in ready])
        if self.data_rows is not None:
            self._data_until((before, -1, -1) if before is not None else None)

    def _data_until(self, key: tuple | None) -> tuple:
        """Fold the data.fetch rows up to ``key`` (all, for None) into the totals; the totals as columns."""
        rows = self.data_rows
        rows.sort(key=lambda e: tuple(e[0]))
        n = 0
        for k, _, _, f in rows:
            if key is not None and tuple(k) > key or (self.stop_time is not None and k[0] > self.stop_time):
                break
            n += 1
            self.data["data_hits"] += f["hits"]
            self.data["data_misses"] += f["misses"]
            self.data["data_bytes"] += f["bytes"]
            self.data["data_wait_ns"] += f["wait_ns"]
            if self.metrics is not None:
                self.metrics.add_data(f["hits"], f["misses"], f["bytes"], f["wait_ns"] / NS_PER_S)
        del rows[:n]
        d = self.data
        return d["data_hits"], d["data_misses"], d["data_bytes"], d["data_wait_ns"] / NS_PER_S

    def _write_updates(self, rows: list[UpdateRow]) -> None:
        new = self.out.write_updates(rows)  # a replay (docs/recovery.md) reproduces rows already written
        rows = [UpdateRow(*r[:len(UpdateRow._fields)]) for r in rows]
        for i, r in enumerate(rows):
            self.n_updates += 1
            self.samples += r.samples
            self.max_time = max(self.max_time, r.virtual_time_ns)
            if self.metrics is not None and i >= len(rows) - new:
                self.metrics.record_update(r.virtual_time_ns, r.loss, r.staleness, r.vworker)
        last = self.last_update = rows[-1]
        if self.progress is not None and new:
            self.progress.update(new)
            self.progress.set_postfix_str(f"virtual {last.virtual_time_s:.3f}s loss {last.loss:.4f}", refresh=False)

    def count_unreplayed(self) -> int:
        """A run stopped before its replay (docs/recovery.md) caught up: the rows on disk beyond the replay stay
        there, so the summary counts them too, as the run that wrote them did. Returns the last one's time."""
        end = 0
        for cells in self.out.metrics.unreplayed():
            r = update_row(cells)
            self.n_updates += 1
            self.samples += r.samples
            end = max(end, r.virtual_time_ns)
            self.last_update = r
        for cells in self.out.evals.unreplayed():
            e = EvalRow(int(cells[0]), float(cells[1]), cells[2], int(cells[3]), float(cells[4]), float(cells[5]),
                        float(cells[6]))
            end = max(end, e.virtual_time_ns)
            self.last_eval = e
        self.max_time = max(self.max_time, end)
        return end

    def _write_evals(self, rows: list[EvalRow]) -> None:
        self.out.write_evals(rows)
        self.last_eval = rows[-1]
        if self.metrics is not None:
            self.metrics.set_accuracy(self.last_eval.test_accuracy)


def _windows_label(plan: Plan, rc: RunConfig, launcher: Any) -> str:
    """Who carries the windows: ``direct`` (the agents), ``hub`` (the controller) or ``inprocess``."""
    if launcher is None:
        return "inprocess"
    return "direct" if plan.n_agents > 1 and rc.controller.windows.value == "direct" else "hub"


def _holds_refs(pending: list[list[Any]]) -> bool:
    """Whether an event routed by the controller carries a tensor on a direct stream (agents/direct.py)."""
    import io
    import pickle

    class Found(Exception):
        pass

    class Finder(pickle.Pickler):
        def persistent_id(self, obj: Any) -> None:
            if isinstance(obj, wire.BlobRef):
                raise Found
            return None

    if not any(pending):
        return False
    try:
        Finder(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(pending)
    except Found:
        return True
    return False


def latest_checkpoint(store: CheckpointStore, recovery: Recovery) -> Checkpoint | None:
    """The latest committed checkpoint, or None (there is none, or it is unusable: one warning)."""
    try:
        return store.latest()
    except CheckpointUnusable as e:
        recovery.unusable(str(e))
        return None


RESTORE_IN_FLIGHT = 4  # pieces of one agent's checkpoint sent and not yet answered, at most


def restore_agents(handles: list[Any], ck: Checkpoint) -> None:
    """Send each agent its checkpoint (call ``restore``, in pieces below the message limit) and wait until
    every one has restored its core; CheckpointUnusable when one could not.

    The pieces are read from the files as they go, at most ``RESTORE_IN_FLIGHT`` of an agent's unanswered at a
    time (an agent answers each piece as it takes it), so the controller holds a few pieces, not the agents'
    checkpoints: two agents of 10 000 vworkers restore GBs each. The agents' pieces go out in turn, one of each
    agent's, so that the agents take theirs and restore their cores side by side: taking a piece costs an agent
    more than sending it costs the controller (docs/benchmarks.md, "Restoring the agents side by side")."""
    from agents.mesh import piece_bytes

    streams = []
    for h in handles:
        if isinstance(h, InProcessAgent):
            h.restore(ck.agent_blob(h.core.agent_id), ck.window)
            continue
        step = piece_bytes(h.session.writer)
        streams.append(_RestoreStream(h, ck.agent_parts(h.agent_id, step), ck.agent_pieces(h.agent_id, step)))
    live = streams
    while live:
        live = [s for s in live if s.send_next()]
    errors = [e for e in (s.finish(ck.window) for s in streams) if e]
    if errors:
        raise CheckpointUnusable(f"the agents could not restore checkpoint {ck.window} ({'; '.join(errors)})")


class _RestoreStream:
    """One agent's checkpoint going out a piece at a time (:func:`restore_agents`)."""

    def __init__(self, h: Any, parts: int, pieces: Any):
        self.h, self.parts, self.pieces = h, parts, enumerate(pieces)
        self.ids: deque = deque()  # calls sent and not yet answered
        self.value: Any = None  # the answer to the last piece

    def send_next(self) -> bool:
        """Send the next piece (once fewer than ``RESTORE_IN_FLIGHT`` are unanswered); False when all went."""
        nxt = next(self.pieces, None)
        if nxt is None:
            return False
        i, piece = nxt
        h = self.h
        if len(self.ids) >= RESTORE_IN_FLIGHT:
            self.value = _restore_answer(h, self.ids.popleft())
        h._calls += 1
        f = pb.ControllerFrame()
        f.call.id, f.call.method = h._calls, "restore"
        wire.encode_value((i, self.parts), f.call.args)
        h.session.send_serialized(wire.append_bytes(f, ("call", "args"), piece))  # the piece copied once
        self.ids.append(h._calls)
        return True

    def finish(self, window: int) -> str | None:
        """Wait for the agent's last answers; why it could not restore checkpoint ``window``, or None."""
        while self.ids:
            self.value = _restore_answer(self.h, self.ids.popleft())
        value = self.value
        if isinstance(value, tuple) and len(value) == 2 and value[0] == "ok" and value[1] == window:
            return None
        return f"agent {self.h.agent_id}: {value[1] if isinstance(value, tuple) and len(value) == 2 else value}"


def _restore_answer(h: Any, call_id: int) -> Any:
    """Agent ``h``'s answer to its call ``restore`` ``call_id`` (None for a piece before the last)."""
    msg, blobs = h._receive("reply to restore")
    if msg.WhichOneof("body") != "reply" or msg.reply.id != call_id:
        raise h.fail(f"protocol error: expected the reply to restore, got {msg.WhichOneof('body')}")
    return wire.decode_value(msg.reply.value, blobs)


def build_inprocess(plan: Plan, observer: Any = None) -> list[InProcessAgent]:
    """One AgentCore per agent in this process, sharing the loaded data set."""
    data = None
    handles = []
    for a in range(plan.n_agents):
        core = AgentCore(plan, a, data=data, metrics=None if observer is None else observer.agent_metrics(a))
        if core.training is not None:
            data = core.training.data
        handles.append(InProcessAgent(core))
    return handles


def execute(rc: RunConfig, run_dir: Path, *, handles: list | None = None, metrics: Any = None,
            progress: Any = None, launcher: Any = None, observer: Any = None, resume: bool = False) -> RunResult:
    """Run the experiment described by ``rc`` and write its outputs into ``run_dir``.

    ``observer`` (a controller.observe.Observer) adds metrics endpoints, trace.json and the state log.
    ``resume``: ``run_dir`` holds the outputs of this run cut short (its controller died): replay the run
    and append to them (docs/recovery.md).
    """
    wall0 = time.perf_counter()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        gone = clear_earlier_run(run_dir)
        if gone:
            log.info("an earlier run's outputs in %s were removed: %s", run_dir, ", ".join(gone))
    plan = make_plan(rc, run_id=resumable_run_id(run_dir) if resume else None)
    model_bytes = plan_model_bytes(plan, None)
    plan.limits = plan_limits(plan, rc, model_bytes)  # what a peer may make a process hold (docs/security.md)
    if observer is not None:
        observer.configure(plan)
    plan_json = plan.to_json()  # once: 0.5 s at 100 000 vworkers
    if resume:  # before anything is written or served: a refused resume leaves the run directory as it was
        check_resumable(run_dir, plan_json)
    if observer is not None:
        observer.prepare(plan)
        metrics = observer.metrics if metrics is None else metrics
    if not resume:
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(rc.raw)))
        (run_dir / "plan.json").write_text(plan_json)
    if metrics is not None:
        metrics.set_run_info(run_id=plan.run_id, config_hash=config_hash(rc.raw), strategy=rc.strategy_name,
                             workers=rc.workers, agents=rc.agents, launcher=rc.launcher.name,
                             windows=_windows_label(plan, rc, launcher))

    def start_agents() -> list:
        if launcher is None:
            return build_inprocess(plan, observer)
        started = launcher.start_agents(plan, run_dir, plan_json=served_json)
        for h in started:  # remote agents serving their own /metrics (docs/observability.md)
            if observer is not None and getattr(h, "metrics_address", ""):
                observer.add_agent_endpoint(h.agent_id, h.metrics_address)
        return started

    remote_data = rc.data.placement == "end_devices"
    out = RunDir(run_dir, DATA_COLUMNS if remote_data else (), resume=resume)
    recovery = Recovery(rc.recovery, launcher, run_dir)
    # the agents carry the windows between themselves (docs/distributed.md), else the controller's own loop does
    direct = plan.n_agents > 1 and launcher is not None and rc.controller.windows.value == "direct"
    # coordinated checkpoints (docs/recovery.md)
    store = CheckpointStore(run_dir, plan_json)
    # what the controller's server hands each agent (the same text again would be 0.5 s at 100 000 vworkers);
    # 17 MB there, which the server holds for the run anyway; an in-process run drops it
    served_json = plan_json if launcher is not None else None
    del plan_json
    if not resume:
        store.clear()  # a new run in this directory: an earlier run's checkpoints are not its own
    restore_from = latest_checkpoint(store, recovery) if resume else None
    if resume:
        recovery.resumed(out, from_checkpoint=restore_from is not None)
        if progress is not None:
            progress.update(out.metrics.to_replay)
        if metrics is not None:  # the rows on disk count once, as for the controller that wrote them: a replay
            for r in map(update_row, out.metrics.unreplayed()):  # counts only rows it adds (docs/recovery.md)
                metrics.record_update(r.virtual_time_ns, r.loss, r.staleness, r.vworker)
    resumed_windows = resume and metrics is not None  # the windows before a checkpoint, counted at its restore

    def collector() -> _Collector:
        c = _Collector(out, progress, metrics, observer, partial=partial, partial_every_s=rc.outputs.summary_every_s,
                       wall0=wall0)
        if remote_data:
            c.data_rows = []
        return c

    def partial() -> None:
        """summary.json so far ("complete": false): what a run that dies or is still going has reached."""
        wall = time.perf_counter() - wall0
        vt_s = col.max_time / NS_PER_S
        write_json_atomic(run_dir / "summary.json", {
            "complete": False, "run_id": plan.run_id, "strategy": rc.strategy_name, "workers": rc.workers,
            "agents": rc.agents, "seed": rc.seed, "config_hash": config_hash(rc.raw),
            "virtual_time_ns": col.max_time, "virtual_time_s": vt_s, "updates": col.n_updates,
            "samples": col.samples, "throughput_samples_per_s": col.samples / vt_s if vt_s > 0 else 0.0,
            "final_loss": col.last_update[4] if col.last_update else None,
            "test_accuracy": col.last_eval[5] if col.last_eval else None,
            "test_loss": col.last_eval[4] if col.last_eval else None,
            "wall_time_s": wall, "speed_ratio": vt_s / wall if wall > 0 else 0.0, "windows": col.windows,
            "recovery": recovery.summary()})
    col = collector()
    # a stop request (SIGINT, SIGTERM) is seen between windows and while waiting for agents
    should_abort = getattr(launcher, "check", None) or signals.check
    stop: int | None = None
    stopped: signals.Stopped | None = None
    finished = False
    params, info = None, {"profile_misses": 0, "profile_fallbacks": 0, "reproducible": True}
    handles = list(handles or [])

    def on_window(w: Window) -> None:
        col.on_window(w)
        recovery.progress(out)

    start_view: dict[str, Any] | None = None  # the window loop's view at the checkpoint the agents restored
    checkpointer: Checkpointer | None = None  # drive()'s, told how long each commit took to write

    def commit_checkpoint(window: int, blobs: dict[int, Any], view: dict[str, Any]) -> None:
        """Every agent's checkpoint of ``window`` is in, and the collector holds the rows before it: its state
        is taken now, the files are written on a thread (controller/checkpoints.py)."""
        if "frontier" in view:  # direct windows
            vt = min(view["frontier"])
        else:  # the controller's loop
            vt = min([*view["next_t"], *(ev.time for p in view["pending"] for ev in p)])
        state = {"collector": col.state(), "outputs": out.position(), "windows": view, "direct": direct,
                 "observer": observer.checkpoint_state() if observer is not None else None}
        nbytes = sum(len(b) for b in blobs.values())

        def done(d: Path | None, took_s: float, waited_s: float) -> None:
            if d is not None:
                recovery.checkpoint_committed(window, vt, took_s, nbytes, waited_s)
                if checkpointer is not None:
                    checkpointer.written(took_s)

        summary = {"outputs": out.position(), "updates": col.n_updates, "checkpoints_taken": recovery.checkpoints + 1}
        if any(getattr(b, "live", False) for b in blobs.values()):  # views of in-process cores: written now
            store.commit_now(window, vt, blobs, state, summary, done)
        else:
            store.commit_async(window, vt, blobs, state, summary, done)

    def hub_checkpoints(ck: Checkpointer) -> Any:
        """Checkpoints of the controller's own window loop: between two windows, every agent is idle."""
        def between(view: Any) -> None:
            if ck.due(col.windows, exact=True) is None:
                return
            k, state = col.windows, view()
            if launcher is not None and _holds_refs(state["pending"]):
                return  # a tensor on a direct stream between agents: not in any checkpoint; try again later
            ck.asked(k, {a: a for a in range(len(handles))})
            for h in handles:  # agent processes save at once
                if hasattr(h, "begin_checkpoint"):
                    h.begin_checkpoint(k)
            for a, h in enumerate(handles):
                for value in (h.end_checkpoint() if hasattr(h, "begin_checkpoint") else h.checkpoint(k)):
                    try:
                        ck.answer(a, value)
                    except ValueError as e:
                        raise AgentFailure(str(a), f"sent a malformed answer to checkpoint: {e}") from e
            ck.finish(state)
        return between

    def restore(ck: Checkpoint) -> bool:
        """Start the current agents from checkpoint ``ck``, the outputs from where it was taken; False (after
        one warning) when that fails: the caller replays from virtual time 0."""
        nonlocal col, start_view, resumed_windows
        try:  # the outputs first: they are local, and a run directory that does not fit is found before the agents
            if ck.controller["direct"] != direct:
                raise CheckpointUnusable("it was taken with other windows (controller.windows, agents)")
            out.rewind(ck.controller["outputs"])
            if observer is not None:
                observer.restore_outputs(ck.controller["observer"])
            restore_agents(handles, ck)
        except (CheckpointUnusable, ReplayDiverged, ValueError, KeyError, TypeError, OSError) as e:
            recovery.unusable(str(e))
            return False
        col = collector()
        col.restore(ck.controller["collector"])
        if resumed_windows:  # the first restore of a resume: this process never ran the windows before it
            metrics.add_windows(col.windows)
            resumed_windows = False
        start_view = ck.controller["windows"]
        recovery.checkpoints = max(recovery.checkpoints, int(ck.manifest.get("checkpoints_taken", 0)))
        recovery.restored(ck.window, ck.virtual_time_ns, out)
        return True

    def from_zero() -> None:
        """Fresh agents replay the run from virtual time 0 (docs/recovery.md)."""
        nonlocal col, start_view, resumed_windows
        resumed_windows = False  # this process runs (and counts) every window from here
        out.rewind()
        if observer is not None:
            observer.rewind()
        col = collector()
        start_view = None

    def drive() -> tuple[Any, int, Any, dict[str, Any]]:
        """The windows, then the final calls (parameters, final evaluation, info) of the current agents."""
        nonlocal stop, finished, checkpointer
        every = rc.recovery.checkpoint_every_s
        before = checkpointer  # the one of the agents before a restart: a strategy that cannot be saved
        ck = checkpointer = Checkpointer(every, commit_checkpoint, lambda: store.busy,
                                         stage=store.stage) if every > 0 else None
        if ck is not None and before is not None and before.gave_up is not None:
            ck.give_up(before.gave_up, said=True)  # still cannot: not asked again, not said again
        if direct:
            from controller.mesh import run_direct  # the agents carry the windows (docs/distributed.md)

            t_loop = time.perf_counter()
            stop, n_windows = run_direct(handles, on_window, should_abort=should_abort, checkpoints=ck,
                                         start=start_view)
            col.barrier_s = time.perf_counter() - t_loop
        else:
            stop = run_windows(handles, plan.placement, plan.lookahead(), on_window, should_abort=should_abort,
                               between=hub_checkpoints(ck) if ck is not None else None, start=start_view)
        finished = True
        col.stop_time = stop
        col.flush(None)
        # agents report stop.virtual_time as their stop time from the start, so stop is None only when
        # the run ran out of events
        end_ns = stop if stop is not None else col.max_time
        params, info = None, {"profile_misses": 0, "profile_fallbacks": 0, "reproducible": True}
        for h in handles:
            p = h.result_params()
            if p is not None:
                params = p
                # the observer's last look: evaluate the final model if no eval row has it yet
                last_it = col.last_update.iteration if col.last_update else 0
                if col.last_eval is None or col.last_eval.iteration != last_it:
                    row = h.final_eval(end_ns, last_it)
                    if row is not None:
                        col.evals.append((RowKey(end_ns, 1 << 62, 0), EvalRow(*row)))
                        col.stop_time = None
                        col.flush(None)
            i = h.info()
            info["profile_misses"] += i.get("profile_misses", 0)
            info["profile_fallbacks"] += i.get("profile_fallbacks", 0)
            info["reproducible"] = info["reproducible"] and i.get("reproducible", True)
            if i.get("device"):
                info.setdefault("devices", set()).add(i["device"])
            info.setdefault("executors", []).append(i.get("executor"))
            info.setdefault("memory", []).append(i.get("memory") or {})
            info.setdefault("parked", []).append(i.get("parked") or {})
            info.setdefault("last_event_ns", []).append(i.get("last_event_ns"))
            info.setdefault("cpu_s", []).append(i.get("cpu_s", 0.0))
            info.setdefault("window_cpu_s", []).append(i.get("window_cpu_s"))
            if observer is not None and getattr(h, "metrics_address", ""):
                observer.add_agent_exposition(h.agent_id, h.metrics_text())
        return stop, end_ns, params, info

    completed = False  # the windows and the final calls ran to the end (not stopped, not failed)
    try:
        while True:
            # a lost agent: every agent starts again from the latest checkpoint, or from virtual time 0,
            # and replays to where the run was. The start is inside the loop: an agent lost while the agents
            # start (the first time or after a restart) is restarted the same way
            try:
                if not handles:
                    handles = start_agents()
                    if observer is not None:
                        observer.running()
                if restore_from is not None and not restore(restore_from):
                    if launcher is not None:
                        launcher.close(abort="the checkpoint could not be restored; the run restarts its agents",
                                       restart=True)
                    else:
                        for h in handles:
                            h.close()
                    from_zero()
                    handles = []
                    handles = start_agents()
                restore_from = None
                stop, end_ns, params, info = drive()
                completed = True
                break
            except AgentFailure as e:
                if not recovery.restart(e, out):
                    raise
                launcher.close(abort=f"agent {e.agent} was lost; the run restarts its agents", restart=True)
                restore_from = latest_checkpoint(store, recovery)
                if restore_from is None:
                    from_zero()
                handles = []  # the loop starts them again (if that fails, nothing is left to close)
    except signals.Stopped as e:
        # graceful: Shutdown(abort) to every agent, then the outputs up to the last complete window
        stopped = e
        if observer is not None:
            observer.stopping()
        if hasattr(launcher, "close"):
            launcher.close(abort=f"the controller was stopped by {e.name}")
        params = None
        if finished:  # stopped during the final calls: the run itself was complete
            end_ns = stop if stop is not None else col.max_time
        else:  # rows before the next window's start are final; the rest is dropped
            end_ns = col.done_before if col.done_before < INFINITY else col.max_time
            stop = end_ns - 1 if end_ns else None
            col.stop_time = stop
            if out.replaying:  # stopped before the replay caught up: the files keep the rows beyond it
                end_ns = max(end_ns, col.count_unreplayed())
    except BaseException as e:
        try:  # what the run reached, for a run that failed (metrics.csv has every row)
            partial()
        except Exception:  # noqa: BLE001 - the original error is the one to report
            log.warning("could not write the partial summary.json", exc_info=True)
        if hasattr(launcher, "close"):  # stop remote agents at once, telling them why
            launcher.close(abort=f"{type(e).__name__}: {e}")
        raise
    finally:
        out.close()
        if observer is not None:
            # a run that did not complete keeps what its checkpoints count on for lockstep resume
            observer.close_outputs(stop, complete=completed or not store.committed())

        def close_agents() -> None:
            for h in handles:
                h.close()
            if hasattr(launcher, "close"):
                launcher.close()
        # a lingering observer keeps remote agents serving their final /metrics; it stops them after
        if stopped is not None or not (launcher is not None and observer is not None
                                       and observer.hold(close_agents)):
            close_agents()
    if params is not None:
        torch.save(params, run_dir / "params.pt")
    wall = time.perf_counter() - wall0
    vt_s = end_ns / NS_PER_S
    training = next((h.core.training for h in handles if getattr(h, "core", None) is not None
                     and h.core.training is not None), None)
    summary = {
        "complete": stopped is None,  # a stopped run (SIGTERM) finalised its outputs but did not finish
        "run_id": plan.run_id,
        "strategy": rc.strategy_name,
        "workers": rc.workers,
        "agents": rc.agents,
        "seed": rc.seed,
        "config_hash": config_hash(rc.raw),
        "virtual_time_ns": end_ns,
        "virtual_time_s": vt_s,
        "updates": col.n_updates,
        "samples": col.samples,
        "throughput_samples_per_s": col.samples / vt_s if vt_s > 0 else 0.0,
        "final_loss": col.last_update.loss if col.last_update else None,
        "test_accuracy": col.last_eval.test_accuracy if col.last_eval else None,
        "test_loss": col.last_eval.test_loss if col.last_eval else None,
        "wall_time_s": wall,
        "speed_ratio": vt_s / wall if wall > 0 else 0.0,
        "model_bytes": training.model_bytes if training is not None else model_bytes,
        "reproducible": info["reproducible"],
        "profile_misses": info["profile_misses"],
        "compute_profile": plan.compute.profile_name or None,
        "profile_fallbacks": info["profile_fallbacks"],
        # the same virtual times on any host: no duration came from this host's clock
        "portable": info["reproducible"] and (plan.compute.model != "profiled" or (
            bool(plan.compute.profile_name) and info["profile_fallbacks"] == 0)),
        "device": ",".join(sorted(info.get("devices", ()))) or None,
        "stopped_by": ("signal" if stopped is not None else "no_more_events" if stop is None else
                       "virtual_time" if stop == plan.stop_virtual_time_ns else "updates"),
        "windows": col.windows,
        "events": col.stats.events,
        "messages_local": col.stats.messages_local,
        "messages_remote": col.stats.messages_remote,
        "bytes_local": col.stats.bytes_local,
        "bytes_remote": col.stats.bytes_remote,
        "wall_compute_s": col.stats.compute_wall_s,
        "compute_virtual_s": {k: v / NS_PER_S for k, v in col.stats.compute_virtual_ns.items()},
        "wall_barrier_s": col.barrier_s,
        "compute_batch": compute_batch_summary(rc.compute, info.get("executors", []), info["reproducible"]),
        "peak_memory": memory_summary(info.get("memory", [])),
        "wall_cpu_s": cpu_summary(info.get("cpu_s", []), info.get("window_cpu_s")),
        "recovery": recovery.summary(),
    }
    if stopped is not None:
        summary["signal"] = stopped.name
    if summary["stopped_by"] == "no_more_events":
        parked = parked_summary(info.get("parked", []))
        if parked["vworkers"]:
            summary["parked"] = parked
            last = info.get("last_event_ns") or [None]
            if all(isinstance(t, int) for t in last):  # every agent said when it ran its last event
                summary["last_event_ns"] = max(last)
            log.warning(stall_sentence(rc, summary))
    if remote_data:  # sim4DistrDL's data on the network: what the caches saved, what the wait cost
        summary.update({"data_cache_hits": col.data["data_hits"], "data_cache_misses": col.data["data_misses"],
                        "data_bytes_moved": col.data["data_bytes"], "data_wait_s": col.data["data_wait_ns"] / NS_PER_S,
                        "data_cache": rc.data.cache, "data_cache_size": rc.data.cache_size})
    if rc.predict:  # the throughput-prediction paper's models beside the emulated figures (controller.predict)
        from controller.predict import summary_entry

        summary["predictions"] = summary_entry(rc, summary)
    if metrics is not None:
        metrics.set_speed_ratio(summary["speed_ratio"])
    write_json_atomic(run_dir / "summary.json", summary)
    if stopped is not None:
        raise stopped
    store.clear()  # recovery data, not an output: a complete run needs none
    return RunResult(summary, run_dir, params, col.stats)


def compute_batch_summary(compute: Any, executors: list[dict | None], reproducible: bool) -> dict[str, Any]:
    """How compute calls ran (DESIGN §4.2): the mode, tasks and batches summed over agents, the
    ``auto`` probe's figures and choices of each agent, whether floats equal eager execution, and whether
    the outputs would be the same with any agents and placement (never where the run is not reproducible:
    ``compute=measured`` times each call on the wall clock)."""
    mode = compute.batch
    ran = [e for e in executors if e]
    out: dict[str, Any] = {"mode": mode, "overlap": any(e["overlap"] for e in ran), "deferred": bool(ran)}
    if ran:
        for k in ("tasks", "batches", "vmap_batches", "vmap_tasks"):
            out[k] = sum(e[k] for e in ran)
        out["largest_batch"] = max(e["largest_batch"] for e in ran)
        out["overlap_wait_s"] = sum(e["wait_s"] for e in ran)
        out["mean_batch"] = out["tasks"] / out["batches"] if out["batches"] else 0.0
        if mode == "auto":
            out["probes"] = [e["probes"] for e in ran]
            out["switched_to_loop"] = [e.get("switched_to_loop", []) for e in ran]
    # vmap sums in another order than one call at a time: the last bits of the floats differ
    out["eager_identical"] = not any(e["vmap_tasks"] for e in ran)
    # the same outputs with any agents and placement: off and loop always; vmap where every agent found the
    # rule's rows independent of the rest of their batch; auto never (its choice follows the batch sizes)
    out["placement_independent"] = reproducible and (mode in ("off", "loop") or (
        mode == "vmap" and all(e.get("rows_independent") is not False for e in ran)))
    return out


def memory_summary(per_process: list[dict[str, int]]) -> dict[str, Any]:
    """Peak resident memory of the controller process and of each agent (in-process: the same process)."""
    from agents.core import peak_memory

    agents = [m.get("peak_rss_bytes", 0) for m in per_process]
    out: dict[str, Any] = {"controller_rss_bytes": peak_memory()["peak_rss_bytes"], "agents_rss_bytes": agents,
                           "agents_compact": [bool(m.get("compact")) for m in per_process]}  # memory=
    gpu = [m["gpu_peak_allocated_bytes"] for m in per_process if "gpu_peak_allocated_bytes" in m]
    if gpu:
        out["gpu_peak_allocated_bytes"] = gpu
    out["max_rss_bytes"] = max([out["controller_rss_bytes"], *agents])
    return out


def parked_summary(per_agent: list[dict[str, Any]]) -> dict[str, Any]:
    """The vworkers still parked (in ``recv`` or ``wait``) when no event was left: how many, and the first
    few by vworker id with what each waits for — the same whatever the placement."""
    from agents.core import PARKED_SHOWN

    first = sorted((tuple(p) for a in per_agent for p in a.get("first", ())), key=lambda p: p[0])
    return {"vworkers": sum(a.get("count", 0) for a in per_agent), "first": [p[1] for p in first[:PARKED_SHOWN]]}


def stall_sentence(rc: RunConfig, summary: dict[str, Any]) -> str:
    """One sentence for a run that ran out of events with vworkers still waiting (a strategy that deadlocked,
    or messages lost for good): where it ended, what it had been asked for, who waits for what.

    Where it ended is the virtual time of the last event the agents ran (``last_event_ns``), to the
    nanosecond; where the agents did not report it, the time of the run's last row (``virtual_time_s``),
    as before: that can be much earlier (a PS that received some gradients of the next round and waits)."""
    t = summary.get("last_event_ns")
    when = f"{t // NS_PER_S}.{t % NS_PER_S:09d}" if t is not None else f"{summary['virtual_time_s']:.6f}"
    asked = [f"stop.updates={rc.stop_updates}"] if rc.stop_updates is not None else []
    if rc.stop_virtual_time_ns is not None:
        asked.append(f"stop.virtual_time={rc.stop_virtual_time_ns / NS_PER_S:g}s")
    p, n = summary["parked"], summary["updates"]
    more = p["vworkers"] - len(p["first"])
    return (f"the run ran out of events at virtual time {when} s after {n} "
            f"update{'' if n == 1 else 's'}{', before ' + ' or '.join(asked) if asked else ''}: {p['vworkers']} "
            f"vworker{'' if p['vworkers'] == 1 else 's'} wait for what nothing will send — {', '.join(p['first'])}"
            f"{f' and {more} more' if more > 0 else ''} (summary.json: parked; a message never sent, or lost "
            f"for good).")


def cpu_summary(agents_cpu_s: list[float], window_cpu_s: list[float | None] | None = None) -> dict[str, Any]:
    """CPU seconds of the controller process and of each agent process (in-process: the same process),
    counted when the agents reported their last window: where the run's work went, agent by agent.

    ``window_cpu_s``: with direct windows, the CPU seconds of the one thread in each agent that ran them
    (``window_loops``). Against the window loop's wall time it says whether an agent's thread was the bound:
    a thread busy for nearly all of it could not have gone faster with more cores.
    """
    from agents.core import process_cpu_s

    out = {"controller": round(process_cpu_s(), 3), "agents": [round(c, 3) for c in agents_cpu_s]}
    if window_cpu_s and all(isinstance(c, (int, float)) for c in window_cpu_s):
        out["window_loops"] = [round(c, 3) for c in window_cpu_s]
    return out


def plan_model_bytes(plan: Plan, training: Any) -> int:
    if training is not None:
        return training.model_bytes
    from agents.workloads.models import build_model, param_bytes

    return param_bytes(build_model(plan.workload.model, plan.seed))


def plan_limits(plan: Plan, rc: RunConfig, model_bytes: int) -> wire.Limits:
    """The sizes any peer of this run may make a process hold: a small multiple of the model and messages."""
    c = rc.controller
    return wire.limits_for(model_bytes, len(plan.vworkers), c.max_message_bytes, c.max_blob_bytes, c.max_held_bytes)

"""A run as the CLI sees it: progress bar, metrics endpoint, launcher, plots, final message."""
from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from controller.config import RunConfig
from controller.launchers.base import AgentFailure, LauncherConfigError
from controller.observe import Observer
from controller.outputs import ReplayDiverged, RunDirBusy, RunDirLock
from controller.plot import plot_loss
from controller.recovery import NotResumable
from controller.run import RunResult, execute
from controller import signals
from controller.signals import Stopped

__all__ = ["run_session"]


def run_session(rc: RunConfig, run_dir: Path, resume: bool = False) -> RunResult:
    """Run (or resume) ``rc`` in ``run_dir``, which no other controller may use meanwhile (exit 2 if one does,
    before anything is written)."""
    lock = RunDirLock(run_dir)
    try:
        lock.acquire()
    except RunDirBusy as e:
        print(f"lockstep: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        return _run_session(rc, run_dir, resume)
    finally:
        lock.release()


def _run_session(rc: RunConfig, run_dir: Path, resume: bool = False) -> RunResult:
    from controller.remote import launcher_for  # launcher=inprocess|local|kubernetes|ray (DESIGN §10)

    signals.defer()  # from here a signal stops the run gracefully (controller/signals.py)

    bar = tqdm(total=rc.stop_updates, unit="upd", desc="lockstep", file=sys.stderr, disable=not rc.progress,
               dynamic_ncols=True, mininterval=0.5)
    observer = Observer(rc, run_dir)  # metrics endpoints, trace.json, state log (docs/observability.md)
    result = None
    try:
        launcher = launcher_for(rc)
    except LauncherConfigError as e:  # e.g. an unreachable launcher.address: before the run writes anything
        bar.close()
        print(f"lockstep: invalid configuration: {e}", file=sys.stderr)
        sys.exit(2)
    try:
        # log lines during the run (checkpoints, recoveries) go above the bar, not onto its line
        with logging_redirect_tqdm() if rc.progress else contextlib.nullcontext():
            result = execute(rc, run_dir, progress=bar, launcher=launcher, observer=observer, resume=resume)
    except AgentFailure as e:
        bar.close()
        tail = f"\n--- last log lines of agent {e.agent} ---\n{e.log_tail}" if e.log_tail else ""
        who = "every agent" if e.agent == "all" else f"agent {e.agent}"  # (a cluster-wide cause)
        line = (f"lockstep: the run stopped because {who} failed: {e.reason}. The outputs written so "
                f"far are in {run_dir}.")
        print(f"\n{line}{tail}", file=sys.stderr)
        short = re.match(r"[A-Z][A-Za-z]+\b", e.reason)  # ImagePullBackOff, OOMKilled, Unschedulable...
        report_failure(launcher, short.group(0) if short else "AgentFailed", line)
        sys.exit(1)
    except NotResumable as e:
        bar.close()
        print(f"lockstep resume: {e}", file=sys.stderr)
        sys.exit(2)
    except ReplayDiverged as e:
        bar.close()
        line = f"lockstep: {e}. The outputs written so far are in {run_dir}."
        print(f"\n{line}", file=sys.stderr)
        report_failure(launcher, "ReplayDiverged", line)
        sys.exit(1)
    except Stopped as e:  # SIGINT or SIGTERM (controller/signals.py): agents stopped, outputs finalised
        bar.close()
        print(f"\nlockstep: interrupted by {e.name}; every agent was stopped. The outputs so far are in {run_dir} "
              "(summary.json: stopped_by=signal).", file=sys.stderr)
        sys.exit(e.exit_status)
    except LauncherConfigError as e:  # e.g. no reachable cluster, a controller address pods cannot reach
        bar.close()
        line = f"lockstep: invalid configuration: {e}"
        print(f"\n{line}", file=sys.stderr)
        report_failure(launcher, "InvalidConfiguration", line)
        sys.exit(2)
    except KeyboardInterrupt:  # an interrupt that did not go through controller.signals (e.g. an API caller)
        bar.close()
        print(f"\nlockstep: interrupted; every agent was stopped. Outputs so far are in {run_dir}.", file=sys.stderr)
        sys.exit(130)
    finally:
        bar.close()
        if result is None:
            observer.finish(None)
    if result.summary["updates"]:
        plot_loss(run_dir)
    s = result.summary
    acc = "n/a" if s["test_accuracy"] is None else f"{100 * s['test_accuracy']:.2f} %"
    print(f"lockstep: {s['updates']} updates in {s['virtual_time_s']:.3f} virtual s "
          f"({s['wall_time_s']:.1f} wall s, speed ratio {s['speed_ratio']:.2f}); test accuracy {acc}\n"
          f"lockstep: outputs in {run_dir}", file=sys.stderr)
    if "parked" in s:  # the log has it too, but a stalled run must not pass for a finished one
        from controller.run import stall_sentence

        print(f"lockstep: warning: {stall_sentence(rc, s)}", file=sys.stderr)
    observer.finish(s)
    url = rc.outputs.upload
    if url:
        from controller.outputs import upload

        try:
            print(f"lockstep: uploaded the run directory to {upload(run_dir, url)}", file=sys.stderr)
        except Exception as e:  # noqa: BLE001 - any storage error: one sentence, the results stay where they are
            line = f"lockstep: could not upload {run_dir} to outputs.upload={url}: {type(e).__name__}: {e}"
            print(line, file=sys.stderr)
            report_failure(None, "UploadFailed", line)
            sys.exit(1)
    return result


def report_failure(launcher: object, reason: str, line: str) -> None:
    """Where a user looks besides the log: the container's termination message ($LOCKSTEP_TERMINATION_LOG,
    the chart sets /dev/termination-log) and, on Kubernetes, a RunFailed condition on the controller's Job."""
    path = os.environ.get("LOCKSTEP_TERMINATION_LOG")
    if path:
        try:
            Path(path).write_text(line + "\n")
        except OSError as e:
            print(f"lockstep: could not write the termination message to {path}: {e}", file=sys.stderr)
    report = getattr(getattr(launcher, "launcher", None), "report_failure", None)
    if report is not None:
        report(reason or "Failed", line)

"""A run as the CLI sees it: progress bar, metrics endpoint, launcher, plots, final message."""
from __future__ import annotations

import sys
from pathlib import Path

from tqdm import tqdm

from controller.config import RunConfig
from controller.launchers.base import AgentFailure, LauncherConfigError
from controller.observe import Observer
from controller.plot import plot_loss
from controller.run import RunResult, execute

__all__ = ["run_session"]


def run_session(rc: RunConfig, run_dir: Path) -> RunResult:
    from controller.remote import launcher_for  # launcher=inprocess|local|kubernetes|ray (DESIGN §10)

    try:
        launcher = launcher_for(rc)
    except LauncherConfigError as e:  # e.g. an unreachable launcher.address: before the run writes anything
        _invalid(e)
    bar = tqdm(total=rc.stop_updates, unit="upd", desc="lockstep", file=sys.stderr, disable=not rc.progress,
               dynamic_ncols=True, mininterval=0.5)
    observer = Observer(rc, run_dir)  # metrics endpoints, trace.json, state log (docs/observability.md)
    result = None
    try:
        result = execute(rc, run_dir, progress=bar, launcher=launcher, observer=observer)
    except LauncherConfigError as e:  # what only shows when the launcher starts (a cluster that refuses, ...)
        bar.close()
        _invalid(e)
    except AgentFailure as e:
        bar.close()
        tail = f"\n--- last log lines of agent {e.agent} ---\n{e.log_tail}" if e.log_tail else ""
        print(f"\nlockstep: the run stopped because agent {e.agent} failed: {e.reason}. The outputs written so "
              f"far are in {run_dir}.{tail}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
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
    observer.finish(s)
    return result


def _invalid(e: LauncherConfigError) -> None:
    print(f"lockstep: invalid configuration:\n  {e}", file=sys.stderr)
    sys.exit(2)

"""A run as the CLI sees it: progress bar, metrics endpoint, launcher, plots, final message."""
from __future__ import annotations

import sys
from pathlib import Path

from tqdm import tqdm

from controller.config import RunConfig
from controller.launchers.base import AgentFailure
from controller.observe import Observer
from controller.plot import plot_loss
from controller.run import RunResult, execute
from controller import signals
from controller.signals import Stopped

__all__ = ["run_session"]


def run_session(rc: RunConfig, run_dir: Path) -> RunResult:
    from controller.remote import launcher_for  # launcher=inprocess|local|kubernetes (DESIGN §10)

    signals.defer()  # from here a signal stops the run gracefully (controller/signals.py)

    bar = tqdm(total=rc.stop_updates, unit="upd", desc="lockstep", file=sys.stderr, disable=not rc.progress,
               dynamic_ncols=True, mininterval=0.5)
    observer = Observer(rc, run_dir)  # metrics endpoints, trace.json, state log (docs/observability.md)
    result = None
    try:
        result = execute(rc, run_dir, progress=bar, launcher=launcher_for(rc), observer=observer)
    except AgentFailure as e:
        bar.close()
        tail = f"\n--- last log lines of agent {e.agent} ---\n{e.log_tail}" if e.log_tail else ""
        print(f"\nlockstep: the run stopped because agent {e.agent} failed: {e.reason}. The outputs written so "
              f"far are in {run_dir}.{tail}", file=sys.stderr)
        sys.exit(1)
    except Stopped as e:  # SIGINT or SIGTERM (controller/signals.py): agents stopped, outputs finalised
        bar.close()
        print(f"\nlockstep: interrupted by {e.name}; every agent was stopped. The outputs so far are in {run_dir} "
              "(summary.json: stopped_by=signal).", file=sys.stderr)
        sys.exit(e.exit_status)
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
    observer.finish(s)
    return result

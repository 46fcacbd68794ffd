"""A run that runs out of events before its stop condition says so, and names who waits for what.

A synchronous PS whose gradient from w1 is lost for good (docs/faults.md, `loss`: strategies have no
retransmission) waits for it for ever, and its workers wait for parameters that never come: no event is
left, the run ends. It must not pass for a finished run: ``summary.json`` has ``parked`` (how many
vworkers wait, the first ones by id with their ``recv``/``wait``), the log and the CLI a warning.
"""
from __future__ import annotations

import subprocess
import sys

from tests.distributed.conftest import ROOT, assert_same_outputs, run

NET = ["network.discipline=unlimited", "network.bandwidth=1e15", "network.latency=1ms", "compute.gradient=0.01",
       "compute.update=0.001", "compute.aggregate=0", "strategy=ps_sync", "workers=4", "stop.updates=5"]
# rounds end at 13, 26, ... ms; w1 sends its second gradient at 25 ms, inside the loss interval
LOST = ["faults=[{kind:loss,workers:[w1],probability:1,at:20ms,until:30ms}]"]
PARKED = {"vworkers": 5, "first": ["w0 in recv(src=ps0, tag='params')", "w1 in recv(src=ps0, tag='params')",
                                   "w2 in recv(src=ps0, tag='params')", "w3 in recv(src=ps0, tag='params')",
                                   "ps0 in recv(src=any, tag=any)"]}


def test_a_run_that_runs_out_of_events_names_the_vworkers_still_waiting(tmp_path, caplog):
    r = run(tmp_path / "a1", NET + LOST)
    s = r.summary
    assert (s["updates"], s["stopped_by"], s["virtual_time_ns"]) == (1, "no_more_events", 13_000_002)
    assert s["parked"] == PARKED
    # its last event: ps0 receives the second gradients of w0, w2 and w3 (trace.json: 'grad ← w0' at 25000.004 us),
    # not its last row (13 ms, which virtual_time_ns keeps), which the sentence gave until 2026-12-02
    assert s["last_event_ns"] == 25_000_004
    warning = [m for m in caplog.messages if "ran out of events" in m]
    assert warning == [
        "the run ran out of events at virtual time 0.025000004 s after 1 update, before stop.updates=5: 5 vworkers "
        "wait for what nothing will send — " + ", ".join(PARKED["first"]) + " (summary.json: parked; a message "
        "never sent, or lost for good)."]
    # the same vworkers, whatever the placement: in one process over two agents, and over local gRPC agents
    for name, extra, local in (("a2", ["agents=2", "placement=block"], False),
                               ("a2-local", ["agents=2", "placement=round_robin"], True)):
        other = run(tmp_path / name, NET + LOST + extra, local=local)
        assert other.summary["parked"] == PARKED
        assert other.summary["last_event_ns"] == 25_000_004  # agents in their own processes report it too
        assert_same_outputs(tmp_path / "a1", tmp_path / name)


def test_a_run_that_reaches_its_stop_or_ends_with_its_vworkers_done_has_nothing_parked(tmp_path):
    done = run(tmp_path / "stop", NET)
    assert (done.summary["updates"], done.summary["stopped_by"]) == (5, "updates")
    assert "parked" not in done.summary  # vworkers mid-exchange at the stop are not stalled


def test_the_cli_warns_after_its_result_line(tmp_path):
    # compute=constant: the CLI's default (profiled) times the calls its profile lacks on this host (the
    # aggregate of 4 gradients), which would make the virtual times, and so the rounds, the host's
    p = subprocess.run([sys.executable, "-m", "controller.cli", "run", "network=ideal", *NET, *LOST, "compute=constant",
                        "progress=false", f"hydra.run.dir={tmp_path / 'cli'}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last == ("lockstep: warning: the run ran out of events at virtual time 0.025000000 s after 1 update, before "
                    "stop.updates=5: 5 vworkers wait for what nothing will send — " + ", ".join(PARKED["first"]) +
                    " (summary.json: parked; a message never sent, or lost for good)."), p.stderr

"""`lockstep inspect` where the outputs say less: ring workers that record no updates, a windowed trace, no
state log, a run that has not finished, and times and files it cannot read. What the outputs do not
determine is reported as unknown, with a note saying why, never as `waiting` or version 0."""
from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from agents.common.units import UnitError
from controller.inspect import RunView, main, parse_time

from . import runs

UPDATES = 20


def _rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _inspect(run_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "controller.cli", "inspect", str(run_dir), *args],
                          cwd=runs.ROOT, capture_output=True, text=True, timeout=60)


def _update_ends(run_dir: Path) -> dict[str, list[int]]:
    """Each vworker's `update` compute ends in trace.json, ns, in order."""
    events = json.loads((run_dir / "trace.json").read_text())["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    ends = defaultdict(list)
    for e in events:
        if e["ph"] == "X" and e["name"] == "update":
            ends[threads[(e["pid"], e["tid"])]].append(round((e["ts"] + e["dur"]) * 1000))
    return {k: sorted(v) for k, v in ends.items()}


@pytest.fixture(scope="module")
def ring(tmp_path_factory) -> Path:
    return runs.run(tmp_path_factory.mktemp("ring"), "strategy=ring_allreduce", "workers=4",
                    f"stop.updates={UPDATES}", "eval.every=0")


@pytest.fixture(scope="module")
def ps_window(tmp_path_factory) -> Path:
    """ps_async with no state log and a trace of [50 ms, 100 ms] only."""
    return runs.run(tmp_path_factory.mktemp("ps_window"), "strategy=ps_async", "workers=3",
                    f"stop.updates={UPDATES}", "eval.every=0", "statelog.enabled=false", "trace.mode=window",
                    "trace.window=[0.05,0.1]")


# ------------------------------------------------------------------ 1. versions of workers that record no updates
@pytest.mark.slow
def test_every_ring_worker_holds_the_updates_it_applied_not_version_0(ring):
    rows = _rows(ring)
    assert len(rows) == UPDATES and {r["vworker"] for r in rows} == {"w0"}  # only w0 records the updates
    ends = _update_ends(ring)
    assert sorted(ends) == ["w0", "w1", "w2", "w3"] and all(len(v) == UPDATES for v in ends.values())
    assert ends["w0"] == [int(r["virtual_time_ns"]) for r in rows]
    view = RunView(ring)
    times = sorted({t + d for v in ends.values() for t in v for d in (-1, 0)} | {0, 5_000_000})
    # each holds the number of updates it applied by T (an update at T counts as applied at T)
    assert {w: [view.state(w, t)["version"] for t in times] for w in ("w1", "w2", "w3")} == {
        w: [sum(e <= t for e in ends[w]) for t in times] for w in ("w1", "w2", "w3")}
    assert [view.state("w0", t)["version"] for t in times] == [
        sum(int(r["virtual_time_ns"]) <= t for r in rows) for t in times]
    assert {(w, view.state(w, t)["version_source"], str(view.state(w, t)["unknown"])) for t in times
            for w in ("w0", "w1", "w2", "w3")} == {("w0", "metrics.csv", "{}"), ("w1", "trace", "{}"),
                                                   ("w2", "trace", "{}"), ("w3", "trace", "{}")}
    # the replicas apply update k at their own times: just after w0's first update some still hold version 0
    t1 = ends["w0"][0]
    assert [view.state(w, t1)["version"] for w in ("w0", "w1", "w2", "w3")] == [
        1, *(int(ends[w][0] <= t1) for w in ("w1", "w2", "w3"))]
    end = json.loads((ring / "summary.json").read_text())["virtual_time_ns"]
    p = _inspect(ring, "--at", f"{end}ns")
    assert p.returncode == 0 and p.stderr == ""
    table = [line.split() for line in p.stdout.splitlines()[2:]]
    # the run stops at w0's last update: a replica whose own last update ends later is still computing it
    held = [sum(e <= end for e in ends[w]) for w in ("w1", "w2", "w3")]
    assert all(v in (UPDATES - 1, UPDATES) for v in held)
    assert [(c[0], c[-1] if c[0] != "w0" else c[-3]) for c in table] == [
        ("w0", str(UPDATES)), *((w, str(v)) for w, v in zip(("w1", "w2", "w3"), held))]
    assert [c[1:3] for c in table if c[-1] == str(UPDATES - 1)] == [["computing", "update"]] * held.count(UPDATES - 1)


@pytest.mark.slow
def test_ring_workers_without_a_trace_have_an_unknown_version(ring, tmp_path):
    d = tmp_path / "no-trace"
    shutil.copytree(ring, d)  # what trace.mode=off writes: no trace.json, and the plan says off
    (d / "trace.json").unlink()
    plan = json.loads((d / "plan.json").read_text())
    plan["trace"]["mode"] = "off"
    (d / "plan.json").write_text(json.dumps(plan))
    row = _rows(ring)[9]
    p = _inspect(d, "--at", f"{row['virtual_time_ns']}ns", "--json")
    assert p.returncode == 0, p.stderr
    states = {s["vworker"]: s for s in json.loads(p.stdout)["states"]}
    assert (states["w0"]["version"], states["w0"]["loss"]) == (10, float(row["loss"]))
    for w in ("w1", "w2", "w3"):
        assert (states[w]["version"], states[w]["doing"]) == (None, "unknown"), states[w]  # not version 0
        assert states[w]["unknown"] == {
            "doing": "there is no trace (trace.mode=off)",
            "version": "ring_allreduce records its updates on w0 only, and there is no trace (trace.mode=off)"}
    assert p.stderr == (
        "lockstep inspect: note: what w0, w1, w2, w3 were doing at T is unknown: there is no trace (trace.mode=off)\n"
        "lockstep inspect: note: the model version of w1, w2, w3 at T is unknown: ring_allreduce records its "
        "updates on w0 only, and there is no trace (trace.mode=off)\n")
    table = _inspect(d, "--at", f"{row['virtual_time_ns']}ns", "--worker", "w2")
    assert table.stdout.splitlines()[2].split() == ["w2", "unknown", "unknown"]


@pytest.mark.slow
def test_ps_workers_without_a_state_log_have_an_unknown_version(ps_window):
    rows = _rows(ps_window)
    t = int(rows[5]["virtual_time_ns"])
    view = RunView(ps_window)
    for w in ("w0", "w1", "w2"):
        s = view.state(w, t)
        assert s["version"] is None, s  # not version 0
        assert s["unknown"]["version"] == "no statelog.jsonl (statelog.enabled=false) and no rows in metrics.csv"
    ps = view.state("ps0", t)  # the PS records every update: its version is known
    assert (ps["version"], ps["loss"], ps["version_source"], "version" in ps["unknown"]) == (
        6, float(rows[5]["loss"]), "metrics.csv", False)


# ------------------------------------------------------------------ 2. times a windowed trace did not record
@pytest.mark.slow
def test_a_windowed_trace_says_nothing_about_times_outside_its_window(ps_window):
    plan = json.loads((ps_window / "plan.json").read_text())
    assert plan["trace"]["window_ns"] == [50_000_000, 100_000_000]
    rows = _rows(ps_window)
    view = RunView(ps_window)
    why = "the trace covers only [0.05 s, 0.1 s] (trace.mode=window)"
    for t in (20_000_000, 49_999_999, 100_000_001, int(rows[-1]["virtual_time_ns"])):
        for name in ("w0", "w1", "w2", "ps0"):
            s = view.state(name, t)
            # unless a recorded compute (kept whole when it overlaps the window) covers T
            if s["doing"].startswith("computing"):
                assert s["source"] == "trace" and s["since_ns"] <= t < s["until_ns"], (name, t, s)
            else:
                assert (s["doing"], s["source"]) == ("unknown", None), (name, t, s)  # not "waiting"
                assert s["unknown"]["doing"] == why
    # inside the window the trace is the record: the PS computes each update until the instant of its row
    inside = [int(r["virtual_time_ns"]) for r in rows if 50_000_000 < int(r["virtual_time_ns"]) - 1 <= 100_000_000]
    assert inside
    for t in inside:
        s = view.state("ps0", t - 1)
        assert (s["doing"], s["until_ns"], s["unknown"]) == ("computing update", t, {})
    p = _inspect(ps_window, "--at", "0.02s")
    assert p.returncode == 0
    assert p.stderr == (
        f"lockstep inspect: note: what w0, w1, w2, ps0 were doing at T is unknown: {why}\n"
        "lockstep inspect: note: the model version of w0, w1, w2 at T is unknown: no statelog.jsonl "
        "(statelog.enabled=false) and no rows in metrics.csv\n")
    table = [line.split() for line in p.stdout.splitlines()[2:]]
    assert table == [["w0", "unknown", "unknown"], ["w1", "unknown", "unknown"], ["w2", "unknown", "unknown"],
                     ["ps0", "unknown", "0"]]


# ------------------------------------------------------------------ 2b. times after a trace cut at trace.max_events
def _recorded_until(run_dir: Path) -> int:
    """The earliest end, over the vworkers, of the last compute span the trace holds of it (ns)."""
    doc = json.loads((run_dir / "trace.json").read_text())
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name" and " " not in e["args"]["name"]}
    last: dict[str, int] = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X" and e["cat"] == "compute" and (e["pid"], e["tid"]) in threads:
            name = threads[(e["pid"], e["tid"])]
            last[name] = max(last.get(name, 0), round((e["ts"] + e["dur"]) * 1000))
    assert doc["otherData"]["truncated"] and sorted(last) == sorted(threads.values())
    return min(last.values())


def _event_times(view: RunView) -> list[int]:
    """Every instant a span or transfer of the run begins or ends, and the nanosecond before it."""
    ends = {x for spans in view.spans.values() for t0, t1, _ in spans for x in (t0, t1)}
    ends |= {x for tr in view.transfers.values() for t0, t1, *_ in tr for x in (t0, t1)}
    return sorted({x - d for x in ends for d in (0, 1) if x - d >= 0})


@pytest.fixture(scope="module")
def ps_cut(tmp_path_factory) -> tuple[Path, Path]:
    """ps_async, 4 workers, with its trace cut at 300 events, and the same run traced in full."""
    args = ("strategy=ps_async", "workers=4", "stop.updates=60", "eval.every=0")
    return (runs.run(tmp_path_factory.mktemp("ps_cut"), *args, "trace.max_events=300"),
            runs.run(tmp_path_factory.mktemp("ps_full"), *args))


def _spans(run_dir: Path) -> set[tuple]:
    """Every compute span of the trace, as (thread, ts, dur, name)."""
    doc = json.loads((run_dir / "trace.json").read_text())
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"}
    return {(threads[(e["pid"], e["tid"])], e["ts"], e["dur"], e["name"]) for e in doc["traceEvents"]
            if e["ph"] == "X" and e["cat"] == "compute"}


def test_a_cut_trace_says_when_it_was_cut_and_holds_every_compute_that_started_before(ps_cut):
    # otherData.truncated_at_ns: the earliest start of a record left out (the file did not say when the cut was)
    cut, full = ps_cut
    at = json.loads((cut / "trace.json").read_text())["otherData"]["truncated_at_ns"]
    assert isinstance(at, int) and 0 < at
    assert json.loads((full / "trace.json").read_text())["otherData"]["truncated_at_ns"] is None
    before = {sp for sp in _spans(full) if round(sp[1] * 1000) < at}
    assert before and before <= _spans(cut)
    assert RunView(cut).trace_end_ns == min(_recorded_until(cut), at)


@pytest.mark.slow
def test_a_trace_cut_at_max_events_says_nothing_after_its_last_records(ps_cut):
    cut, full = ps_cut
    until = min(_recorded_until(cut), json.loads((cut / "trace.json").read_text())["otherData"]["truncated_at_ns"])
    assert until == RunView(cut).trace_end_ns
    why = f"trace.json stops at trace.max_events (it records up to {until / 1e9:.9f}".rstrip("0") + " s)"
    a, b = RunView(cut), RunView(full)
    times = _event_times(b)
    before = [t for t in times if t < until]
    assert len(before) > 100
    # up to there the cut trace says exactly what the whole one says
    assert [[a.state(n, t) for n in a.names] for t in before] == [[b.state(n, t) for n in b.names] for t in before]
    # after it (it said `waiting`, source trace): a recorded compute, what the state log says, or unknown
    after = [(n, t, a.state(n, t)) for t in times if t >= until for n in a.names]
    assert {s["doing"] for _, _, s in after} == {"unknown", "computing", "computing gradient", "computing update",
                                                 "sending"}
    for n, t, s in after:
        if s["doing"] == "unknown":
            assert (s["source"], s["unknown"]) == (None, {"doing": why}), (n, t, s)
        elif s["doing"].startswith("computing "):  # a compute the trace holds
            assert s["source"] == "trace" and s["since_ns"] <= t < s["until_ns"], (n, t, s)
        else:  # a worker's exchange in the state log; the PS has none
            assert s["source"] == "statelog" and n != "ps0", (n, t, s)
    p = _inspect(cut, "--at", "0.3s")
    assert p.returncode == 0 and p.stderr == (
        f"lockstep inspect: note: what w0, w2, w3, ps0 were doing at T is unknown: {why}\n")
    assert [line.split()[:2] for line in p.stdout.splitlines()[2:]] == [
        ["w0", "unknown"], ["w1", "computing"], ["w2", "unknown"], ["w3", "unknown"], ["ps0", "unknown"]]
    full_doing = [line.split()[1] for line in _inspect(full, "--at", "0.3s").stdout.splitlines()[2:]]
    assert full_doing == ["receiving", "computing", "receiving", "waiting", "computing"]


@pytest.mark.slow
def test_ring_workers_hold_the_updates_a_cut_trace_records_and_no_version_after_it(ring, tmp_path):
    cut = runs.run(tmp_path / "ring-cut", "strategy=ring_allreduce", "workers=4", f"stop.updates={UPDATES}",
                   "eval.every=0", "trace.max_events=400")
    until = _recorded_until(cut)
    a, b = RunView(cut), RunView(ring)
    times = _event_times(b)
    before = [t for t in times if t < until]
    assert before and [t for t in times if t >= until]
    assert [[a.state(w, t)["version"] for w in ("w1", "w2", "w3")] for t in before] == [
        [b.state(w, t)["version"] for w in ("w1", "w2", "w3")] for t in before]
    why = (f"ring_allreduce records its updates on w0 only, and trace.json stops at trace.max_events (it records "
           f"up to {until / 1e9:.9f}".rstrip("0") + " s)")
    assert {(a.state(w, t)["version"], a.state(w, t)["unknown"].get("version")) for t in times if t >= until
            for w in ("w1", "w2", "w3")} == {(None, why)}
    assert [a.state("w0", t)["version"] for t in times] == [b.state("w0", t)["version"] for t in times]


# ------------------------------------------------------------------ 3. past the recorded end of an unfinished run
@pytest.mark.slow
def test_inspect_past_the_recorded_end_of_an_unfinished_run_says_so(ring, tmp_path):
    d = tmp_path / "killed"
    shutil.copytree(ring, d)
    lines = (d / "metrics.csv").read_text().splitlines(keepends=True)
    (d / "metrics.csv").write_text("".join(lines[:6]))  # the header and 5 rows: it was killed after them
    rows = _rows(d)
    end = int(rows[-1]["virtual_time_ns"])
    (d / "summary.json").write_text(json.dumps({"complete": False, "virtual_time_ns": end, "updates": 5}))
    note = (f"lockstep inspect: note: T is after the last time the run recorded ({end / 1e9:.9f} s; it has not "
            "finished: no complete summary.json): the states are those at that time\n")
    p = _inspect(d, "--at", "1000s", "--worker", "w0")
    assert p.returncode == 0 and p.stderr == note
    at_end = _inspect(d, "--at", f"{end}ns", "--worker", "w0")
    assert at_end.stderr == ""  # at the end itself: no note
    # the states are those at that time, as the note says (they were looked up at 1000 s: w0 'waiting')
    assert p.stdout == at_end.stdout
    assert p.stdout.splitlines()[2].split()[-3:] == ["5", f"{float(rows[-1]['loss']):.4f}", "0"]
    (d / "summary.json").unlink()  # still going, before its first partial summary
    assert _inspect(d, "--at", "1000s", "--worker", "w0").stderr == note
    # the state log's last row counts too (its rows reach disk before the window's metrics rows)
    later = end + 1_000_000
    (d / "statelog.jsonl").write_text(json.dumps({"t": later, "vworker": "w0", "kind": "version", "version": 6})
                                      + "\n")
    p = _inspect(d, "--at", f"{later}ns", "--worker", "w0", "--json")
    assert p.stderr == "" and json.loads(p.stdout)["states"][0]["version"] == 6
    assert _inspect(d, "--at", f"{later + 1}ns", "--worker", "w0").stderr == note.replace(
        f"{end / 1e9:.9f}", f"{later / 1e9:.9f}")


# ------------------------------------------------------------------ 4, 5. times and files it cannot read
def _fake_run(d: Path, plan: object) -> Path:
    d.mkdir()
    (d / "plan.json").write_text(plan if isinstance(plan, str) else json.dumps(plan))
    return d


PLAN = {"vworkers": [{"name": "w0", "holds_data": True}, {"name": "ps0"}], "placement": [0, 0], "result": "ps0",
        "strategy": "ps_async", "trace": {"mode": "full", "keep": None, "window_ns": None, "max_events": 500000}}


@pytest.mark.parametrize("at", ["1e400", "1e400ms", "-1e400s", "1e300h"])
def test_an_infinite_time_is_refused_in_one_sentence(tmp_path, capsys, at):
    with pytest.raises(UnitError):
        parse_time(at)
    d = _fake_run(tmp_path / "run", PLAN)
    assert main([str(d), f"--at={at}"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (
        f"lockstep inspect: --at {at!r}: --at: {at!r} is not a finite time; accepted: seconds as a number, "
        "or a string with ns, us, ms, s, min, h\n")


@pytest.mark.parametrize("at", ["-1s", "-0.5", "-1", "-.5ms", "-1e400s"])
def test_a_negative_time_after_a_space_gets_the_same_sentence_as_after_an_equals_sign(tmp_path, capsys, at):
    # `--at -1s` was argparse's "expected one argument": it took -1s for an option
    d = _fake_run(tmp_path / "run", PLAN)
    assert main([str(d), f"--at={at}"]) == 2
    joined = capsys.readouterr()
    assert main([str(d), "--at", at, "--worker", ""]) == 2 and main([str(d), "--at", at]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == joined.err * 2 and joined.err == (
        f"lockstep inspect: --at {at!r}: --at: {at!r} is not a finite time; accepted: seconds as a number, or a "
        "string with ns, us, ms, s, min, h\n" if "e400" in at else
        f"lockstep inspect: --at {at!r} is not valid; accepted: a virtual time >= 0 (e.g. 12.5s)\n")


def test_a_missing_time_is_still_argparses_missing_argument(tmp_path, capsys):
    d = _fake_run(tmp_path / "run", PLAN)
    with pytest.raises(SystemExit) as e:
        main([str(d), "--at", "--json"])
    assert e.value.code == 2 and "argument --at: expected one argument" in capsys.readouterr().err


@pytest.mark.parametrize("plan, why", [
    ({}, "it has no 'vworkers' list of objects with a 'name'"),
    ([], "it is not a JSON object"),
    ({"vworkers": [{"name": "w0"}]}, "its 'placement' is not a list of one agent number per vworker"),
    ({"vworkers": [{"name": "w0"}], "placement": [0]}, "its 'result' is not one of its vworkers"),
])
def test_a_plan_that_is_not_a_lockstep_plan_is_named_in_one_sentence(tmp_path, capsys, plan, why):
    d = _fake_run(tmp_path / "run", plan)
    assert main([str(d), "--at", "1s"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == f"lockstep inspect: {d / 'plan.json'} is not a lockstep plan: {why}\n"


def test_a_cut_short_plan_or_trace_is_named_in_one_sentence(tmp_path, capsys):
    d = _fake_run(tmp_path / "plan-cut", '{"vworkers": [\n')
    assert main([str(d), "--at", "1s"]) == 2
    assert capsys.readouterr().err == (f"lockstep inspect: {d / 'plan.json'} is not valid JSON (Expecting value: "
                                       "line 2 column 1 (char 15)): the file is cut short or corrupt\n")
    d = _fake_run(tmp_path / "trace-cut", PLAN)
    (d / "trace.json").write_text('{"traceEvents": [\n')
    assert main([str(d), "--at", "1s"]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == (
        f"lockstep inspect: {d / 'trace.json'} is not valid JSON (Expecting value: line 2 column 1 (char 18)): the "
        "file is cut short or corrupt\n")
    (d / "trace.json").write_text('{"events": []}')
    assert main([str(d), "--at", "1s"]) == 2
    assert capsys.readouterr().err == (f"lockstep inspect: {d / 'trace.json'} is not a trace lockstep wrote (it "
                                       "has no 'traceEvents' list)\n")
    (d / "trace.json").write_text('{"traceEvents": [{"ph": "X", "ts": 0}]}')
    assert main([str(d), "--at", "1s"]) == 2
    assert capsys.readouterr().err == (f"lockstep inspect: {d / 'trace.json'} is not a trace lockstep wrote (an "
                                       "event has no 'pid')\n")


def test_a_metrics_csv_without_its_columns_is_named_in_one_sentence(tmp_path, capsys):
    d = _fake_run(tmp_path / "run", PLAN)
    (d / "metrics.csv").write_text("virtual_time_ns,vworker\n5,ps0\n")
    assert main([str(d), "--at", "1s"]) == 2
    assert capsys.readouterr().err == (f"lockstep inspect: {d / 'metrics.csv'} is not a metrics.csv lockstep "
                                       "wrote (a row has no 'iteration')\n")


def test_an_empty_worker_is_named_as_no_vworker_of_the_run(tmp_path, capsys):
    # --worker "" showed every vworker, as if --worker were not given
    d = _fake_run(tmp_path / "run", PLAN)
    assert main([str(d), "--at=0", "--worker", ""]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == "lockstep inspect: no vworker '' in this run; vworkers: w0, ps0\n"

"""trace.json, the state log and `lockstep inspect` of real runs, checked against metrics.csv."""
from __future__ import annotations

import bisect
import csv
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from agents.observe.statelog import StateLog
from agents.observe.trace import Tracer, TraceWriter, trace_spec
from controller.inspect import RunView, parse_time

from . import runs

pytestmark = pytest.mark.slow

UPDATES = 30


@pytest.fixture(scope="module", params=["ps_async", "ps_sync"])
def run_dir(request, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp(request.param)
    return runs.run(d, f"strategy={request.param}", "workers=3", f"stop.updates={UPDATES}", "eval.every=0",
                    "statelog.snapshot_every=5")


def _rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _ns(us: float) -> int:
    return round(us * 1000)


def _trace(run_dir: Path):
    doc = json.loads((run_dir / "trace.json").read_text())
    events = doc["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    return doc, events, threads


def test_trace_has_a_thread_per_vworker_and_well_formed_spans(run_dir):
    doc, events, threads = _trace(run_dir)
    names = [v["name"] for v in json.loads((run_dir / "plan.json").read_text())["vworkers"]]
    assert doc["otherData"]["clock"] == "virtual" and not doc["otherData"]["truncated"]
    main_threads = sorted(n for n in threads.values() if " " not in n)
    assert main_threads == sorted(names)
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["cat"] for e in spans} == {"compute", "wait", "egress", "ingress"}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 and (e["pid"], e["tid"]) in threads for e in spans)
    # spans of one thread never overlap (Chrome threads cannot show that; transfers use lanes)
    by_thread = defaultdict(list)
    for e in spans:
        by_thread[(e["pid"], e["tid"])].append((_ns(e["ts"]), _ns(e["ts"] + e["dur"])))
    for key, ss in by_thread.items():
        ss.sort()
        assert all(a[1] <= b[0] for a, b in zip(ss, ss[1:])), threads[key]


def test_every_flow_has_both_ends_each_bound_to_a_transfer_span(run_dir):
    _, events, threads = _trace(run_dir)
    spans = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            spans[(e["pid"], e["tid"])].append(e)
    ends = defaultdict(dict)
    for e in events:
        if e["ph"] in "sf":
            assert e["ph"] not in ends[e["id"]], f"flow {e['id']} has two {e['ph']!r} events"
            ends[e["id"]][e["ph"]] = e
    assert ends and all(set(v) == {"s", "f"} for v in ends.values())
    for fid, v in ends.items():
        s, f = v["s"], v["f"]
        assert f["bp"] == "e" and s["ts"] <= f["ts"]
        for end, cat in ((s, "egress"), (f, "ingress")):
            bound = [x for x in spans[(end["pid"], end["tid"])] if x["ts"] <= end["ts"] <= x["ts"] + x["dur"]]
            assert len(bound) == 1 and bound[0]["cat"] == cat, (fid, end, threads[(end["pid"], end["tid"])])


def test_trace_spans_match_metrics_csv(run_dir):
    _, events, threads = _trace(run_dir)
    rows = _rows(run_dir)
    assert len(rows) == UPDATES
    updates = [e for e in events if e["ph"] == "X" and e["name"] == "update" and threads[(e["pid"], e["tid"])] == "ps0"]
    # the PS's update compute ends exactly at each update row's virtual time
    assert [_ns(e["ts"] + e["dur"]) for e in updates] == [int(r["virtual_time_ns"]) for r in rows]
    # every gradient a worker sent arrived at the PS as one ingress span from that worker
    grads = [e for e in events if e["ph"] == "X" and e["cat"] == "ingress" and e["name"].startswith("grad")]
    gradients = [e for e in events if e["ph"] == "X" and e["name"] == "gradient"]
    assert len(grads) >= UPDATES and len(gradients) >= len(grads)


def test_state_log_agrees_with_metrics_csv(run_dir):
    log = StateLog.load(run_dir)
    rows = {int(r["iteration"]): r for r in _rows(run_dir)}
    applied = [ex for exs in log.exchanges.values() for ex in exs if ex.applied_version is not None]
    assert {ex.applied_version for ex in applied} == set(rows)
    times = [int(r["virtual_time_ns"]) for r in _rows(run_dir)]
    for ex in applied:
        r = rows[ex.applied_version]
        # the server's age when the result arrived: the updates applied by then
        assert ex.server_version_at_end == bisect.bisect_right(times, ex.end_ns)
        assert ex.applied_ns == int(r["virtual_time_ns"])
        assert ex.begin_ns <= ex.sent_ns <= ex.end_ns <= ex.applied_ns
        assert ex.staleness == ex.applied_version - 1 - ex.version
        assert ex.crc is not None and ex.applied_crc is not None and ex.crc != ex.applied_crc
    for v, r in rows.items():
        staleness = {ex.staleness for ex in applied if ex.applied_version == v}
        assert staleness == {int(r["staleness"])} or r["staleness"] == "0"


def test_inspect_returns_the_states_the_run_had(run_dir):
    view = RunView(run_dir)
    rows = _rows(run_dir)
    for r in (rows[0], rows[len(rows) // 2], rows[-1]):
        t = int(r["virtual_time_ns"])
        s = view.state("ps0", t)
        assert (s["version"], s["loss"], s["staleness"]) == (int(r["iteration"]), float(r["loss"]),
                                                             int(r["staleness"]))
        before = view.state("ps0", t - 1)
        assert before["version"] == int(r["iteration"]) - 1
        assert before["doing"] == "computing update"  # the update compute ends at t
    # a worker in the middle of a gradient holds the model version it received for it
    log = StateLog.load(run_dir)
    ex = log.exchanges["w1"][2]
    mid = (ex.begin_ns + ex.sent_ns) // 2
    s = view.state("w1", mid)
    assert s["doing"] == "computing gradient" and s["version"] == ex.version and s["source"] == "trace"
    assert s["loss"] == log.exchanges["w1"][1].loss  # the last loss it computed
    # between sending the gradient and the next model it is not computing
    assert view.state("w1", ex.sent_ns)["doing"] in ("sending", "waiting")


def test_inspect_cli_prints_json_and_writes_the_model_of_time_t(run_dir, tmp_path):
    rows = _rows(run_dir)
    last = rows[-1]
    out = tmp_path / "model.pt"
    p = subprocess.run([sys.executable, "-m", "controller.cli", "inspect", str(run_dir), "--at",
                        f"{last['virtual_time_ns']}ns", "--json", "--write-model", str(out)],
                       cwd=runs.ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["model"]["version"] == UPDATES and doc["model"]["exact"]
    ps = next(s for s in doc["states"] if s["vworker"] == "ps0")
    assert ps["version"] == UPDATES and ps["loss"] == float(last["loss"])
    state = torch.load(out)
    flat = torch.cat([v.reshape(-1) for v in state.values()])
    assert torch.equal(flat, torch.load(run_dir / "params.pt"))  # the final model, exactly
    # at a time between two snapshots the newest earlier one is written, and said not to be exact
    t = int(rows[6]["virtual_time_ns"])
    m = RunView(run_dir).write_model(t, tmp_path / "m7.pt")
    assert (m["version"], m["version_at_t"], m["exact"]) == (5, 7, False)


def test_inspect_rejects_a_bad_time_and_an_unknown_worker(run_dir):
    bad = subprocess.run([sys.executable, "-m", "controller.cli", "inspect", str(run_dir), "--at", "soon"],
                         cwd=runs.ROOT, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--at" in bad.stderr
    unknown = subprocess.run([sys.executable, "-m", "controller.cli", "inspect", str(run_dir), "--at", "1s",
                              "--worker", "w99"], cwd=runs.ROOT, capture_output=True, text=True, timeout=60)
    assert unknown.returncode == 2 and "w99" in unknown.stderr
    assert parse_time("12.5s") == 12_500_000_000 and parse_time("51906560ns") == 51_906_560
    negative = subprocess.run([sys.executable, "-m", "controller.cli", "inspect", str(run_dir), "--at=-1s"],
                              cwd=runs.ROOT, capture_output=True, text=True, timeout=60)  # was a table of "waiting"
    assert negative.returncode == 2 and negative.stdout == "" and negative.stderr == (
        "lockstep inspect: --at '-1s' is not valid; accepted: a virtual time >= 0 (e.g. 12.5s)\n")
    end = json.loads((run_dir / "summary.json").read_text())["virtual_time_ns"]
    late = subprocess.run([sys.executable, "-m", "controller.cli", "inspect", str(run_dir), "--at", "1000s"],
                          cwd=runs.ROOT, capture_output=True, text=True, timeout=60)
    assert late.returncode == 0 and late.stderr == (f"lockstep inspect: note: T is after the run's end "
                                                    f"({end / 1e9:.9f} s): the states are those at its end\n")


def test_trace_sample_window_and_cap_shrink_the_trace(tmp_path):
    holds = [True] * 16 + [False]
    assert trace_spec("sample", 4, holds_data=holds).keep == (0, 4, 8, 12, 16)
    names, placement = [f"w{i}" for i in range(16)] + ["ps0"], [0] * 17
    recs = [("c", v, "gradient", 1000 * k, 1000 * k + 500) for k in range(10) for v in range(17)]
    recs += [("m", v, 16, k, "grad", 10, 1000 * k, 1000 * k, 1000 * k + 100, 1000 * k + 200, 1000 * k + 300)
             for k in range(10) for v in range(16)]

    def written(**kw) -> list[dict]:
        w = TraceWriter(tmp_path / "t.json", names, placement, **kw)
        for r in recs:
            w.add(r)
        w.close()
        return json.loads((tmp_path / "t.json").read_text())

    full = written()["traceEvents"]
    sampled = written(keep=[0, 4, 8, 12, 16])["traceEvents"]
    capped = written(max_events=100)
    assert len(sampled) < 0.7 * len(full)  # ps0 is a server: all its transfers stay
    assert {e["tid"] for e in sampled if e["ph"] == "X" and e["cat"] == "compute"} == {0, 4, 8, 12, 16}
    assert capped["otherData"]["truncated"] and sum(e["ph"] != "M" for e in capped["traceEvents"]) <= 100
    window = Tracer(window_ns=(2000, 4000))
    assert [window._take(a, b) for a, b in ((0, 1999), (1500, 2500), (3000, 3500), (4001, 5000))] == [
        False, True, True, False]


@pytest.mark.parametrize("n_events", [0, 1, 5, 10_001])
def test_trace_json_is_written_byte_for_byte_as_json_dump_would(n_events):
    import io

    from agents.observe.trace import write_compact_json

    events = [{"ph": "X", "name": f"grädient {i}", "pid": i % 3, "tid": i, "ts": i * 0.001 + 1e-7,
               "dur": 12.5, "args": {"bytes": 2**40 + i, "ok": i % 2 == 0, "none": None, "tag": ["a", 1]}}
              for i in range(n_events)]
    doc = {"displayTimeUnit": "ns", "otherData": {"clock": "virtual", "truncated": False, "max_events": None},
           "traceEvents": events}
    expected = io.StringIO()
    json.dump(doc, expected, separators=(",", ":"))
    expected.write("\n")
    got = io.StringIO()
    write_compact_json(doc, got, chunk=4096)
    assert got.getvalue() == expected.getvalue()

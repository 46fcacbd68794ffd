"""Results files and the validate / calibrate / measure commands: bad input is one sentence and exit 2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.calibrate import main as calibrate_main
from controller.measure import main as measure_main
from controller.results import Point, group_repeats, load_results
from controller.validate import Row, main as validate_main, summarize, table

GOOD = {"scenario": "ring", "K": 2, "L_ms": 1.0, "B_mbit": 1000, "M_bytes": 1000000, "C_ms": 20, "median_s": 0.033}


def write(tmp_path, *recs, raw=None):
    p = tmp_path / "r.jsonl"
    p.write_text(raw if raw is not None else "".join(json.dumps(r) + "\n" for r in recs))
    return p


@pytest.mark.parametrize("rec, sentence", [
    ({k: v for k, v in GOOD.items() if k != "B_mbit"},
     "line 1: the field 'B_mbit' is missing; accepted: a number > 0."),
    ({**GOOD, "scenario": "allgather"},
     "line 1: scenario='allgather' is not valid; accepted: ring | ps_sync | ps_async | p2p | fanin."),
    ({**GOOD, "L_ms": -1.0}, "line 1: L_ms=-1.0 is not valid; accepted: a number >= 0."),
    ({**GOOD, "scenario": "ps_async"}, "line 1: the field 'updates_per_s' is missing; accepted: a number > 0."),
    ({**GOOD, "K": 2.5}, "line 1: K=2.5 is not valid; accepted: an integer >= 1."),
    ({**GOOD, "hystart_detect": 4}, "line 1: hystart_detect=4 is not valid; accepted: 0 (HyStart off), 1 (ACK train), "
                                    "2 (delay) or 3 (both, the default)."),
    ({**GOOD, "hystart_detect": 3.0}, "line 1: hystart_detect=3.0 is not valid; accepted: 0 (HyStart off), 1 (ACK "
                                      "train), 2 (delay) or 3 (both, the default)."),
    ({**GOOD, "hystart_detect": True}, "line 1: hystart_detect=True is not valid; accepted: 0 (HyStart off), 1 (ACK "
                                       "train), 2 (delay) or 3 (both, the default)."),
])
@pytest.mark.parametrize("command", [validate_main, calibrate_main])
def test_a_bad_results_file_is_one_sentence_and_exit_2(tmp_path, capsys, rec, sentence, command):
    p = write(tmp_path, rec)
    assert command([str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(sentence) and err.count("\n") == 0 and "Traceback" not in err


def test_a_results_file_that_is_not_json_lines_is_one_sentence(tmp_path, capsys):
    p = write(tmp_path, raw='{"scenario": "ring", \n')
    assert validate_main([str(p)]) == 2
    assert "line 1: not valid JSON" in capsys.readouterr().err


def test_only_a_scenario_that_does_not_exist_is_named_as_such(tmp_path, capsys):
    # it said "no measured point with scenario foo", as if the file lacked it
    assert validate_main([str(write(tmp_path, GOOD)), "--only", "ring,foo"]) == 2
    assert capsys.readouterr().err.strip() == ("lockstep validate: --only ring,foo: 'foo' is not a scenario; "
                                               "accepted: ring, ps_sync, ps_async, p2p, fanin.")


def test_a_missing_results_file_is_one_sentence(tmp_path, capsys):
    assert validate_main([str(tmp_path / "nope.jsonl")]) == 2
    assert "cannot be read" in capsys.readouterr().err


def test_a_bad_override_fails_before_any_emulation(tmp_path, capsys):
    p = write(tmp_path, GOOD)
    assert validate_main([str(p), "network=tcp", "network.efficiency=0.94"]) == 2
    assert "network.efficiency=0.94 is not valid; accepted: 1.0 with network.model=tcp" in capsys.readouterr().err
    assert validate_main([str(p), "strategy.collective=nccl"]) == 2
    assert "strategy.collective=nccl is not valid" in capsys.readouterr().err


def test_the_minimal_format_is_realrun_s_required_subset(tmp_path):
    p = write(tmp_path, GOOD, {**GOOD, "scenario": "ps_async", "median_s": 1.0, "updates_per_s": 75.5, "K": 4,
                               "p2p": {"rtt_small_s": 0.0024}, "extra": "ignored"})
    ring, ps = load_results(p)
    assert (ring.scenario, ring.K, ring.L_s, ring.B_bps, ring.M_bytes, ring.C_s, ring.measured, ring.N,
            ring.warmup) == ("ring", 2, 0.001, 1e9, 1000000, 0.02, 0.033, 10, 2)
    assert (ps.scenario, ps.measured, ps.rtt_small_s) == ("ps_async", 75.5, 0.0024)


def test_validate_emulates_the_hystart_detections_the_measured_hosts_ran(tmp_path):
    # a record may say which of CUBIC's HyStart detections its hosts ran (tcp_cubic's hystart and
    # hystart_detect module parameters); validate's tcp model then runs the same, and runs with different
    # detections are different configurations, not repeats of one
    from controller.validate import _overrides_for

    p = write(tmp_path, GOOD, {**GOOD, "hystart_detect": 0, "median_s": 0.030}, {**GOOD, "hystart_detect": 1},
              {**GOOD, "hystart_detect": 2}, {**GOOD, "hystart_detect": 3, "median_s": 0.035})
    points = load_results(p)
    assert [q.hystart for q in points] == [3, 0, 1, 2, 3]
    grouped = group_repeats(points)
    assert [(q.hystart, q.runs) for q in grouped] == [(3, (0.033, 0.035)), (0, (0.030,)), (1, (0.033,)),
                                                      (2, (0.033,))]
    settings = [[o for o in _overrides_for(q) if o.startswith("network.tcp.hystart")] for q in grouped]
    assert settings == [[], ["network.tcp.hystart_ack_train=False", "network.tcp.hystart_delay=False"],
                        ["network.tcp.hystart_ack_train=True", "network.tcp.hystart_delay=False"],
                        ["network.tcp.hystart_ack_train=False", "network.tcp.hystart_delay=True"]]
    assert [q.describe().endswith(tail) for q, tail in zip(grouped, ("C=20ms", "HyStart off", "ACK train only",
                                                                     "delay only"))] == [True] * 4
    # network=ideal reads no network.tcp key (a config that sets one is refused): the point's detections are
    # the tcp model's only; `lockstep validate ... network=ideal` (docs/benchmarks.md) still loads every point
    from controller.validate import point_config

    assert [[o for o in _overrides_for(q, ["network=ideal"]) if "network.tcp" in o] for q in grouped] == [[]] * 4
    assert [point_config(q, ["network=ideal"]).network.tcp for q in grouped] == [None] * 4  # (tcp: its spec)


def test_measure_records_the_hystart_detections_of_a_cubic_host(tmp_path):
    from pathlib import Path

    from controller.measure import hystart_detect

    sysctl, params = tmp_path / "ipv4", tmp_path / "tcp_cubic"
    sysctl.mkdir(), params.mkdir()
    for cc, on, detect, want in (("cubic", 1, 3, 3), ("cubic", 1, 2, 2), ("cubic", 0, 3, 0), ("bbr", 1, 3, None)):
        (sysctl / "tcp_congestion_control").write_text(cc + "\n")
        (params / "hystart").write_text(f"{on}\n")
        (params / "hystart_detect").write_text(f"{detect}\n")
        assert hystart_detect(sysctl, params) == want
    (params / "hystart").unlink()
    (sysctl / "tcp_congestion_control").write_text("cubic\n")
    assert hystart_detect(sysctl, params) is None  # no tcp_cubic module parameters: nothing recorded
    cc = Path("/proc/sys/net/ipv4/tcp_congestion_control")
    if cc.exists() and cc.read_text().strip() != "cubic":  # this machine, as it is
        assert hystart_detect() is None


@pytest.mark.parametrize("argv, sentence", [
    (["--workers", "0"], "--workers=0 is not valid; accepted: an integer >= 1."),
    (["--scenarios", "ring,allgather"], "--scenarios='allgather' is not valid"),
    (["--latency-ms", "-1"], "--latency-ms must be >= 0"),
    (["--timeout", "-1"], "--rate-mbit and --timeout > 0"),  # was subprocess.TimeoutExpired after the start
    (["--model-bytes", "1001"], "--model-bytes=1001 is not valid; accepted: an integer >= 4, a multiple of 4 "
                                "(float32 elements)."),  # 1001 was recorded, 1000 sent
    (["--collect", "nope.json", "--scenario", "ring", "--rate-mbit", "100"],
     "--collect nope.json: No such file or directory; accepted: rank 0's --outfile (a JSON object)."),
])
def test_measure_refuses_bad_options_in_one_sentence(tmp_path, capsys, argv, sentence):
    assert measure_main(["--out", str(tmp_path / "m.jsonl"), *argv]) == 2
    assert sentence in capsys.readouterr().err


def test_an_output_that_cannot_be_written_is_one_sentence_before_any_work(tmp_path, capsys, monkeypatch):
    # each was a traceback after the work (the emulations, the measurement), which was lost with it
    def no_work(*a, **kw):
        raise AssertionError("the work started")

    monkeypatch.setattr("controller.validate.validate_points", no_work)
    monkeypatch.setattr("controller.measure.run_scenario", no_work)
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    p = write(tmp_path, GOOD)
    cases = [
        (validate_main, [str(p), "--out", str(a_file)],
         f"lockstep validate: --out {a_file}: {a_file} is a file, not a directory; accepted: a directory for "
         "validate.png."),
        (measure_main, ["--out", str(a_file / "m.jsonl"), "--scenarios", "p2p"],
         f"lockstep measure: --out {a_file}/m.jsonl: {a_file}/m.jsonl cannot be written: {a_file} is a file, not a "
         "directory; accepted: a file to append the records to."),
        (measure_main, ["--out", str(tmp_path), "--scenarios", "p2p"],
         f"lockstep measure: --out {tmp_path}: {tmp_path} is a directory, not a file; accepted: a file to append "
         "the records to."),
        (calibrate_main, [str(p), "--no-validate", "--out", str(a_file / "x.yaml")],
         f"lockstep calibrate: --out {a_file}/x.yaml: {a_file}/x.yaml cannot be written: {a_file} is a file, not "
         "a directory; accepted: a file to write the preset to."),
    ]
    if Path("/proc/self").is_dir():  # a file system where nothing can be created, even by root
        cases.append((measure_main, ["--out", "/proc/nope/m.jsonl", "--scenarios", "p2p"],
                      "lockstep measure: --out /proc/nope/m.jsonl: /proc/nope/m.jsonl cannot be written: No such "
                      "file or directory (/proc/nope); accepted: a file to append the records to."))
    for command, argv, sentence in cases:
        assert command(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err == sentence
    assert a_file.read_text() == "" and not list(tmp_path.glob("*.yaml"))


def test_a_configuration_measured_several_times_is_compared_by_its_median(tmp_path, capsys):
    small = {"scenario": "ring", "K": 2, "L_ms": 1.0, "B_mbit": 1000, "M_bytes": 1000, "C_ms": 1, "N": 3,
             "warmup": 1}
    p = write(tmp_path, {**small, "median_s": 0.0040}, {**small, "median_s": 0.0050, "L_ms": 2.0},
              {**small, "median_s": 0.0046}, {**small, "median_s": 0.0044})
    grouped = group_repeats(load_results(p))
    assert [(g.L_s, g.measured, g.runs, g.line) for g in grouped] == [(0.001, 0.0044, (0.004, 0.0046, 0.0044), 1),
                                                                       (0.002, 0.005, (0.005,), 2)]
    assert validate_main([str(p), "--json", "--out", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["L_ms"], r["measured"], r["runs"]) for r in rows] == [(1.0, 0.0044, [0.004, 0.0046, 0.0044]),
                                                                     (2.0, 0.005, [0.005])]
    # the emulation is deterministic: the repeats share one, compared with their median
    assert rows[0]["error"] == rows[0]["emulated"] / 0.0044 - 1
    assert validate_main([str(p), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "measured 4.4 ms (median of 3 runs, 4.0–4.6)" in out.err
    assert validate_main([str(p), "--each", "--json", "--out", str(tmp_path)]) == 0
    each = json.loads(capsys.readouterr().out)["rows"]
    assert [r["measured"] for r in each] == [0.004, 0.005, 0.0046, 0.0044]
    assert len({r["emulated"] for r in each if r["L_ms"] == 1.0}) == 1


def test_seeds_emulate_each_point_with_several_seeds_and_compare_their_median(tmp_path, capsys):
    small = {"scenario": "ring", "K": 2, "L_ms": 1.0, "B_mbit": 1000, "M_bytes": 1000, "C_ms": 1, "N": 3,
             "warmup": 1, "median_s": 0.0044}
    p = write(tmp_path, small)
    # validate's hosts have keyed random parts (start spread, timer jitter): each seed is one draw
    assert validate_main([str(p), "seed=5", "--seeds", "3", "--json", "--out", str(tmp_path)]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    runs = row["emulated_runs"]
    assert len(runs) == 3 and len(set(runs)) == 3 and row["emulated"] == sorted(runs)[1]
    for i, seed in enumerate((5, 6, 7)):  # the seeds count up from the run's own
        assert validate_main([str(p), f"seed={seed}", "--json", "--out", str(tmp_path)]) == 0
        assert json.loads(capsys.readouterr().out)["rows"][0]["emulated_runs"] == [runs[i]]
    assert validate_main([str(p), "--seeds", "3", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "(median of 3 seeds, " in out.err and "one seed per point" not in out.out
    assert validate_main([str(p), "--out", str(tmp_path)]) == 0
    assert "one seed per point: where the emulation has keyed random parts" in capsys.readouterr().out
    assert validate_main([str(p), "--seeds", "0", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "lockstep validate: --seeds=0 is not valid; accepted: an integer >= 1."


def test_jobs_run_the_emulations_in_processes_and_give_the_same_rows(tmp_path, capsys):
    small = {"scenario": "ring", "K": 2, "L_ms": 1.0, "B_mbit": 1000, "M_bytes": 1000, "C_ms": 1, "N": 3,
             "warmup": 1}
    p = write(tmp_path, {**small, "median_s": 0.0044}, {**small, "L_ms": 2.0, "median_s": 0.0064},
              {**small, "scenario": "ps_async", "updates_per_s": 300.0})
    reports = []
    for jobs in ("1", "2"):
        assert validate_main([str(p), "--seeds", "2", "--jobs", jobs, "--json", "--out", str(tmp_path)]) == 0
        reports.append(json.loads(capsys.readouterr().out)["rows"])
    assert reports[0] == reports[1] and [r["scenario"] for r in reports[1]] == ["ring", "ring", "ps_async"]
    assert validate_main([str(p), "--jobs", "0", "--out", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "lockstep validate: --jobs=0 is not valid; accepted: an integer >= 1."


def test_validate_emulates_the_late_asynchronous_ps():
    # realrun's asynchronous PS fills K send buffers of M bytes and reads its counters before its first send
    # (docs/engine.md, "What validate emulates"): 1 ms + K M / 0.9 GB/s, here 1 ms + 2 MB / 0.9 GB/s; the
    # other scenarios start their ranks as they leave the barrier (the test below)
    from controller.results import Point
    from controller.validate import _overrides_for

    def point(scenario):
        return Point(scenario, 2, 0.01, 1e9, 1_000_000, 0.02, 0.2)

    assert f"strategy.start_after={1e-3 + 2e6 / 0.9e9!r}" in _overrides_for(point("ps_async"))
    for scenario in ("ring", "ps_sync"):
        assert not any(o.startswith("strategy.start_after=") for o in _overrides_for(point(scenario)))
    # and it takes 0.3 ms + M / 1.9 GB/s per update, one at a time, before it answers (the waiter thread's
    # hand-off, the gradient applied, the send buffer refilled, the isend: benchmarks/data/lab/
    # ps_async-updates.jsonl, 0.56 ms at 0.3 MB, 0.83-0.87 ms at 1 MB, 5.6 ms at 10 MB); the benchmarks'
    # other programs have no optimizer step
    assert f"compute.update={0.3e-3 + 1e6 / 1.9e9!r}" in _overrides_for(point("ps_async"))
    for scenario in ("ring", "ps_sync"):
        assert "compute.update=0" in _overrides_for(point(scenario))


def test_validate_starts_each_ps_rank_when_it_leaves_gloo_s_start_up_barrier():
    # K = 4, L = 10 ms: five ranks, one-way time l = L + the tcp model's host latency (257 us); rank 3 (worker
    # w2) left init_process_group last and leaves the barrier after the others (measured: 9.3-9.4 ms after
    # the PS's first isend, benchmarks/data/lab/starts.jsonl); a user's offsets win. Every rank then fills
    # its 1 MB tensor (S = 1 MB / 2.3 GB/s = 434 783 ns) on the testbed's two cores: the four that leave
    # together run two at a time, in the keyed order of seed 0 (ranks 1 and 0 first), and rank 3's last
    # message comes from rank 4, which sends it when it runs, S later: l + S after the first two are ready
    from controller.results import Point
    from controller.validate import _gloo_offsets

    point = Point("ps_sync", 4, 0.01, 1e8, 1_000_000, 0.02, 0.2)
    assert _gloo_offsets(point, ["network=tcp"]) == [
        "compute.start_offsets={ps0: 0ns, w0: 0ns, w1: 434783ns, w2: 10691783ns, w3: 434783ns}"]
    assert _gloo_offsets(point, ["network=tcp", "compute.start_offsets={w0: 1ms}"]) == []
    # the ring's ranks are its members: with two, rank 0 leaves init_process_group last and so the barrier
    # one one-way time after rank 1 (its captures: 10.8 ms at L = 10 ms, 0.84 ms at L = 1 ms); with four,
    # rank 2 (measured 9.5-10.5 ms after the others at L = 10 ms), and rank 3 waits S for a core
    assert _gloo_offsets(Point("ring", 2, 0.01, 1e9, 1_000_000, 0.02, 0.2), ["network=tcp"]) == [
        "compute.start_offsets={w0: 10257000ns, w1: 0ns}"]
    assert _gloo_offsets(Point("ring", 4, 0.01, 1e9, 1_000_000, 0.02, 0.2), ["network=tcp"]) == [
        "compute.start_offsets={w0: 0ns, w1: 0ns, w2: 10257000ns, w3: 434783ns}"]
    # K = 2, 2 ms, 30 MB: the PS and rank 2 leave the barrier together and fill 30 MB for 13.04 ms on both
    # cores; rank 1, whose last message came 2.257 ms later, runs only then (measured: its first receive
    # 12.0-13.5 ms after the others', benchmarks/data/lab/starts-cores.jsonl)
    assert _gloo_offsets(Point("ps_sync", 2, 0.002, 2.5e9, 30_000_000, 0.02, 0.4), ["network=tcp"]) == [
        "compute.start_offsets={ps0: 0ns, w0: 13043478ns, w1: 0ns}"]
    assert _gloo_offsets(Point("p2p", 2, 0.01, 1e9, 1_000_000, 0.02, 0.2), ["network=tcp"]) == []


def test_the_asynchronous_ps_rate_is_counted_as_realrun_counts_it():
    # realrun.py and `lockstep measure`: every worker runs warmup + N steps; the rate is taken over the updates
    # of worker steps >= warmup, from the first of them to the first worker's last update
    from controller.results import Point
    from controller.validate import _async_rate

    p = Point("ps_async", 2, 0.001, 1e9, 1000, 0.001, 1.0, N=2, warmup=1)  # 3 steps per worker
    even = [(100, "w0"), (150, "w1"), (200, "w0"), (260, "w1"), (300, "w0"), (380, "w1"), (400, "w0")]
    # counted: 200 (w0 step 1), 260 (w1 step 1), 300 (w0 step 2, its last: the window ends); 380 comes after,
    # 400 is a fourth step that the measured program never takes
    assert _async_rate(p, even) == 2 / 100e-9
    # a worker that falls behind: its step 1 at 350 comes after the window and is not counted
    assert _async_rate(p, [(100, "w0"), (150, "w1"), (200, "w0"), (300, "w0"), (350, "w1")]) == 1 / 100e-9
    # steps before warmup are not counted even inside the window: w1's step 0 at 250
    assert _async_rate(p, [(100, "w0"), (200, "w0"), (250, "w1"), (300, "w0")]) == 1 / 100e-9
    # a worker past its steps before another began: those steps do not exist in the measured program
    assert _async_rate(p, [(100, "w0"), (200, "w0"), (300, "w0"), (400, "w0"), (500, "w1")]) == 1 / 100e-9
    with pytest.raises(RuntimeError, match="no worker of the emulation finished its 3 steps"):
        _async_rate(p, [(100, "w0"), (200, "w0"), (250, "w1")])


def test_validate_counts_the_emulated_asynchronous_ps_from_the_state_log(monkeypatch):
    # the emulation's updates, with the worker each applied, reach the count above: all K (N + warmup) of them
    import controller.validate as V
    from controller.results import Point

    seen = []
    real = V._async_rate
    monkeypatch.setattr(V, "_async_rate", lambda p, updates: seen.append(updates) or real(p, updates))
    p = Point("ps_async", 3, 0.001, 1e9, 100_000, 0.002, 100.0, N=3, warmup=1)
    value = V.emulate(p, [])
    [updates] = seen
    assert len(updates) == 3 * 4 and {w for _, w in updates} == {"w0", "w1", "w2"}
    assert [t for t, _ in updates] == sorted(t for t, _ in updates) and value == real(p, updates)


def test_the_summary_says_where_the_emulation_lies_within_the_measured_runs():
    ring = dict(scenario="ring", K=2, L_s=0.001, B_bps=1e9, M_bytes=1000, C_s=0.001)
    rows = [Row(Point(**ring, measured=0.0044, runs=(0.004, 0.0046, 0.0044)), 0.0046),  # at the edge: within
            Row(Point(**ring, measured=0.0044, runs=(0.004, 0.0046, 0.0044)), 0.00461),  # above the slowest run
            Row(Point(**ring, measured=0.0050, runs=(0.0050,)), 0.0040),  # measured once: not counted
            Row(Point(**{**ring, "scenario": "ps_sync"}, measured=0.0050), 0.0050)]
    s = summarize(rows)
    assert (s["ring"]["points"], s["ring"]["repeated"], s["ring"]["within_runs"]) == (3, 2, 1)
    assert (s["ps_sync"]["repeated"], s["ps_sync"]["within_runs"]) == (0, 0)
    text = table(rows).splitlines()
    assert text[-2].endswith("(mean signed -3.6 %); within the measured runs' range at 1 of 2 points measured "
                             "several times")
    assert text[-1].endswith("(mean signed +0.0 %)")


def test_an_emulations_config_is_the_one_load_gives_for_every_seed():
    # validate composes a point's config once for all its seeds and sets the seed and its start offsets on a
    # copy (a composition took 0.3 s of each emulation's 0.5-5 s); the RunConfig must be load()'s, bit for bit
    from controller.config import load
    from controller.results import Point
    from controller.validate import _applicable, _gloo_offsets, _overrides_for, point_config

    user = ["network=tcp", "strategy.collective=gloo"]
    for scenario in ("ring", "ps_sync", "ps_async"):
        p = Point(scenario, 3, 0.002, 5e8, 3_000_000, 0.02, 0.3)
        for seed in (0, 7):
            ov = [*user, f"seed={seed}"]
            mine = _applicable(p, ov)
            expected = load(_overrides_for(p, mine) + _gloo_offsets(p, mine) + mine)
            assert point_config(p, ov) == expected
            assert point_config(p, ov).raw == expected.raw
    # and the offsets differ by seed, so a stale copy would show
    p = Point("ps_sync", 3, 0.002, 5e8, 3_000_000, 0.02, 0.3)
    assert point_config(p, [*user, "seed=0"]).raw != point_config(p, [*user, "seed=7"]).raw

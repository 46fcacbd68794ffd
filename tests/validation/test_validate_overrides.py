"""validate's and calibrate's overrides: they may come after the options, and none may replace a point's own
measured settings (docs/engine.md, "lockstep validate")."""
from __future__ import annotations

import json

import pytest

from controller.calibrate import main as calibrate_main
from controller.validate import main as validate_main

SMALL = {"scenario": "ring", "K": 2, "L_ms": 1.0, "B_mbit": 1000, "M_bytes": 1000, "C_ms": 1, "N": 3, "warmup": 1,
         "median_s": 0.0044}


def write(tmp_path, *recs):
    p = tmp_path / "r.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return p


def test_validate_applies_an_override_given_after_the_options(tmp_path, capsys):
    # docs/benchmarks.md: lockstep validate F network=tcp strategy.collective=gloo --seeds 3 --jobs 2
    # [network.tcp.delayed_ack=true]; argparse took an override after an option for an unrecognized argument
    p = write(tmp_path, SMALL)
    opts = ["--only", "ring", "--seeds", "1", "--json", "--out", str(tmp_path)]
    reports = {}
    for name, argv in (("none", [str(p), *opts]), ("before", [str(p), "seed=5", *opts]),
                       ("after", [str(p), *opts, "seed=5"]), ("between", [str(p), "--only", "ring", "seed=5",
                                                                           *opts[2:]])):
        assert validate_main(argv) == 0, name
        reports[name] = json.loads(capsys.readouterr().out)
    assert reports["after"]["overrides"] == reports["between"]["overrides"] == ["seed=5"]
    assert reports["after"] == reports["before"] == reports["between"]
    assert reports["after"]["rows"] != reports["none"]["rows"]  # applied: the seed draws another start spread


def test_calibrate_applies_an_override_given_after_the_options(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # validate.png
    p = write(tmp_path, SMALL)
    out = str(tmp_path / "fit.yaml")
    tables = {}
    # the table rounds: a 50 % timer jitter moves this point's emulated time by 0.2 ms, where another seed does not
    for name, argv in (("none", [str(p), "--out", out]), ("before", [str(p), "compute.jitter=0.5", "--out", out]),
                       ("after", [str(p), "--out", out, "compute.jitter=0.5"])):
        assert calibrate_main(argv) == 0, name
        tables[name] = capsys.readouterr().out
    assert tables["after"] == tables["before"] != tables["none"]


@pytest.mark.parametrize("override, label", [
    ("workers=8", "K (workers)"), ("network.latency=50ms", "L (network.latency)"),
    ("network.bandwidth=1GB", "B (network.bandwidth)"), ("model.bytes=10MB", "M (model.bytes)"),
    ("model=mlp", "M (model)"), ("compute.gradient=5ms", "C (compute.gradient)"),
    ("compute=profiled", "C (compute)"), ("strategy=ps_sync", "scenario (strategy)"),
    ("strategy.kind=fanin", "scenario (strategy.kind)"), ("stop.updates=100", "steps (stop.updates)"),
    ("+workers=8", "K (workers)"), ("++network.latency=50ms", "L (network.latency)"),
])
@pytest.mark.parametrize("where", ["before", "after"])
def test_validate_refuses_an_override_of_a_point_s_own_settings(tmp_path, capsys, monkeypatch, override, label,
                                                                  where):
    # it emulated K = 8 and showed the measured K = 4 in every row
    import controller.validate as v

    def no_emulation(*a, **k):
        raise AssertionError("emulated")

    monkeypatch.setattr(v, "validate_points", no_emulation)
    p = write(tmp_path, SMALL)
    argv = ([str(p), override, "--only", "ring"] if where == "before" else [str(p), "--only", "ring", override])
    assert validate_main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"lockstep validate: {override} is not valid: each point is emulated with its own measured "
                   f"scenario, K, L, B, M, C and steps, and this key sets its {label}; accepted: overrides of "
                   f"other keys (e.g. network.tcp.delayed_ack=true).")
    assert not (tmp_path / "validate.png").exists()


def test_calibrate_refuses_such_an_override_before_fitting(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = write(tmp_path, SMALL)
    out = tmp_path / "fit.yaml"
    assert calibrate_main([str(p), "--out", str(out), "workers=8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("lockstep calibrate: workers=8 is not valid: each point is emulated with its own "
                          "measured scenario") and err.count("\n") == 0
    assert not out.exists()


@pytest.mark.parametrize("override", ["network.tcp.delayed_ack=true", "compute.start_spread=0ms",
                                      "compute.jitter=0", "compute.aggregate=1ms", "compute.update=0",
                                      "network=ideal", "strategy.collective=gloo", "seed=3"])
def test_validate_still_takes_overrides_of_the_hosts_and_the_transport(tmp_path, capsys, override):
    p = write(tmp_path, SMALL)
    assert validate_main([str(p), "--only", "ring", override, "--json", "--out", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["overrides"] == [override]

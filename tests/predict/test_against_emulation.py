"""`lockstep predict` agrees with the emulation to the nanosecond where its model is exact, and `predict=true`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from controller.config import load
from controller.predict import inputs_of, predict
from tests.helpers import FAST, rows, run

PS_SYNC = ["strategy=ps_sync", "stop.updates=3", "network.latency=0.003", "network.bandwidth=25e6",
           "compute.gradient=0.015", "compute.update=0.002", "compute.aggregate=0.001"]


def predicted(overrides, name):
    result = predict(inputs_of(load(FAST + overrides, check_data=False)))
    return next(m for m in result["models"] if m["model"] == name), result


@pytest.mark.parametrize("disc,form", [("fair", "sync_ps_eq7_ps"), ("fifo", "sync_ps_eq8_fcfs"),
                                       ("unlimited", "sync_ps_uncontended"),
                                       ("unlimited network.ingress=fifo", "sync_ps_eq8_fcfs")])
def test_sync_ps_prediction_is_the_emulated_round_to_the_nanosecond(tmp_path, disc, form):
    ov = [*PS_SYNC, "workers=3", *f"network.discipline={disc}".split()]
    m, result = predicted(ov, form)
    assert result["selected"] == form
    run(tmp_path, ov)
    times = [int(r["virtual_time_ns"]) for r in rows(tmp_path / "metrics.csv")]
    step = round(m["step_s"] * 1e9)
    assert times == [step, 2 * step, 3 * step]
    if disc in ("fair", "fifo"):  # Algorithm 2.1 on the same trace
        fine = next(x for x in result["models"] if x["model"] == f"finegrained_{'ps' if disc == 'fair' else 'fcfs'}")
        assert round(fine["step_s"] * 1e9) == step


def test_ring_prediction_is_the_emulated_step_to_the_nanosecond(tmp_path):
    # K = 5 divides the MLP's 159 010 parameters: every chunk is M/K = 127 208 B, 1 s at this rate
    ov = ["strategy=ring_allreduce", "workers=5", "stop.updates=3", "network.bandwidth=127208",
          "network.latency=0.001", "network.discipline=fifo", "compute.gradient=0.01", "compute.update=0.001",
          "compute.aggregate=0"]
    m, result = predicted(ov, "ring_eq11")
    fine = next(x for x in result["models"] if x["model"] == "finegrained_all_reduce")
    run(tmp_path, ov)
    times = [int(r["virtual_time_ns"]) for r in rows(tmp_path / "metrics.csv")]
    assert times == [round(i * m["step_s"] * 1e9) for i in (1, 2, 3)]
    assert round(fine["step_s"] * 1e9) == round(m["step_s"] * 1e9)


def test_algorithm_2_1_predicts_every_async_update_of_a_fifo_network(tmp_path):
    # FCFS links and one gradient message per step: the emulation's async PS is Algorithm 2.1's, update by update
    from controller.predict import finegrained as fg
    from controller.predict import _trace

    ov = ["strategy=ps_async", "workers=3", "stop.updates=12", "network.discipline=fifo",
          "network.bandwidth=1e7", "network.latency=0.002", "compute.gradient=0.02", "compute.update=0.003"]
    inp = inputs_of(load(FAST + ov, check_data=False))
    trace, workers = _trace(inp, "fcfs", "async")
    sim = fg.simulate(trace, workers, steps=4)
    run(tmp_path, ov)
    emulated = [int(r["virtual_time_ns"]) for r in rows(tmp_path / "metrics.csv")]
    assert [round(t) for t in sim.update_times_ns[:12]] == emulated


def test_predict_true_writes_the_predictions_beside_the_emulated_throughput(tmp_path):
    res = run(tmp_path, [*PS_SYNC, "workers=2", "predict=true"])
    pred = json.loads((tmp_path / "summary.json").read_text())["predictions"]
    assert res.summary["predictions"] == pred
    sel = next(m for m in pred["models"] if m["model"] == pred["selected"])
    assert sel["model"] == "sync_ps_eq7_ps"
    assert sel["samples_per_s"] == pytest.approx(res.summary["throughput_samples_per_s"], rel=1e-9)
    assert abs(sel["error"]) < 1e-9
    assert pred["inputs"]["model_bytes"] == res.summary["model_bytes"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "controller.cli", "predict", *args], capture_output=True, text=True,
                          timeout=300)


def test_predict_command_prints_json_with_its_inputs():
    p = _cli("--json", "model=mlp", "compute=constant", "strategy=ps_sync", "workers=4")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["inputs"]["workers"] == 4 and out["inputs"]["model_bytes"] == 636040
    assert out["selected"] == "sync_ps_eq7_ps"
    assert {m["model"] for m in out["models"]} >= {"sync_ps_eq7_ps", "sync_ps_eq8_fcfs", "finegrained_ps"}


def test_predict_command_with_a_bad_value_says_one_sentence_and_exits_2():
    p = _cli("model=mlp", "predictor.rho_threshold=2")
    assert p.returncode == 2
    assert "predictor.rho_threshold=2 is not valid; accepted: a number >= 0 and <= 1." in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("over", [["strategy=gossip"], ["strategy=ps_async", "strategy.shards=2"]], ids=" ".join)
@pytest.mark.parametrize("fmt", [[], ["--json"]], ids=["table", "json"])
def test_predict_command_for_a_strategy_no_model_describes_says_so_and_exits_2(over, fmt):
    p = _cli(*fmt, "model=mlp", "compute=constant", "workers=4", *over)
    assert p.returncode == 2 and p.stdout == ""
    name = "gossip" if over == ["strategy=gossip"] else "ps_async (shards=2)"
    assert p.stderr == (f"lockstep predict: no model of the throughput-prediction paper applies to strategy {name!r} "
                        "(accepted: ps_async, ps_sync, ring_allreduce with one PS shard)\n")


def test_network_tcp_is_predicted_at_its_goodput_with_the_host_latency_and_a_note():
    ideal = inputs_of(load(FAST + ["strategy=ring_allreduce", "workers=4"], check_data=False))
    tcp = inputs_of(load(FAST + ["strategy=ring_allreduce", "workers=4", "network=tcp"], check_data=False))
    assert tcp.bandwidth_ps_out == pytest.approx(ideal.bandwidth_ps_out * 1448 / 1538, rel=1e-12)
    assert tcp.latency_s == pytest.approx(ideal.latency_s + 257e-6, rel=1e-12)
    assert ideal.notes == () and tcp.notes[0].startswith("network.model=tcp: links at the goodput (94.15% ")


def test_faults_are_named_in_a_note_as_not_modelled():
    faults = "faults=[{kind:straggler,workers:[w1],factor:4},{kind:loss,probability:0.1}]"
    inp = inputs_of(load(FAST + ["strategy=ps_sync", "workers=4", faults], check_data=False))
    assert inp.notes == ("faults (loss, straggler): not modelled; the prediction is of the run without them",)


def test_lockstep_plot_draws_the_predictions_beside_a_sweep(tmp_path):
    from controller.plotcli import main, predicted_curves, prediction_of, sweep_points

    for k in (1, 2):
        run(tmp_path / "sweep" / str(k), [*PS_SYNC, f"workers={k}", "predict=true"])
    (infos,) = sweep_points(tmp_path / "sweep").values()
    assert [name for name, _ in predicted_curves(infos)] == ["sync_ps_eq7_ps", "finegrained_ps"]
    for i in infos:
        assert prediction_of(i, "sync_ps_eq7_ps") == pytest.approx(i["summary"]["throughput_samples_per_s"])
    assert main([str(tmp_path / "sweep")]) == 0
    assert (tmp_path / "sweep" / "throughput.png").stat().st_size > 10_000


@pytest.mark.parametrize("overrides, form", [
    # the K−1 chunk additions of the reduce-scatter were left out of the plot's Eq. 11 (31 % short here)
    (["strategy=ring_allreduce", "workers=5", "compute.aggregate=0.002"], "eq11_ring"),  # (K = 5 divides M)
    (["strategy=ps_sync", "workers=4", "network.discipline=unlimited"], "uncontended"),
    # the plot drew Eq. 7 for any fair egress: with an unlimited ingress the round is Eq. 8's (predict's choice)
    (["strategy=ps_sync", "workers=4", "network.egress=fair", "network.ingress=unlimited"], "eq8_fcfs")])
def test_the_plots_closed_forms_are_the_emulated_step(tmp_path, overrides, form):
    from controller.plotcli import closed_form_step, forms_of

    run(tmp_path, [*overrides, "stop.updates=3", "network.latency=0.001", "compute.gradient=0.01",
                   "compute.update=0.001"])
    info = {name: json.loads((tmp_path / f"{name}.json").read_text()) for name in ("plan", "summary")}
    assert forms_of(info["summary"]["strategy"], info["plan"]["network"]["egress"], info)[0] == form
    times = [int(r["virtual_time_ns"]) for r in rows(tmp_path / "metrics.csv")]
    assert round(closed_form_step(info, form) * 1e9) == times[0] == times[1] - times[0]

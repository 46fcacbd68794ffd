"""`lockstep plot SWEEP` on `network=tcp`: the line says tcp, not the ideal network's discipline, and its closed
forms are the ones `lockstep predict` gives for tcp (at the transport's goodput, with the host latency)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from matplotlib.figure import Figure

from controller.config import load
from controller.plan import make_plan
from controller.plotcli import closed_form_step, plot_sweep, sweep_points
from controller.predict import inputs_of, predict
from tests.helpers import FAST

PS_SYNC = [o for o in FAST if not o.startswith("network=")] + ["strategy=ps_sync", "compute.gradient=0.01",
                                                                "compute.update=0.001"]


def _sweep(d: Path, network: str, workers=(2, 4)) -> dict[int, dict]:
    """A sweep directory as --multirun leaves it (plan.json as the run writes it); predict's answer per K."""
    answers = {}
    for n, k in enumerate(workers):
        rc = load([*PS_SYNC, f"network={network}", f"workers={k}"], check_data=False)
        inp = inputs_of(rc)
        answers[k] = {m["model"]: m for m in predict(inp)["models"]}
        job = d / str(n)
        (job / ".hydra").mkdir(parents=True)
        (job / ".hydra" / "overrides.yaml").write_text(f"- network={network}\n- workers={k}\n")
        (job / "plan.json").write_text(make_plan(rc, run_id=f"r{n}").to_json())
        (job / "summary.json").write_text(json.dumps({
            "complete": True, "strategy": "ps_sync", "workers": k, "model_bytes": inp.model_bytes,
            "throughput_samples_per_s": 1000.0 + k}))
    return answers


def _labels(monkeypatch, sweep: Path, out: Path) -> list[str]:
    figures = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **kw: figures.append(self))
    plot_sweep(sweep, out)
    return [line.get_label() for line in figures[0].axes[0].get_lines()]


def test_a_tcp_sweeps_line_is_named_tcp_and_draws_predicts_closed_forms_for_tcp(tmp_path, monkeypatch):
    # it was "ps_sync, fair" with Eq. 7 and 9 at the line rate and the bare latency: 5.6 % above predict's Eq. 7
    answers = _sweep(tmp_path / "tcp", "tcp")
    groups = sweep_points(tmp_path / "tcp")
    assert list(groups) == [("ps_sync", "tcp")]
    for info in groups[("ps_sync", "tcp")]:
        k = info["summary"]["workers"]
        for form in ("eq7_ps", "eq9_hybrid"):
            assert closed_form_step(info, form) == pytest.approx(answers[k][f"sync_ps_{form}"]["step_s"], rel=1e-12)
    assert closed_form_step(groups[("ps_sync", "tcp")][0], "eq7_ps") == pytest.approx(
        0.01 + 0.001 + 2 * 636_040 * 2 / (125e6 * 1448 / 1538) + 2 * (100e-6 + 257e-6), rel=1e-12)
    assert _labels(monkeypatch, tmp_path / "tcp", tmp_path / "t.png") == [
        "ps_sync, tcp (emulated)", "ps_sync, tcp: Eq. 7 (PS sharing) at tcp's goodput",
        "ps_sync, tcp: Eq. 9 (hybrid) at tcp's goodput"]


def test_an_ideal_sweeps_line_keeps_its_discipline_and_exact_forms(tmp_path, monkeypatch):
    answers = _sweep(tmp_path / "ideal", "ideal")
    groups = sweep_points(tmp_path / "ideal")
    assert list(groups) == [("ps_sync", "fair")]
    for info in groups[("ps_sync", "fair")]:
        k = info["summary"]["workers"]
        assert closed_form_step(info, "eq7_ps") == pytest.approx(answers[k]["sync_ps_eq7_ps"]["step_s"], rel=1e-12)
    assert _labels(monkeypatch, tmp_path / "ideal", tmp_path / "i.png") == [
        "ps_sync, fair (emulated)", "ps_sync, fair: Eq. 7 (PS sharing)", "ps_sync, fair: Eq. 9 (hybrid)"]


def test_a_plan_whose_tcp_spec_is_not_one_gets_no_closed_form(tmp_path):
    _sweep(tmp_path / "bad", "tcp", workers=(2,))
    plan_path = tmp_path / "bad" / "0" / "plan.json"
    plan = json.loads(plan_path.read_text())
    plan["network"]["tcp"]["mtu"] = 10  # no payload left after the headers
    plan_path.write_text(json.dumps(plan))
    (info,) = sweep_points(tmp_path / "bad")[("ps_sync", "tcp")]
    assert closed_form_step(info, "eq7_ps") is None

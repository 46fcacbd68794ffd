"""`lockstep plot RUN RUN ...`: each run keeps one colour in all four panels, and each row has a legend."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.pyplot as plt
from matplotlib.colors import to_hex

from controller.plotcli import plot_runs, runs_figure


def _run(d: Path, strategy: str, updates: int, evals: list[tuple[float, int, float]]) -> Path:
    """A run directory as lockstep leaves it: metrics.csv, eval.csv (maybe only its header), summary.json."""
    d.mkdir()
    (d / "metrics.csv").write_text("iteration,virtual_time_s,loss\n" + "".join(
        f"{i},{0.1 * i},{2.3 - 0.1 * i}\n" for i in range(1, updates + 1)))
    (d / "eval.csv").write_text("iteration,virtual_time_s,test_accuracy\n" + "".join(
        f"{i},{t},{a}\n" for t, i, a in evals))
    (d / "summary.json").write_text(json.dumps({"strategy": strategy, "workers": 4}))
    return d


def _panels(fig) -> dict[str, list[tuple[str, str]]]:
    """Each panel's lines as (label, colour), and its legend's entries as (label, colour) under 'legend ...'."""
    (lt, li), (at, ai) = fig.axes[0:2], fig.axes[2:4]
    out = {}
    for name, ax in (("loss/time", lt), ("loss/updates", li), ("acc/time", at), ("acc/updates", ai)):
        out[name] = [(line.get_label(), to_hex(line.get_color())) for line in ax.get_lines()]
        legend = ax.get_legend()
        out[f"legend {name}"] = None if legend is None else [
            (text.get_text(), to_hex(handle.get_color())) for text, handle in zip(legend.get_texts(),
                                                                                 legend.legend_handles)]
    return out


def test_a_run_without_evaluations_leaves_the_next_runs_accuracy_in_that_runs_own_colour(tmp_path):
    # run b's accuracy took run a's colour (the accuracy panels had a colour cycle of their own), without a legend
    a = _run(tmp_path / "a", "ps_async", 3, [])  # stopped before its first evaluation
    b = _run(tmp_path / "b", "ps_sync", 4, [(0.2, 2, 0.5), (0.4, 4, 0.75)])
    fig = runs_figure([a, b])
    c0, c1 = (to_hex(c) for c in plt.rcParams["axes.prop_cycle"].by_key()["color"][:2])
    la, lb = "a: ps_async K=4", "b: ps_sync K=4"
    assert _panels(fig) == {
        "loss/time": [(la, c0), (lb, c1)], "loss/updates": [(la, c0), (lb, c1)],
        "acc/time": [(lb, c1)], "acc/updates": [(lb, c1)],
        "legend loss/time": None, "legend loss/updates": [(la, c0), (lb, c1)],
        "legend acc/time": None, "legend acc/updates": [(lb, c1)]}
    assert [list(line.get_ydata()) for line in fig.axes[3].get_lines()] == [[50.0, 75.0]]
    plt.close(fig)
    out = plot_runs([a, b], tmp_path / "runs.png")
    assert out.read_bytes().startswith(b"\x89PNG")


def test_a_run_with_no_update_yet_keeps_its_colour_for_its_evaluations(tmp_path, capsys):
    a = _run(tmp_path / "a", "ps_async", 0, [(0.0, 0, 0.1)])  # its evaluation at update 0, nothing after
    b = _run(tmp_path / "b", "ps_sync", 2, [(0.2, 2, 0.5)])
    fig = runs_figure([a, b])
    c0, c1 = (to_hex(c) for c in plt.rcParams["axes.prop_cycle"].by_key()["color"][:2])
    la, lb = "a: ps_async K=4", "b: ps_sync K=4"
    panels = _panels(fig)
    assert (panels["loss/updates"], panels["acc/updates"], panels["legend acc/updates"]) == (
        [(lb, c1)], [(la, c0), (lb, c1)], [(la, c0), (lb, c1)])
    assert capsys.readouterr().err == (f"lockstep plot: note: 1 run(s) with no update in metrics.csv yet, not "
                                       f"drawn: {a}\n")
    plt.close(fig)

"""Plots of runs: loss vs virtual time and vs iterations (the 2019 paper's figures 8-13)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from controller.outputs import read_csv  # noqa: E402

__all__ = ["plot_loss", "plot_runs"]


def _series(run: Path) -> tuple[list[float], list[int], list[float]]:
    rows = read_csv(run / "metrics.csv")
    return ([float(r["virtual_time_s"]) for r in rows], [int(r["iteration"]) for r in rows],
            [float(r["loss"]) for r in rows])


def _moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean over ``window`` points (the raw curve of a noisy loss is drawn faintly behind)."""
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_loss(run: Path, out: Path | None = None) -> Path:
    """``loss.png`` of one run: training loss against virtual seconds and against updates."""
    return plot_runs([run], out or Path(run) / "loss.png", labels=[Path(run).name])


def plot_runs(runs: list[Path], out: Path, labels: list[str] | None = None) -> Path:
    fig, (ax_t, ax_i) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for i, run in enumerate(runs):
        t, it, loss = _series(Path(run))
        label = labels[i] if labels else Path(run).name
        smooth = _moving_average(loss, max(1, len(loss) // 100))
        for ax, x in ((ax_t, t), (ax_i, it)):
            line, = ax.plot(x, loss, linewidth=0.6, alpha=0.25)
            ax.plot(x, smooth, color=line.get_color(), linewidth=1.5, label=label)
    ax_t.set_xlabel("virtual time [s]")
    ax_i.set_xlabel("global updates")
    for ax in (ax_t, ax_i):
        ax.set_ylabel("training loss")
        ax.grid(alpha=0.3)
    ax_i.legend(fontsize="small")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)

"""``lockstep plot RUN_OR_SWEEP_DIR... [-o out.png]``: the figures of DESIGN §8.

* Run directories (with ``metrics.csv``): training loss and test accuracy
  against virtual time and against global updates, every run on one figure.
* A sweep directory (subdirectories with ``summary.json``, as ``--multirun``
  writes): throughput against workers, one curve per (strategy, NIC
  discipline of the ideal network, or ``tcp``); where the runs used ``compute=constant`` the closed forms of
  the throughput-prediction paper are drawn beside the emulated curves (Eq. 7 and
  8 for the synchronous PS, Eq. 11 for ring all-reduce; on ``tcp`` at its goodput,
  as ``lockstep predict`` takes them), and where they ran with
  ``predict=true`` the predictions in their ``summary.json`` (the model of their
  network and Algorithm 2.1: the paper's Fig. 2a / 3a), plus a loss figure of
  all its runs; a sweep over ``data.cache_size`` also gets the data-wait time,
  the virtual time and the accuracy against the cache size (sim4DistrDL).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from controller import closed_forms as cf  # noqa: E402
from controller.outputs import read_csv  # noqa: E402

__all__ = ["main", "plot_runs", "plot_sweep", "runs_figure", "sweep_points", "closed_form_step"]


def _label(run: Path) -> str:
    try:
        s = json.loads((run / "summary.json").read_text())
        label = f"{run.name}: {s['strategy']} K={s['workers']}"
    except (OSError, ValueError, KeyError):
        return run.name
    try:  # a fault experiment: say which faults (plan.json lists them only when there are some)
        faults = json.loads((run / "plan.json").read_text()).get("faults") or []
    except (OSError, ValueError):
        faults = []
    if faults:
        label += ", " + ", ".join(f"{f['kind']} {f['start'] / 1e9:g}-" + ("" if f["end"] >= 2**63 - 1 else
                                  f"{f['end'] / 1e9:g}") + "s" for f in faults)
    return label


def plot_runs(runs: list[Path], out: Path) -> Path:
    """Loss and accuracy vs virtual time and vs updates for ``runs``, on one 2x2 figure."""
    fig = runs_figure(runs)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)


def runs_figure(runs: list[Path]) -> Figure:
    """The figure of :func:`plot_runs`: each run in one colour in every panel (a run with no evaluations,
    or no update yet, keeps its colour from the others), with a legend on each row that has lines."""
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    (lt, li), (at, ai) = axes
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    empty = []
    for n, run in enumerate(runs):
        label, colour = _label(run), colours[n % len(colours)]
        rows = read_csv(run / "metrics.csv")
        if not rows:
            empty.append(str(run))
        else:
            t = [float(r["virtual_time_s"]) for r in rows]
            it = [int(r["iteration"]) for r in rows]
            loss = [float(r["loss"]) for r in rows]
            lt.plot(t, loss, label=label, linewidth=1, color=colour)
            li.plot(it, loss, label=label, linewidth=1, color=colour)
        ev = read_csv(run / "eval.csv") if (run / "eval.csv").exists() else []
        if ev:
            acc = [100 * float(r["test_accuracy"]) for r in ev]
            at.plot([float(r["virtual_time_s"]) for r in ev], acc, marker=".", label=label, linewidth=1,
                    color=colour)
            ai.plot([int(r["iteration"]) for r in ev], acc, marker=".", label=label, linewidth=1, color=colour)
    for ax in (lt, at):
        ax.set_xlabel("virtual time [s]")
    for ax in (li, ai):
        ax.set_xlabel("global updates")
    for ax in (lt, li):
        ax.set_ylabel("training loss")
    for ax in (at, ai):
        ax.set_ylabel("test accuracy [%]")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    if empty:  # a run that has not made its first update (or stopped before it): said, not an empty legend
        print(f"lockstep plot: note: {len(empty)} run(s) with no update in metrics.csv yet, not drawn: "
              f"{', '.join(empty)}", file=sys.stderr)
    for ax in (li, ai):  # the loss row's and the accuracy row's runs (a run may have no evaluations)
        if ax.get_lines():
            ax.legend(fontsize="small")
    return fig


def _run_info(run: Path) -> dict[str, Any]:
    summary = json.loads((run / "summary.json").read_text())
    plan = json.loads((run / "plan.json").read_text()) if (run / "plan.json").exists() else {}
    return {"summary": summary, "plan": plan, "dir": run}


def sweep_points(sweep: Path) -> dict[tuple[str, ...], list[dict[str, Any]]]:
    """The runs of a sweep grouped by (strategy, network: the egress discipline of the ideal network, or ``tcp``),
    sorted by workers; where the sweep also varies other overrides (faults, lr, ...), by (strategy, network,
    those overrides) — one line each."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    infos = []
    for sub in sorted(p for p in sweep.iterdir() if (p / "summary.json").exists()):
        info = _run_info(sub)
        if info["summary"].get("complete") is False:  # still going, or stopped early: no point yet
            continue
        infos.append(info)
    jobs = [_job_overrides(i["dir"]) for i in infos]
    varying = sorted(k for k in set().union(*jobs) if k not in _ON_AXES and len({j.get(k) for j in jobs}) > 1)
    for info, job in zip(infos, jobs):
        key = (info["summary"]["strategy"], _network_of(info))
        if varying:
            key += (", ".join(f"{k}={job[k]}" for k in varying if k in job),)
        groups[key].append(info)
    for v in groups.values():
        v.sort(key=lambda i: i["summary"]["workers"])
    return dict(groups)


_ON_AXES = {"workers", "strategy", "network.discipline"}  # the plot's own axes and lines


def _network_of(info: dict[str, Any]) -> str:
    """A group's network as its line names it: ``tcp``, or the ideal network's egress discipline (which only
    the ideal network has: README)."""
    net = info["plan"].get("network", {})
    return "tcp" if net.get("tcp") is not None else net.get("egress", "?")


def _tcp_steady_state(net: dict[str, Any]) -> tuple[float, float] | None:
    """``(goodput / line rate, host latency in s)`` of a run on ``network=tcp``, as ``lockstep predict`` models
    it (docs/predict.md: every link at its goodput, the latency plus the host latency); None on the ideal
    network. Raises ValueError for a tcp spec that is not one (plan.json from a run directory)."""
    if net.get("tcp") is None:
        return None
    from agents.sim.tcp import TcpSpec, goodput_fraction

    known = {f.name for f in dataclasses.fields(TcpSpec)}
    raw = net["tcp"]
    if not isinstance(raw, dict) or not all(isinstance(raw.get(k, 0), (int, bool)) for k in known):
        raise ValueError("its network.tcp is not a mapping of integers")
    spec = TcpSpec(**{k: v for k, v in raw.items() if k in known})
    return goodput_fraction(spec), spec.host_latency_ns / 1e9


def _job_overrides(run: Path) -> dict[str, str]:
    """The overrides Hydra ran this job of a sweep with (``.hydra/overrides.yaml``), by key."""
    try:
        lines = (run / ".hydra" / "overrides.yaml").read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        key, eq, value = line.removeprefix("- ").partition("=")
        if eq and not key.startswith("hydra."):
            out[key.lstrip("+~")] = value
    return out


def closed_form_step(info: dict[str, Any], form: str) -> float | None:
    """The closed-form step time for one run (``eq7_ps``, ``eq8_fcfs``, ``eq9_hybrid``, ``eq11_ring``), or None.

    Needs ``compute=constant`` (T_F+T_B = the gradient time, T_S = the update
    time, summed with the aggregation), a constant latency and one bandwidth.
    On ``network=tcp`` the form is taken, as ``lockstep predict`` takes it, at the
    transport's steady state (goodput, latency plus host latency): close, not exact.
    """
    plan, s = info["plan"], info["summary"]
    comp, net = plan.get("compute", {}), plan.get("network", {})
    if comp.get("model") != "constant" or net.get("latency", {}).get("kind") != "constant":
        return None
    c = comp["constant_s"]
    t_c, t_s = c.get("gradient", 0.0), c.get("update", 0.0) + c.get("aggregate", 0.0)
    speed = comp.get("speed") or []
    if any(x != 1.0 for x in speed):
        return None
    bw = net["bandwidth_out"][0]
    lat = net["latency"]["ns"] / 1e9
    try:
        tcp = _tcp_steady_state(net)
    except (TypeError, ValueError):  # not a tcp spec lockstep writes: no form rather than a made-up one
        return None
    if tcp is not None:
        bw, lat = bw * tcp[0], lat + tcp[1]
    k, m = s["workers"], s["model_bytes"]
    if form == "eq11_ring":  # and the K−1 chunk additions of the reduce-scatter, as lockstep predict adds them
        return cf.ring_step(k, m, bw, t_c, c.get("update", 0.0), lat) + (k - 1) * c.get("aggregate", 0.0)
    if form == "uncontended":  # unlimited NICs: every transfer at its own rate, Eq. 7 of one worker
        return cf.ps_step(1, m, bw, t_c, t_s, lat)
    fn = {"eq7_ps": cf.ps_step, "eq8_fcfs": cf.fcfs_step, "eq9_hybrid": cf.hybrid_step}[form]
    return fn(k, m, bw, t_c, t_s, lat)


FORMS = {"ring_allreduce": {"fair": ["eq11_ring"], "fifo": ["eq11_ring"], "unlimited": ["eq11_ring"]}}
"""The closed forms drawn beside a ring group, by discipline (a synchronous PS's: :func:`forms_of`)."""
FORM_LABEL = {"eq7_ps": "Eq. 7 (PS sharing)", "eq8_fcfs": "Eq. 8 (FCFS)", "eq9_hybrid": "Eq. 9 (hybrid)",
              "eq11_ring": "Eq. 11 (ring)", "uncontended": "no contention (unlimited NICs)"}


def forms_of(strategy: str, egress: str, info: dict[str, Any]) -> list[str]:
    """The closed forms of a group: for a synchronous PS the form ``lockstep predict`` selects for the PS's two
    NICs (:func:`controller.predict.sync_match`), with Eq. 9, their mean, beside Eq. 7 or 8 where the egress
    shares its rate."""
    if strategy == "ps_sync" and egress in ("fair", "fifo", "unlimited"):
        from controller.predict import sync_match

        ingress = info["plan"].get("network", {}).get("ingress", egress)
        form = sync_match(egress, ingress).removeprefix("sync_ps_")
        return [form, "eq9_hybrid"] if egress in ("fair", "fifo") else [form]
    return FORMS.get(strategy, {}).get(egress, [])


def prediction_of(info: dict[str, Any], model: str) -> float | None:
    """Samples per second that ``model`` predicted for this run (``predict=true``), or None."""
    pred = info["summary"].get("predictions") or {}
    return next((m.get("samples_per_s") for m in pred.get("models", []) if m.get("model") == model), None)


def predicted_curves(infos: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """The prediction curves of a group: the model of its network (selected) and Algorithm 2.1, if run."""
    names: list[str] = []
    for i in infos:
        pred = i["summary"].get("predictions") or {}
        sel = pred.get("selected")
        if sel and sel not in names:
            names.append(sel)
        for m in pred.get("models", []):
            if m["model"].startswith("finegrained_") and "skipped" not in m and m["model"] not in names and \
                    m["model"].split("_", 1)[1] in ((sel or "").rsplit("_", 1)[-1], "all_reduce"):
                names.append(m["model"])
    return [(n, "-." if n.startswith("finegrained") else (0, (3, 1, 1, 1))) for n in names]


def plot_sweep(sweep: Path, out: Path) -> Path:
    """Throughput (samples per virtual second) against workers, with the closed forms where they apply."""
    groups = sweep_points(sweep)
    drawn = {i["dir"].name for infos in groups.values() for i in infos}
    left = sorted(p.name for p in sweep.iterdir() if (p / ".hydra").is_dir() and p.name not in drawn)
    if left:  # a job that failed, or is still running
        print(f"lockstep plot: note: {len(left)} job(s) of {sweep} left out, without a complete summary.json: "
              f"{', '.join(left)}", file=sys.stderr)
    fig, ax = plt.subplots(figsize=(9, 6), constrained_layout=True)
    for key, infos in sorted(groups.items()):
        strategy = key[0]
        name = ", ".join(x for x in key if x)  # the line's name: strategy, network and any other swept value
        ks = [i["summary"]["workers"] for i in infos]
        thr = [i["summary"]["throughput_samples_per_s"] for i in infos]
        (line,) = ax.plot(ks, thr, marker="o", label=f"{name} (emulated)")
        # tcp: the forms predict selects for the plan's NICs, at the transport's steady state (docs/predict.md)
        net = infos[0]["plan"].get("network", {})
        at = " at tcp's goodput" if key[1] == "tcp" else ""
        for j, form in enumerate(forms_of(strategy, net.get("egress", "?"), infos[0])):
            pts = [(i["summary"]["workers"], closed_form_step(i, form), i) for i in infos]
            pts = [(k, st, i) for k, st, i in pts if st]
            if not pts:
                continue
            batch = [i["plan"]["workload"]["batch_size"][0] for _, _, i in pts]
            ax.plot([k for k, _, _ in pts], [cf.throughput(st, k, b) for (k, st, _), b in zip(pts, batch)],
                    linestyle=("--", ":")[j % 2], color=line.get_color(), label=f"{name}: {FORM_LABEL[form]}{at}")
        for model, style in predicted_curves(infos):  # runs with predict=true: the paper's models beside them
            pts = [(i["summary"]["workers"], prediction_of(i, model)) for i in infos]
            pts = [(k, v) for k, v in pts if v is not None]
            if pts:
                ax.plot([k for k, _ in pts], [v for _, v in pts], linestyle=style, marker="x", color=line.get_color(),
                        alpha=0.8, label=f"{name}: predicted, {model}")
    ax.set_xlabel("workers K")
    ax.set_ylabel("throughput [samples / virtual s]")
    ax.set_title(f"throughput vs workers: {sweep.name}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)


def cache_points(sweep: Path) -> list[dict[str, Any]]:
    """The complete runs of a sweep with data on the network (``data_cache_size`` in summary.json), by cache size."""
    out = []
    for sub in sorted(p for p in sweep.iterdir() if (p / "summary.json").exists()):
        s = json.loads((sub / "summary.json").read_text())
        if s.get("complete") is not False and "data_cache_size" in s:
            out.append({"summary": s, "dir": sub})
    return sorted(out, key=lambda i: (i["summary"]["data_cache_size"] if i["summary"]["data_cache"] == "lru" else 0))


def plot_cache_sweep(sweep: Path, out: Path) -> Path | None:
    """sim4DistrDL's sweep: data-wait time, virtual time and test accuracy against the cache size (None: no such runs)."""
    pts = cache_points(sweep)
    if len({p["summary"]["data_cache_size"] for p in pts}) < 2:
        return None
    size = [p["summary"]["data_cache_size"] if p["summary"]["data_cache"] == "lru" else 0 for p in pts]
    fig, (aw, at) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    aw.plot(size, [p["summary"]["data_wait_s"] for p in pts], marker="o", label="waiting for data")
    aw.plot(size, [p["summary"]["virtual_time_s"] for p in pts], marker="s", label="run (virtual time)")
    aw.set_xlabel("cache size [samples per node]")
    aw.set_ylabel("virtual seconds")
    aw.legend(fontsize="small")
    for p, n in zip(pts, size):
        ev = read_csv(p["dir"] / "eval.csv") if (p["dir"] / "eval.csv").exists() else []
        if ev:
            at.plot([float(r["virtual_time_s"]) for r in ev], [100 * float(r["test_accuracy"]) for r in ev],
                    marker=".", label=f"cache {n}")
    at.set_xlabel("virtual time [s]")
    at.set_ylabel("test accuracy [%]")
    at.legend(fontsize="small")
    for ax in (aw, at):
        ax.grid(alpha=0.3)
    fig.suptitle(f"data on the network: {sweep.name}")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lockstep plot", description=__doc__.split("\n\n")[0])
    p.add_argument("paths", nargs="+", type=Path, help="run directories and/or --multirun sweep directories")
    p.add_argument("-o", "--out", type=Path, default=None, help="output PNG (default: next to the first path)")
    a = p.parse_args(argv)
    if a.out is not None:  # before any plotting: a wrong -o was a traceback from savefig at the end
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        kinds = sorted(FigureCanvasAgg(Figure()).get_supported_filetypes())
        if a.out.suffix.lstrip(".").lower() not in kinds:
            p.error(f"-o {a.out}: the file type {a.out.suffix or '(none)'!r} is not one matplotlib writes; "
                    f"accepted: a name ending in {', '.join('.' + k for k in kinds)}")
        if not a.out.parent.is_dir():
            p.error(f"-o {a.out}: the folder {a.out.parent} does not exist")
    runs, sweeps = [], []
    for path in a.paths:
        if (path / "metrics.csv").exists():
            runs.append(path)
        elif path.is_dir() and any((s / "summary.json").exists() for s in path.iterdir()):
            sweeps.append(path)
        elif path.is_dir() and ((path / "multirun.yaml").exists() or any((s / ".hydra").is_dir()
                                                                          for s in path.iterdir())):
            p.error(f"{path} is a sweep directory with no complete point yet (no */summary.json): its points are "
                    "still running, or failed")
        else:
            p.error(f"{path} is neither a run directory (metrics.csv) nor a sweep directory (*/summary.json)")
    written = []
    for sweep in sweeps:
        if a.out is None:
            out = sweep / "throughput.png"
        elif len(sweeps) == 1 and not runs:
            out = a.out
        else:  # -o names the runs' figure or is shared: each sweep's figures take its name after -o's stem
            out = a.out.with_name(f"{a.out.stem}-{sweep.resolve().name}{a.out.suffix}")
        written.append(plot_sweep(sweep, out))
        cache = plot_cache_sweep(sweep, out.with_name(out.stem + "-cache" + out.suffix))
        if cache is not None:
            written.append(cache)
        members = sorted(s for s in sweep.iterdir() if (s / "metrics.csv").exists())
        written.append(plot_runs(members, out.with_name(out.stem + "-loss" + out.suffix)))
    if runs:
        out = a.out if a.out is not None else runs[0] / "runs.png"
        written.append(plot_runs(runs, out))
    for w in written:
        print(f"lockstep: wrote {w}")
    return 0

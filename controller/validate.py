"""``lockstep validate RESULTS.jsonl [overrides...] [--seeds N] [--jobs J] [--json] [--out DIR]``: emulate runs.

Every point of the results file (controller/results.py) is emulated with the same K, L,
B, model bytes M and compute C — ``model=flat model.bytes=M``, ``compute=constant`` with
the gradient taking C, the aggregation the measured PS averaging time (when the file has
it) and the optimizer step nothing (the benchmarks have none) — under the run
configuration plus the given overrides (before, between or after the options; an override of a point's own
scenario, K, L, B, M, C or steps is refused: ``POINT_KEYS``), and the
emulated step time (ring, ps_sync), updates/s (ps_async) or transfer time (p2p, fanin)
is set beside the measured one: a table, the mean and max error per scenario, and
``validate.png`` (emulated against measured, and the error of each point). A configuration
measured several times is one point, compared by the median of its runs (their spread is
shown beside it); ``--each`` compares every run instead. ``--seeds N`` emulates every point with N
seeds and compares the median of their values, for models with keyed random parts (compute jitter,
host jitter, start spread) whose single run is one draw, as one measured run is.
"""
from __future__ import annotations

import argparse
import functools
import json
import logging
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.results import HYSTART_NAMES, SCENARIOS, Point, ResultsError, group_repeats, load_results

__all__ = ["main", "emulate", "Row", "validate_points", "summarize"]

STRATEGY = {"ring": "ring_allreduce", "ps_sync": "ps_sync", "ps_async": "ps_async", "p2p": "microbench",
            "fanin": "microbench"}


# The measured programs' hosts (docs/engine.md, "What validate emulates"; measured in the testbed's packet
# captures, docs/benchmarks.md): in the K = 2 PS captures the processes posted their first receives up to
# 1.7 ms apart (2.2-3.5 ms in the K = 4 asynchronous ones; a 3 ms spread was tried and read worse on the
# synchronous PS), time.sleep(C) spreads by about 1 %, realrun's asynchronous PS fills its send buffers and
# reads its counters before its first send, so its parameters leave after the workers posted their receives
# (testbed_ps_start), and every rank starts when it has left the program's start-up barrier and filled its first
# tensor on the testbed's two cores (_gloo_offsets).
# A user's overrides win over these.
TESTBED_START_SPREAD = "1.7ms"
TESTBED_TIMER_JITTER = 0.01
# realrun's asynchronous PS, between leaving the barrier and its first isend, allocates its model, K gradient
# buffers and K send buffers (clones of the model) and reads its counters: measured with
# benchmarks/realrun/starts.py (lab/starts.jsonl), 4.0-6.0 ms at K x M = 4 MB, 12.9 ms at 12 MB, 23.4 ms at
# 20 MB, 36.7 ms at 40 MB (and 128-129 ms in two runs at L = 10 ms, whose barrier was slow as well)
TESTBED_PS_START_S = 1e-3
TESTBED_PS_COPY_BPS = 0.9e9  # bytes of K send buffers per second
# every rank of realrun's program fills one fresh tensor of M bytes after the barrier (torch.zeros / torch.ones:
# page faults and the writes), on a machine of two cores whose processes run at one real-time priority:
# measured with benchmarks/realrun/starts.py, 4.6 ms at 10 MB and 12.0-13.5 ms at 30 MB (lab/starts-cores.jsonl)
TESTBED_TOUCH_BPS = 2.3e9
TESTBED_CORES = 2
# realrun's asynchronous PS, per update, from a gradient's receive completing to the reply's isend returning: the
# waiter thread's hand-off, the gradient applied, the send buffer refilled, the isend; one update at a time.
# Measured with benchmarks/realrun/lab.py --scenario ps_async_trace (lab/ps_async-updates.jsonl), medians:
# 0.56 ms at M = 0.3 MB, 0.83-0.87 ms at 1 MB, 5.6 ms at 10 MB
TESTBED_PS_UPDATE_S = 0.3e-3
TESTBED_PS_UPDATE_BPS = 1.9e9  # bytes of M per second


def testbed_ps_start(p: Point) -> float:
    """Seconds from leaving the barrier to realrun's asynchronous PS's first isend (K send buffers of M)."""
    return TESTBED_PS_START_S + p.K * p.M_bytes / TESTBED_PS_COPY_BPS


def testbed_ps_update(p: Point) -> float:
    """Seconds realrun's asynchronous PS spends on one update before the next (its ``compute.update``)."""
    return TESTBED_PS_UPDATE_S + p.M_bytes / TESTBED_PS_UPDATE_BPS


@dataclass
class Row:
    point: Point
    emulated: float  # the median of ``runs`` when the point was emulated with several seeds
    runs: tuple[float, ...] = ()

    @property
    def error(self) -> float:
        return self.emulated / self.point.measured - 1.0


# the overrides that differ between the seeds of one point: the seed, and the start offsets it keys
_PER_SEED = ("seed", "compute.start_offsets")


@functools.lru_cache(maxsize=256)
def _composed(overrides: tuple[str, ...]) -> Any:
    from controller.config import compose_config

    return compose_config(list(overrides))


def _load(overrides: list[str]) -> Any:
    """:func:`controller.config.load` of ``overrides``, for an emulation: Hydra composes a point's config once for
    all its seeds (a composition takes 0.3 s, an emulation 0.5-5 s), and the overrides that differ between the
    seeds (:data:`_PER_SEED`: plain values, which Hydra applies after composing) are applied to a copy as Hydra
    applies them. The same RunConfig as ``load`` (tests/validation/test_results_and_cli.py)."""
    import copy

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from controller.config import validate
    from controller.config.load import absolute_paths

    per_seed = [o for o in overrides if o.split("=", 1)[0] in _PER_SEED]
    cfg = copy.deepcopy(_composed(tuple(o for o in overrides if o.split("=", 1)[0] not in _PER_SEED)))
    parsed = OverridesParser.create().parse_overrides(per_seed)
    ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
    absolute_paths(cfg)
    written = {o.key_or_group: s.split("=", 1)[1]
               for o, s in zip(OverridesParser.create().parse_overrides(list(overrides)), overrides) if "=" in s}
    return validate(cfg, written=written)


@functools.lru_cache(maxsize=64)
def _validated(overrides: tuple[str, ...]) -> Any:
    """:func:`_load` of ``overrides``, once per process (a RunConfig is frozen)."""
    return _load(list(overrides))


@functools.lru_cache(maxsize=64)
def _tcp_model(overrides: tuple[str, ...]) -> bool:
    """Whether the user's overrides leave the tcp transport on (lockstep run's default network)."""
    model = _composed(overrides).network.model
    return getattr(model, "value", model) == "tcp"


def _overrides_for(p: Point, overrides: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The point's own settings (the user's ``overrides`` come after them and win; they decide whether the
    tcp transport's settings apply: ``network=ideal`` reads none)."""
    steps = p.warmup + p.N
    ov = [f"strategy={STRATEGY[p.scenario]}", f"workers={p.K}", f"network.latency={p.L_s!r}",
          f"network.bandwidth={p.B_bps / 8!r}", "model=flat", f"model.bytes={p.M_bytes}",
          "compute=constant", f"compute.gradient={p.C_s!r}",
          f"compute.update={testbed_ps_update(p) if p.scenario == 'ps_async' else 0!r}",
          f"compute.aggregate={p.aggregate_s!r}", "batch_size=1", "eval.every=0",
          "eval.samples=10", "progress=false", "launcher=inprocess", "trace.mode=off",
          "agents=1", "metrics.port=null"]
    ov += [f"compute.start_spread={TESTBED_START_SPREAD}", f"compute.jitter={TESTBED_TIMER_JITTER}"]
    # the hosts ran CUBIC with other HyStart detections (results.py: hystart_detect), which the tcp model alone reads
    if p.hystart != 3 and _tcp_model((f"strategy={STRATEGY[p.scenario]}", *overrides)):
        ov += [f"network.tcp.hystart_ack_train={bool(p.hystart & 1)}",
               f"network.tcp.hystart_delay={bool(p.hystart & 2)}"]
    # the state log says whose gradient each update applied (_async_rate); no other scenario needs it
    ov += (["statelog.enabled=true", "statelog.checksum=false", "statelog.snapshot_every=0"]
           if p.scenario == "ps_async" else ["statelog.enabled=false"])
    if p.scenario == "ps_async":
        ov += [f"stop.updates={p.K * steps}", f"strategy.start_after={testbed_ps_start(p)!r}"]
    elif p.scenario == "ring":
        ov.append(f"stop.updates={steps}")
    elif p.scenario in ("p2p", "fanin"):
        ov += [f"strategy.kind={p.scenario}", f"stop.updates={steps}"]
    else:
        ov.append(f"stop.updates={steps}")
    return ov


# the keys of a point's own measured settings (_overrides_for): its scenario, K, L, B, M, C and steps, with what
# each sets. An override of one would emulate another configuration than the row shows (docs/engine.md).
POINT_KEYS = {"strategy": "scenario", "strategy.kind": "scenario", "workers": "K", "network.latency": "L",
              "network.bandwidth": "B", "model": "M", "model.bytes": "M", "compute": "C", "compute.gradient": "C",
              "stop.updates": "steps"}


def refused_override(overrides: list[str] | tuple[str, ...]) -> str | None:
    """The sentence (after the command's name) refusing the first of ``overrides`` that sets one of a point's own
    measured settings (:data:`POINT_KEYS`), or None."""
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key in POINT_KEYS:
            return (f"{o} is not valid: each point is emulated with its own measured scenario, K, L, B, M, C and "
                    f"steps, and this key sets its {POINT_KEYS[key]} ({key}); accepted: overrides of other keys "
                    f"(e.g. network.tcp.delayed_ack=true).")
    return None


def _gloo_offsets(p: Point, overrides: list[str]) -> list[str]:
    """``compute.start_offsets`` for the ring and PS points (:func:`testbed_starts`), by vworker name (a ring's
    member ``wN`` is rank N; the PS is rank 0 and worker ``wN`` rank N + 1), the one-way time being the network's
    latency plus the tcp model's host latency. Not set where the user sets ``compute.start_offsets``."""
    mine = any(o.split("=", 1)[0].lstrip("+~") == "compute.start_offsets" for o in overrides)
    if p.scenario not in ("ring", "ps_sync", "ps_async") or mine:
        return []
    # the latencies do not depend on the seed: one validation per point, the seed read from the overrides
    fixed = tuple(o for o in _overrides_for(p, overrides) + list(overrides) if o.split("=", 1)[0] not in _PER_SEED)
    rc = _validated(fixed)
    seed = next((int(o.split("=", 1)[1]) for o in reversed(overrides) if o.split("=", 1)[0] == "seed"), rc.seed)
    names = ([] if p.scenario == "ring" else ["ps0"]) + [f"w{i}" for i in range(p.K)]
    starts = testbed_starts(p, rc.network.latency.ns + (rc.network.tcp.host_latency_ns if rc.network.tcp else 0),
                            seed)
    return ["compute.start_offsets={" + ", ".join(f"{n}: {t}ns" for n, t in zip(names, starts)) + "}"]


def testbed_starts(p: Point, one_way_ns: int, seed: int) -> list[int]:
    """When each rank of realrun's program (ring, ps_sync, ps_async) posts its first operation, in ns after the
    first, by rank. Ranks leave ``init_process_group`` as :func:`~agents.strategies.collective.barrier_entries`
    has them, go through the barrier and then allocate their tensors (:func:`testbed_setup`) on the testbed's two
    cores (:func:`~agents.strategies.collective.barrier_on_cores`; ranks that wait for a core at the same
    instant get it in a keyed order, ``(seed, "testbed_core", rank)``). The asynchronous PS's own setup is left
    out: it is its ``strategy.start_after``."""
    from agents.sim import keyed
    from agents.strategies.collective import barrier_entries, barrier_on_cores

    setup = [round(s * 1e9) for s in testbed_setup(p)]
    n = len(setup)
    exits, ready = barrier_on_cores(barrier_entries(n, one_way_ns), one_way_ns, setup, TESTBED_CORES,
                                    ties=[keyed.uniform(seed, "testbed_core", r) for r in range(n)])
    if p.scenario == "ps_async":
        ready[0] = exits[0]
    first = min(ready)
    return [t - first for t in ready]


def testbed_setup(p: Point) -> list[float]:
    """Seconds each rank of realrun's program spends between leaving its start-up barrier and its first
    operation, by rank: every rank fills one tensor of M bytes (the ring's model, the PS's parameters, a
    worker's gradient) at ``TESTBED_TOUCH_BPS``; the asynchronous PS :func:`testbed_ps_start`."""
    touch = p.M_bytes / TESTBED_TOUCH_BPS
    if p.scenario == "ring":
        return [touch] * p.K
    return [testbed_ps_start(p) if p.scenario == "ps_async" else touch] + [touch] * p.K


def _applicable(p: Point, overrides: list[str]) -> list[str]:
    """The overrides that apply to ``p``'s strategy: a ``strategy.<key>`` only where the strategy has the key."""
    base = _composed(tuple(_overrides_for(p)))
    keep = []
    for o in overrides:
        key = o.split("=", 1)[0].lstrip("+~")
        if key.startswith("strategy.") and key.split(".")[1] not in base.strategy:
            continue
        keep.append(o)
    return keep


def point_config(p: Point, overrides: list[str]) -> Any:
    """The run config that emulates ``p``: its own settings, gloo's start-up offsets, then ``overrides``."""
    mine = _applicable(p, overrides)
    return _load(_overrides_for(p, mine) + _gloo_offsets(p, mine) + mine)


def observed_updates(rc: Any, out: Path) -> list[tuple[int, str]]:
    """Run ``rc`` into ``out`` with an observer (``statelog.jsonl``, and ``trace.json`` where the config traces)
    and return ``(virtual time, worker)`` of every applied gradient, in order, from the state log."""
    from agents.observe.statelog import read_jsonl
    from controller.observe import Observer
    from controller.run import execute

    observer, summary = Observer(rc, out), None
    try:
        summary = execute(rc, out, observer=observer).summary
    finally:
        observer.finish(summary)
    return [(r["t"], r["worker"]) for r in read_jsonl(out / "statelog.jsonl") if r.get("kind") == "result"]


def emulate(p: Point, overrides: list[str], workdir: Path | None = None) -> float:
    """The emulated value of ``p``: median step (s), updates/s, or median transfer time (s)."""
    from controller.outputs import read_csv
    from controller.run import execute

    rc = point_config(p, overrides)
    with tempfile.TemporaryDirectory(prefix="lockstep-validate-", dir=workdir) as d:
        if p.scenario == "ps_async":  # counted from the state log, which the observer writes (_async_rate)
            return _async_rate(p, observed_updates(rc, Path(d)))
        execute(rc, Path(d))
        rows = read_csv(Path(d) / "metrics.csv")
    times = [int(r["virtual_time_ns"]) for r in rows]
    if p.scenario in ("p2p", "fanin"):  # the microbenchmark reports each repetition's time as its "loss"
        return statistics.median(float(r["loss"]) for r in rows[p.warmup:])
    steps = [(b - a) / 1e9 for a, b in zip(times, times[1:])][p.warmup - 1 if p.warmup else 0:]
    if p.warmup == 0:
        steps = [times[0] / 1e9] + steps
    if not steps:
        raise RuntimeError(f"{p.describe()}: the emulation made {len(times)} updates, too few to time")
    return statistics.median(steps[: p.N])


def _async_rate(p: Point, updates: list[tuple[int, str]]) -> float:
    """Updates/s of an asynchronous PS as realrun and ``lockstep measure`` count them: every worker runs
    ``warmup + N`` steps; the rate is taken over the updates of worker steps ``>= warmup`` from the first
    of them up to the first worker's last update (later, fewer workers compete). ``updates`` is
    ``(virtual time, worker)`` per applied gradient, in order; a worker's steps past ``warmup + N`` do not
    exist in the measured program and are dropped."""
    steps = p.warmup + p.N
    done: dict[str, int] = {}
    tagged = []  # (time, worker, the worker's step)
    for t, w in updates:
        s = done.get(w, 0)
        done[w] = s + 1
        if s < steps:
            tagged.append((t, w, s))
    last = [t for t, w, s in tagged if s == steps - 1]
    if not last:
        raise RuntimeError(f"{p.describe()}: no worker of the emulation finished its {steps} steps")
    t_end = min(last)
    meas = [t for t, _, s in tagged if s >= p.warmup and t <= t_end]
    if len(meas) < 2 or meas[-1] == meas[0]:
        raise RuntimeError(f"{p.describe()}: the emulation made {len(updates)} updates, too few to time")
    return (len(meas) - 1) / ((meas[-1] - meas[0]) / 1e9)


def validate_points(points: list[Point], overrides: list[str], log: Any = None, seeds: int = 1,
                    jobs: int = 1) -> list[Row]:
    """Emulate every point; with ``seeds`` > 1, once per seed (``seed=`` from the overrides' or 0 up) and
    compare the median. ``jobs`` > 1 runs the emulations in that many processes: every emulation is a
    deterministic function of its point and config, so the rows are the same, only sooner."""
    first = int(next((o.split("=", 1)[1] for o in reversed(overrides) if o.split("=", 1)[0] == "seed"), 0))
    per_point = [overrides] if seeds == 1 else [overrides + [f"seed={first + s}"] for s in range(seeds)]
    tasks = [(p, ov) for p in points for ov in per_point]
    pool = None
    if jobs > 1 and len(tasks) > 1:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # spawn, not fork: the parent may hold torch's and gRPC's threads
        pool = ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), initializer=_one_thread,
                                   mp_context=multiprocessing.get_context("spawn"))
    try:
        # in task order either way: a point is logged once all its seeds are in
        values = iter(pool.map(emulate, *zip(*tasks)) if pool else (emulate(p, ov) for p, ov in tasks))
        rows = []
        for i, p in enumerate(points, 1):
            runs = tuple(next(values) for _ in per_point)
            rows.append(Row(p, runs[0]) if seeds == 1 else Row(p, statistics.median(runs), runs))
            if log is not None:
                r = rows[-1]
                log(f"[{i}/{len(points)}] {p.describe()}: measured {_fmt(p, p.measured)}{_spread(p)}, emulated "
                    f"{_fmt(p, r.emulated)}{_seeds(r)} ({100 * r.error:+.1f} %)")
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
    return rows


def _one_thread() -> None:
    """A validate worker process: one torch thread each (the emulations, not their tensors, take the time)."""
    import torch

    torch.set_num_threads(1)
    logging.getLogger().setLevel(logging.WARNING)


def _fmt(p: Point, v: float) -> str:
    return f"{v:.2f} updates/s" if p.scenario == "ps_async" else f"{v * 1e3:.1f} ms"


def _spread(p: Point) -> str:
    """`` (median of n runs, lo–hi)`` for a point measured more than once, else nothing."""
    if len(p.runs) < 2:
        return ""
    lo, hi = min(p.runs), max(p.runs)
    unit = (lambda v: f"{v:.2f}") if p.scenario == "ps_async" else (lambda v: f"{v * 1e3:.1f}")
    return f" (median of {len(p.runs)} runs, {unit(lo)}–{unit(hi)})"


def _seeds(r: Row) -> str:
    """`` (median of n seeds, lo–hi)`` for a point emulated with several seeds, else nothing."""
    if len(r.runs) < 2:
        return ""
    unit = (lambda v: f"{v:.2f}") if r.point.scenario == "ps_async" else (lambda v: f"{v * 1e3:.1f}")
    return f" (median of {len(r.runs)} seeds, {unit(min(r.runs))}–{unit(max(r.runs))})"


def summarize(rows: list[Row]) -> dict[str, dict[str, float]]:
    """Per scenario: points, mean and max |error|, mean signed error; and of the points measured more than
    once (``repeated``), at how many the emulated value lies within the measured runs' range (``within_runs``):
    where the testbed itself spreads by more than the error, the error says little about the model."""
    out: dict[str, dict[str, float]] = {}
    for scen in dict.fromkeys(r.point.scenario for r in rows):
        sel = [r for r in rows if r.point.scenario == scen]
        errs = [r.error for r in sel]
        repeated = [r for r in sel if len(r.point.runs) > 1]
        out[scen] = {"points": len(errs), "mean_abs_error": sum(abs(e) for e in errs) / len(errs),
                     "max_abs_error": max(abs(e) for e in errs), "mean_error": sum(errs) / len(errs),
                     "repeated": len(repeated),
                     "within_runs": sum(min(r.point.runs) <= r.emulated <= max(r.point.runs) for r in repeated)}
    return out


def table(rows: list[Row]) -> str:
    lines = [f"{'scenario':9s} {'K':>3s} {'L ms':>6s} {'B Mbit/s':>9s} {'M MB':>6s} {'C ms':>5s} "
             f"{'measured':>16s} {'emulated':>16s} {'error':>8s} {'runs':>5s}"]
    for r in rows:
        p = r.point
        lines.append(f"{p.scenario:9s} {p.K:3d} {p.L_s * 1e3:6g} {p.B_bps / 1e6:9g} {p.M_bytes / 1e6:6g} "
                     f"{p.C_s * 1e3:5g} {_fmt(p, p.measured):>16s} {_fmt(p, r.emulated):>16s} "
                     f"{100 * r.error:+7.1f}% {max(1, len(p.runs)):5d}{HYSTART_NAMES[p.hystart]}")
    lines.append("")
    for scen, s in summarize(rows).items():
        lines.append(f"{scen:9s} {int(s['points']):3d} points: mean |error| {100 * s['mean_abs_error']:.1f} %, "
                     f"max {100 * s['max_abs_error']:.1f} % (mean signed {100 * s['mean_error']:+.1f} %)"
                     + (f"; within the measured runs' range at {s['within_runs']} of {s['repeated']} points "
                        "measured several times" if s["repeated"] else ""))
    return "\n".join(lines)


def plot(rows: list[Row], out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ex) = plt.subplots(1, 2, figsize=(12, 5), constrained_layout=True)
    for scen in dict.fromkeys(r.point.scenario for r in rows):
        sel = [r for r in rows if r.point.scenario == scen]
        # one axis for all: seconds for times, a step's seconds (1/rate) for ps_async
        m = [r.point.measured if scen != "ps_async" else 1 / r.point.measured for r in sel]
        e = [r.emulated if scen != "ps_async" else 1 / r.emulated for r in sel]
        ax.scatter(m, e, label=scen, s=18)
        ex.scatter(range(len(sel)), [100 * r.error for r in sel], label=scen, s=18)
    lo = min(min(r.point.measured, r.emulated) for r in rows if r.point.scenario != "ps_async") if any(
        r.point.scenario != "ps_async" for r in rows) else 1e-3
    lims = [min(lo, 1e-3), max(max(r.point.measured for r in rows), 1.0) * 2]
    ax.plot(lims, lims, color="grey", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured [s per step; 1/(updates/s) for ps_async]")
    ax.set_ylabel("emulated [same]")
    ax.legend()
    ex.axhspan(-2, 2, color="green", alpha=0.1)
    ex.axhline(0, color="grey", linewidth=0.8)
    ex.set_xlabel("point (in file order per scenario)")
    ex.set_ylabel("error [%] = emulated / measured - 1")
    ex.legend()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="lockstep validate", description=__doc__.split("\n")[0])
    ap.add_argument("results", help="a results file (JSON lines: realrun or lockstep measure)")
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. network=tcp strategy.collective=gloo")
    ap.add_argument("--json", action="store_true", help="print the rows and summary as JSON instead of a table")
    ap.add_argument("--out", default=".", help="directory for validate.png (default: the current one)")
    ap.add_argument("--only", default=None, help="comma-separated scenarios to emulate (default: all)")
    ap.add_argument("--each", action="store_true",
                    help="compare every run of a configuration measured several times (default: their median)")
    ap.add_argument("--seeds", type=int, default=1,
                    help="emulate every point with this many seeds and compare their median (default: 1)")
    ap.add_argument("--jobs", type=int, default=1,
                    help="emulations run at once, in that many processes (default: 1); the rows are the same")
    a = ap.parse_intermixed_args(argv)  # overrides before, between and after the options
    for opt, v in (("--seeds", a.seeds), ("--jobs", a.jobs)):
        if v < 1:
            print(f"lockstep validate: {opt}={v} is not valid; accepted: an integer >= 1.", file=sys.stderr)
            return 2
    bad = [o for o in a.overrides if "=" not in o]
    if bad:
        print(f"lockstep validate: {bad[0]!r} is not an override; accepted: key=value (e.g. network=tcp).",
              file=sys.stderr)
        return 2
    why = refused_override(a.overrides)
    if why:
        print(f"lockstep validate: {why}", file=sys.stderr)
        return 2
    from controller.outputs import unwritable

    why = unwritable(a.out, directory=True)  # before the emulations, not after them
    if why:
        print(f"lockstep validate: --out {a.out}: {why}; accepted: a directory for validate.png.", file=sys.stderr)
        return 2
    try:
        scen = tuple(a.only.split(",")) if a.only else None
        unknown = [s for s in scen or () if s not in SCENARIOS]
        if unknown:
            raise ResultsError(f"--only {a.only}: {unknown[0]!r} is not a scenario; accepted: {', '.join(SCENARIOS)}.")
        points = load_results(a.results, scen) if scen else load_results(a.results)
        if not a.each:
            points = group_repeats(points)
    except ResultsError as e:
        print(f"lockstep validate: {e}", file=sys.stderr)
        return 2
    from controller.config import ConfigError, load

    logging.getLogger().setLevel(logging.WARNING)
    try:
        for p in points:  # a bad override fails before any emulation
            mine = _applicable(p, a.overrides)
            load(_overrides_for(p, mine) + mine, check_data=False)
        rows = validate_points(points, a.overrides, log=None if a.json else lambda s: print(s, file=sys.stderr),
                               seeds=a.seeds, jobs=a.jobs)
    except ConfigError as e:
        print("lockstep validate: invalid configuration:\n  " + "\n  ".join(e.problems), file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - a Hydra override error is one sentence for the user
        if type(e).__module__.startswith(("hydra", "omegaconf")):
            print(f"lockstep validate: {e}", file=sys.stderr)
            return 2
        raise
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    png = plot(rows, out / "validate.png")
    if a.json:
        print(json.dumps({"rows": [{"scenario": r.point.scenario, "K": r.point.K, "L_ms": r.point.L_s * 1e3,
                                    "B_mbit": r.point.B_bps / 1e6, "M_bytes": r.point.M_bytes,
                                    "C_ms": r.point.C_s * 1e3, "hystart_detect": r.point.hystart,
                                    "measured": r.point.measured,
                                    "emulated": r.emulated, "error": r.error, "line": r.point.line,
                                    "runs": list(r.point.runs) or [r.point.measured],
                                    "emulated_runs": list(r.runs) or [r.emulated]}
                                   for r in rows],
                          "summary": summarize(rows), "overrides": a.overrides, "seeds": a.seeds,
                          "plot": str(png)}, indent=1))
    else:
        print(table(rows))
        if a.seeds == 1:
            print("\none seed per point: where the emulation has keyed random parts (validate's start spread "
                  "and timer jitter), --seeds 11 compares the median of eleven draws, which is what the PS "
                  "points need to settle (docs/benchmarks.md, \"How many runs and seeds a point needs\")")
        print(f"\nplot: {png}")
    return 0

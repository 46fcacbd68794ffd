"""The default experiment (64 workers, ps_async, the thesis CNN) over agent processes against one process.

Variants, each a fresh process per run, interleaved, best of REPEATS kept (the machine is shared):

* ``inprocess``: ``launcher=inprocess agents=1`` — the baseline (``inprocess off``: with eager compute, as
  before deferred compute);
* ``agents=2`` and ``agents=4``: local agent processes with the defaults (direct windows between the
  agents, deferred compute overlapped on a background thread in each agent process) — targets <= 1.3 and
  <= 1.5 x inprocess;
* ``agents=2 hub``: the same with ``controller.windows=hub`` (every window through the controller over
  gRPC) and ``compute.batch=off`` (eager compute): the protocol before direct windows, for comparison.

It prints whole-run wall times (``execute`` from the plan to summary.json: agent start-up included) and
window-loop times, their ratios to inprocess, the windows, the CPU seconds of every process (summary.json's
``wall_cpu_s``: the busiest agent bounds the window loop) and of the thread in each agent that ran the direct
windows (``wall_cpu_s.window_loops``: one near the window loop's wall time was the bound), and the load
average. With ``--cores N`` it also runs agents=1 (one local agent process) to show scale-out on a machine
with N cores: agents=4 against agents=1 (target there: >= 2x faster with 16 cores), agents=8, and agents=4
and 5 with ``placement=ps_alone`` (the PS alone on agent 0).
``--set k=v,k=v`` adds overrides to every variant (e.g. ``strategy=ring_allreduce``: another experiment).
``--cli`` times each variant as the whole ``lockstep run`` command, from the process's start to its exit
(Python, Hydra, the agents' forkserver, the loss plot), instead of ``execute`` alone.
usage: python benchmarks/bench_agents_overhead.py [UPDATES] [REPEATS] [--no-hub] [--only inprocess,agents=2,...]
       [--cores N] [--set k=v,...] [--cli]
"""
from __future__ import annotations

import sys

from _common import cli_runs, fresh_runs, load_average


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--") and not a.startswith("inprocess")]
    updates = int(args[0]) if args else 3000
    repeats = int(args[1]) if len(args) > 1 else 2
    extra = sys.argv[sys.argv.index("--set") + 1].split(",") if "--set" in sys.argv else []
    common = [f"stop.updates={updates}", *extra]
    variants = {
        "inprocess": common + ["launcher=inprocess", "agents=1"],
        "inprocess off": common + ["launcher=inprocess", "agents=1", "compute.batch=off"],
        "agents=2": common + ["launcher=local", "agents=2"],
        "agents=4": common + ["launcher=local", "agents=4"],
        "agents=2 hub": common + ["launcher=local", "agents=2", "controller.windows=hub", "compute.batch=off"],
    }
    if "--no-hub" in sys.argv:
        del variants["agents=2 hub"], variants["inprocess off"]
    if "--cores" in sys.argv:
        variants["agents=1 local"] = common + ["launcher=local", "agents=1"]
        variants["agents=8"] = common + ["launcher=local", "agents=8"]
        # the PS alone on agent 0 (its agent is the busiest with round_robin), workers on the others
        variants["agents=4 ps_alone"] = common + ["launcher=local", "agents=4", "placement=ps_alone"]
        variants["agents=5 ps_alone"] = common + ["launcher=local", "agents=5", "placement=ps_alone"]
    if "--only" in sys.argv:
        keep = sys.argv[sys.argv.index("--only") + 1].split(",")
        variants = {k: v for k, v in variants.items() if k in keep}
    what = f"the default experiment with {','.join(extra)}" if extra else "default experiment (64 workers ps_async cnn)"
    if "--cli" in sys.argv:
        _commands(variants, repeats, updates, what)
        return
    res = fresh_runs(variants, repeats)
    best = {k: min(v, key=lambda s: s["wall_time_s"]) for k, v in res.items()}
    base = best.get("inprocess")
    lines = []
    for name, s in best.items():
        line = (f"{name}: whole run {s['wall_time_s']:.2f} s, window loop {s['wall_barrier_s']:.2f} s, "
                f"{s['windows']} windows, CPU {s['cpu_s']:.1f} s")
        cpu = s.get("wall_cpu_s") or {}
        if "launcher=local" in variants[name] and cpu.get("agents"):  # each process's CPU seconds
            line += f" (controller {cpu['controller']:.1f}, agents {' '.join(f'{c:.1f}' for c in cpu['agents'])}"
            if cpu.get("window_loops"):  # the thread in each agent that ran the direct windows
                line += f"; their window threads {' '.join(f'{c:.1f}' for c in cpu['window_loops'])}"
            line += ")"
        if base is not None and name != "inprocess":
            line += (f"; ratio to inprocess: whole run {s['wall_time_s'] / base['wall_time_s']:.2f}, "
                     f"loop {s['wall_barrier_s'] / base['wall_barrier_s']:.2f}")
        lines.append(line)
    if "agents=1 local" in best:
        one = best["agents=1 local"]
        for n in ("2", "4", "8", "4 ps_alone", "5 ps_alone"):
            if f"agents={n}" in best:
                s = best[f"agents={n}"]
                lines.append(f"scale-out: agents={n} is {one['wall_time_s'] / s['wall_time_s']:.2f}x faster than "
                             f"agents=1 (window loop {one['wall_barrier_s'] / s['wall_barrier_s']:.2f}x)")
    print(f"bench_agents_overhead: {what}, {updates} updates, best of "
          f"{repeats}, load average {load_average()}\n  " + "\n  ".join(lines))


def _commands(variants: dict[str, list[str]], repeats: int, updates: int, what: str) -> None:
    """``--cli``: the whole ``lockstep run`` command of each variant, start to exit (``_common.cli_runs``)."""
    res = cli_runs(variants, repeats)
    best = {k: min(v, key=lambda s: s["command_s"]) for k, v in res.items()}
    base = best.get("inprocess")
    lines = []
    for name, s in best.items():
        line = f"{name}: command {s['command_s']:.2f} s (execute {s['wall_time_s']:.2f} s, {s['windows']} windows)"
        if base is not None and name != "inprocess":
            line += f"; ratio to inprocess: command {s['command_s'] / base['command_s']:.2f}"
        lines.append(line)
    print(f"bench_agents_overhead --cli: {what}, {updates} updates, `lockstep run` start to exit, best of "
          f"{repeats}, load average {load_average()}\n  " + "\n  ".join(lines))


if __name__ == "__main__":
    main()

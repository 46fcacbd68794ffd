"""Shared helpers of the benchmarks: compose a config and run it in-process or over local gRPC agents."""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def ideal_unless_named(overrides: list[str]) -> list[str]:
    """``network=ideal`` unless ``overrides`` name a network: the benchmarks' figures in docs/benchmarks.md were
    recorded on the ideal network, `lockstep run`'s default until 2026-11-29 (now tcp); ``--set network=tcp``
    (or any preset) measures another."""
    return [] if any(o.startswith("network=") for o in overrides) else ["network=ideal"]


def run(run_dir: Path, overrides: list[str], local: bool, **settings):
    if local and not any(o.startswith("launcher.start_method=") for o in overrides):
        # as `lockstep run` does first thing (controller/cli.py): the agents' forkserver imports torch and the
        # engine while this process imports the controller, instead of inside execute, which is what is timed
        from controller.launchers.forkserver import warm_forkserver

        warm_forkserver()
    from controller.config import load
    from controller.launchers.local import LocalLauncher
    from controller.remote import ControllerSettings, RemoteAgents
    from controller.run import execute

    rc = load(["progress=false", *ideal_unless_named(overrides), *overrides])
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")])}
    pool = RemoteAgents(LocalLauncher(), ControllerSettings(**settings), extra_env=env) if local else None
    return execute(rc, run_dir, launcher=pool)


def fresh_runs(variants: dict[str, list[str]], repeats: int, keys: tuple[str, ...] = (
        "wall_time_s", "wall_barrier_s", "windows", "compute_batch", "peak_memory", "wall_cpu_s"),
        setup: dict[str, str] | None = None) -> dict[str, list[dict]]:
    """Run every variant ``repeats`` times, interleaved (A B C A B C ...), each in a fresh Python process
    (a second run in one process would find torch imported and the data loaded); the summaries' ``keys``.

    A variant whose overrides contain ``launcher=local`` runs its agents as local gRPC processes. ``setup``: per
    variant, Python statements its process runs before the run (a baseline's patch).
    """
    import json
    import resource
    import subprocess
    import tempfile

    out: dict[str, list[dict]] = {name: [] for name in variants}
    _adopt_orphans()
    with tempfile.TemporaryDirectory() as d:
        for i in range(repeats):
            for j, (name, overrides) in enumerate(variants.items()):
                head = ("import json, sys, time; from pathlib import Path; sys.path.insert(0, %r); "
                        "from _common import run\n" % str(ROOT / "benchmarks"))
                code = head + (setup or {}).get(name, "") + (
                        "\no = json.loads(sys.argv[2]); t0 = time.time(); "
                        "s = run(Path(sys.argv[1]), o, local='launcher=local' in o).summary; t1 = time.time(); "
                        "out = {k: s.get(k) for k in json.loads(sys.argv[3])}; out['t_execute'] = [t0, t1]; "
                        "print(json.dumps(out))")
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                p = subprocess.run([sys.executable, "-c", code, f"{d}/{i}-{j}", json.dumps(overrides), json.dumps(keys)],
                                   capture_output=True, text=True)
                _reap_orphans()
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                if p.returncode:
                    raise RuntimeError(f"{name} failed:\n{p.stderr[-4000:]}")
                s = json.loads(p.stdout.strip().splitlines()[-1])
                # CPU seconds of the run's process and every process it waited for (its agents)
                s["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                out[name].append(s)
                print(f"  {name} #{i + 1}: wall {s['wall_time_s']:.2f} s, window loop {s['wall_barrier_s']:.2f} s, "
                      f"CPU {s['cpu_s']:.1f} s", file=sys.stderr, flush=True)
    return out


def cli_runs(variants: dict[str, list[str]], repeats: int) -> dict[str, list[dict]]:
    """Every variant as the command a user types, ``lockstep run OVERRIDES progress=false``, ``repeats`` times
    interleaved: ``command_s`` from the process's start to its exit (Python, Hydra, validating the
    configuration, the agents' forkserver, the loss plot: what ``fresh_runs``, which calls ``execute``
    itself, leaves out), beside the summary's ``wall_time_s`` (``execute`` alone)."""
    import json
    import subprocess
    import tempfile
    import time

    lockstep = Path(sys.executable).parent / "lockstep"
    out: dict[str, list[dict]] = {name: [] for name in variants}
    _adopt_orphans()
    with tempfile.TemporaryDirectory() as d:
        for i in range(repeats):
            for j, (name, overrides) in enumerate(variants.items()):
                run_dir = Path(d) / f"{i}-{j}"
                argv = [str(lockstep), "run", "progress=false", *ideal_unless_named(overrides), *overrides,
                        f"hydra.run.dir={run_dir}"]
                t0 = time.perf_counter()
                p = subprocess.run(argv, capture_output=True, text=True)
                command_s = time.perf_counter() - t0
                _reap_orphans()
                if p.returncode:
                    raise RuntimeError(f"{name} failed:\n{p.stderr[-4000:]}")
                s = json.loads((run_dir / "summary.json").read_text())
                out[name].append({"command_s": command_s, "wall_time_s": s["wall_time_s"],
                                  "windows": s["windows"]})
                print(f"  {name} #{i + 1}: command {command_s:.2f} s, execute {s['wall_time_s']:.2f} s",
                      file=sys.stderr, flush=True)
    return out


def _adopt_orphans() -> None:
    """Become the child subreaper (Linux): a run's forkserver (launcher=local), whose agents are its children,
    outlives the run's process by a moment; adopted and reaped here, its CPU and theirs count."""
    import ctypes

    PR_SET_CHILD_SUBREAPER = 36
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap_orphans(timeout_s: float = 30.0) -> None:
    """Wait for every adopted descendant to exit (the forkserver exits when its controller has)."""
    import os
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)  # polling for an exit, with a deadline


def load_average() -> str:
    """The 1/5/15-minute load averages (the machine is shared: every figure says how busy it was)."""
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"

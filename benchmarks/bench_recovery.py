"""Recovery (docs/recovery.md): what losing agents, or the controller, costs a run — and that it costs nothing else.

The default experiment (64 workers, ps_async, the thesis CNN) with ``agents=4`` over local agent processes
(direct windows, the defaults, checkpoints every ``recovery.checkpoint_every_s`` = 10 wall s), three runs of
``lockstep run`` / ``lockstep resume``, each its own process:

1. *undisturbed*: the reference outputs and wall time;
2. *agent kills*: one agent SIGKILLed (agents 1, 2, 3, 0, ... in turn) every ``EVERY`` wall seconds after the
   run's first row, regardless of progress (the issue's target); the run must end byte-identical to (1).
   Reported: kills, restores from a checkpoint, checkpoints taken, the wall time against (1) (the overhead of
   recovery) and the replays' wall time (``summary.json``'s ``recovery``). ``--after-catch-up``: the next kill
   comes ``EVERY`` s after the previous replay caught up instead (the schedule used before checkpoints,
   when a replay from virtual time 0 of a long run outlasted any fixed period);
3. *controller kill*: the controller SIGKILLed once half the updates are in metrics.csv, then
   ``lockstep resume`` (from the latest checkpoint); must end byte-identical to (1). Reported: the resume's
   wall time, the time to catch up with the rows on disk, and the whole wall time against (1).

``--checkpoint-every=S`` sets ``recovery.checkpoint_every_s`` (0: replay from virtual time 0, as before). With
checkpoints, one more undisturbed run without them says what taking them costs while nothing fails
(``--no-cost`` skips it).

usage: python benchmarks/bench_recovery.py [UPDATES=30000] [EVERY_S=30] [AGENTS=4] [--after-catch-up]
       [--checkpoint-every=10] [--no-resume] [--no-cost]
"""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, load_average

WALL = ("wall_time_s", "wall_compute_s", "wall_barrier_s", "wall_cpu_s", "speed_ratio", "peak_memory", "recovery", "run_id")


LOG = Path(tempfile.gettempdir()) / "bench-recovery.log"  # every lockstep process's output, for a failure


def lockstep(*args: str) -> subprocess.Popen:
    out = open(LOG, "a")
    out.write(f"\n=== lockstep {' '.join(args)}\n")
    out.flush()
    return subprocess.Popen([sys.executable, "-m", "controller.cli", *args], cwd=ROOT, stdout=out,
                            stderr=subprocess.STDOUT)


def rows(d: Path) -> int:
    try:
        with open(d / "metrics.csv", "rb") as f:
            return max(0, sum(1 for _ in f) - 1)
    except FileNotFoundError:
        return 0


def agent_pid(d: Path, agent: int) -> int | None:
    p = d / "agents" / f"agent-{agent}.log"
    found = re.findall(r"pid (\d+) hosting", p.read_text()) if p.exists() else []
    return int(found[-1]) if found else None


def events(d: Path) -> list[dict]:
    p = d / "recovery.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False


def poll(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = predicate()
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}")
        time.sleep(0.2)


def without_wall(path: Path) -> list[list[str]]:
    with open(path, newline="") as f:
        data = list(csv.reader(f))
    keep = [i for i, name in enumerate(data[0]) if not name.startswith("wall_")]
    return [[r[i] for i in keep] for r in data]


def summary(d: Path) -> dict:
    s = json.loads((d / "summary.json").read_text())
    s["compute_batch"].pop("overlap_wait_s", None)
    return {k: v for k, v in s.items() if k not in WALL}


def checkpoint_sizes(d: Path) -> str:
    """The agents' checkpoint sizes the run logged (``checkpoint of window K ...: N.N MB``), as text."""
    try:
        mb = [float(x) for x in re.findall(r"committed: ([0-9.]+) MB", (d / "lockstep.log").read_text())]
    except OSError:
        return ""
    return f" of {min(mb):.0f}–{max(mb):.0f} MB (all agents)" if mb else ""


def identical(a: Path, b: Path, config: bool = True) -> bool:
    """``config=False``: the runs' settings differ (so does their config_hash), not their results."""
    import torch

    same = all(without_wall(a / n) == without_wall(b / n) for n in ("metrics.csv", "eval.csv"))
    same = same and (a / "params.pt").read_bytes() == (b / "params.pt").read_bytes()
    same = same and (a / "statelog.jsonl").read_bytes() == (b / "statelog.jsonl").read_bytes()
    pa, pb = torch.load(a / "params.pt"), torch.load(b / "params.pt")
    sa, sb = summary(a), summary(b)
    if not config:
        sa.pop("config_hash"), sb.pop("config_hash")
    return same and torch.equal(pa, pb) and sa == sb and trace(a) == trace(b)


def trace(d: Path) -> dict:
    t = json.loads((d / "trace.json").read_text())
    t["otherData"].pop("run_id", None)
    return t


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    flags = [a for a in sys.argv[1:] if a.startswith("-")]
    updates = int(args[0]) if args else 30000
    every = float(args[1]) if len(args) > 1 else 30.0
    agents = int(args[2]) if len(args) > 2 else 4
    after_catch_up = "--after-catch-up" in flags
    ckpt = next((float(f.split("=", 1)[1]) for f in flags if f.startswith("--checkpoint-every=")), 10.0)
    run = ["progress=false", "network=ideal", f"agents={agents}", f"stop.updates={updates}",
           "recovery.max_restarts=1000", f"recovery.checkpoint_every_s={ckpt:g}"]
    print(f"load average before: {load_average()}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        base, killed, resumed = Path(tmp) / "undisturbed", Path(tmp) / "agent-kills", Path(tmp) / "controller-kill"

        t0 = time.monotonic()
        p = lockstep("run", *run, f"hydra.run.dir={base}")
        assert p.wait() == 0, "the undisturbed run failed"
        wall_base = time.monotonic() - t0
        checkpoints_base = json.loads((base / "summary.json").read_text())["recovery"]["checkpoints"]
        print(f"undisturbed: {wall_base:.1f} s, {checkpoints_base} checkpoints", file=sys.stderr, flush=True)
        cost_line = None
        if ckpt > 0 and "--no-cost" not in flags:  # what taking the checkpoints costs while nothing fails
            plain = Path(tmp) / "no-checkpoints"
            t0 = time.monotonic()
            p = lockstep("run", *[a for a in run if not a.startswith("recovery.checkpoint_every_s")],
                         "recovery.checkpoint_every_s=0", f"hydra.run.dir={plain}")
            assert p.wait() == 0, "the run without checkpoints failed"
            wall_plain = time.monotonic() - t0
            same = identical(base, plain, config=False)
            sizes = checkpoint_sizes(base)
            cost_line = (f"| the same, undisturbed, checkpoint_every_s={ckpt:g} vs 0 | {checkpoints_base} checkpoints"
                         f"{sizes}; wall {wall_base:.1f} s vs {wall_plain:.1f} s: **ratio {wall_base / wall_plain:.3f}**;"
                         f" outputs {'byte-identical' if same else 'DIFFERENT'} |")
            print(cost_line, file=sys.stderr, flush=True)

        t0 = time.monotonic()
        p = lockstep("run", *run, f"hydra.run.dir={killed}")
        kills = 0
        poll(lambda: rows(killed) > 0 or p.poll() is not None, 600, "the first row")
        mark = time.monotonic()
        while p.poll() is None:
            if time.monotonic() - mark < every:
                time.sleep(0.2)
                continue
            victim = (kills + 1) % agents
            pid = agent_pid(killed, victim)
            if pid is None or not alive(pid):  # the agents are being started again: wait for them
                time.sleep(0.2)
                continue
            os.kill(pid, signal.SIGKILL)
            kills += 1
            print(f"  killed agent {victim} (pid {pid}) at {time.monotonic() - t0:.1f} s, {rows(killed)} rows",
                  file=sys.stderr, flush=True)
            if after_catch_up:
                n = sum(1 for e in events(killed) if e["event"] == "caught_up")
                poll(lambda: p.poll() is not None or sum(1 for e in events(killed) if e["event"] == "caught_up") > n,
                     3600, "the replay to catch up")
                mark = time.monotonic()
            else:
                mark += every
        assert p.returncode == 0, "the run with agent kills failed"
        wall_killed = time.monotonic() - t0
        replay = json.loads((killed / "summary.json").read_text())["recovery"]
        restores = [e for e in events(killed) if e["event"] == "restored"]

        resume_line = None
        if "--no-resume" not in flags:
            t0 = time.monotonic()
            p = lockstep("run", *run, f"hydra.run.dir={resumed}")
            poll(lambda: rows(resumed) >= updates // 2, 3600, "half the updates")
            p.send_signal(signal.SIGKILL)
            p.wait()
            pids = [agent_pid(resumed, a) for a in range(agents)]
            poll(lambda: not any(alive(x) for x in pids if x), 120, "the orphaned agents to exit")
            wall_first = time.monotonic() - t0
            at = rows(resumed)
            t1 = time.monotonic()
            assert lockstep("resume", str(resumed)).wait() == 0, "lockstep resume failed"
            wall_resume = time.monotonic() - t1
            ev = events(resumed)
            print(f"  recovery.jsonl of the resumed run: {[(e['event'], e.get('window'), e.get('reason')) for e in ev]}",
                  file=sys.stderr, flush=True)
            caught = [e for e in ev if e["event"] == "caught_up"][-1]["replay_wall_s"]
            fromk = [e for e in ev if e["event"] == "restored"][:1]  # the resume's (a later one: an agent lost)
            lost = sum(1 for e in ev if e["event"] == "restart")
            ok_resume = identical(base, resumed)
            how = (f"; restored from window {fromk[-1]['window']}, {fromk[-1]['rows_kept']} rows kept" if fromk
                   else "; replayed from virtual time 0") + (f"; {lost} agents lost meanwhile" if lost else "")
            resume_line = (
                f"| the same, controller SIGKILLed at {at} of {updates} rows, then `lockstep resume` | killed after "
                f"{wall_first:.1f} s; resume {wall_resume:.1f} s, of which {caught:.1f} s to catch up (time to resume"
                f"{how}"
                f"); total {wall_first + wall_resume:.1f} s vs {wall_base:.1f} s: **ratio "
                f"{(wall_first + wall_resume) / wall_base:.2f}**; outputs "
                f"{'byte-identical' if ok_resume else 'DIFFERENT'} |")
        else:
            ok_resume = True
        ok_kills = identical(base, killed)
    print(f"load average after: {load_average()}", file=sys.stderr)
    schedule = "after the first row, then after each catch-up" if after_catch_up else "regardless of progress"
    print(f"| agents={agents}, {updates} updates, checkpoint_every_s={ckpt:g}, one agent SIGKILLed every {every:g} s "
          f"{schedule} | {kills} kills, {len(restores)} restored from a checkpoint, {replay['checkpoints']} "
          f"checkpoints taken; wall {wall_killed:.1f} s vs undisturbed {wall_base:.1f} s: **ratio "
          f"{wall_killed / wall_base:.2f}**; replays {replay['replay_wall_s']:.1f} s; outputs "
          f"{'byte-identical' if ok_kills else 'DIFFERENT'} |")
    if resume_line:
        print(resume_line)
    if cost_line:
        print(cost_line)
    if not (ok_kills and ok_resume and (cost_line is None or "DIFFERENT" not in cost_line)):
        sys.exit(1)


if __name__ == "__main__":
    main()

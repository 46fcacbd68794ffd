"""A run's start without torch's compiler (agents/workloads/models.py ``optimizer`` and ``step``).

torch.optim imports torch._dynamo, the compiler, on an optimizer's first ``step()`` (and ``state_dict``, ...),
only to keep a compiler from tracing it; lockstep never compiles. The baseline is the same code with the
PS's and the learners' steps put back to ``opt.step()`` in the run's process, which loads the compiler
inside the run as every run did before. Both sides in fresh processes, interleaved, best of REPEATS: the
default experiment in one process, stopped after UPDATES updates (a short run, as when trying a setting).
usage: python benchmarks/bench_startup.py [UPDATES] [REPEATS]
"""
from __future__ import annotations

import sys

from _common import fresh_runs, load_average

BASELINE = ("import agents.workloads.training as _t, agents.strategies.ps as _p; "
            "_t.step = _p.step = lambda opt: opt.step()")


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    updates = int(args[0]) if args else 200
    repeats = int(args[1]) if len(args) > 1 else 5
    common = ["launcher=inprocess", f"stop.updates={updates}", "trace.mode=off"]
    res = fresh_runs({"ours": common, "compiler loaded": common}, repeats, setup={"compiler loaded": BASELINE})
    ours = min(s["wall_time_s"] for s in res["ours"])
    base = min(s["wall_time_s"] for s in res["compiler loaded"])
    print(f"bench_startup: default experiment, {updates} updates, in-process, best of {repeats}: "
          f"ours {ours:.2f} s, with torch's compiler loaded by opt.step() {base:.2f} s: "
          f"{base / ours:.2f}x faster ({base - ours:.2f} s less); load average {load_average()}")


if __name__ == "__main__":
    main()

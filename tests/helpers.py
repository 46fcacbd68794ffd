"""Shared test helpers: compose a config like the CLI does, run it in-process, read outputs."""
from __future__ import annotations

import csv
import re
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from controller.config import compose_config, load
from controller.run import execute

T = TypeVar("T")

CONF = str(Path(__file__).resolve().parent.parent / "conf")

FAST = ["model=mlp", "compute=constant", "network=ideal", "eval.every=0", "progress=false", "launcher=inprocess"]


def compose_cfg(overrides: list[str]):
    """conf/ composed with ``overrides`` exactly as ``lockstep run`` composes it."""
    return compose_config(overrides)


def run(tmp: Path, overrides: list[str], fast: bool = True, **kw):
    """Validate and execute a config in this process; returns controller.run.RunResult."""
    return execute(load((FAST if fast else []) + overrides), Path(tmp), **kw)


def rows(path: Path, drop_wall: bool = True) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        out = list(csv.DictReader(f))
    if drop_wall:
        for r in out:
            for k in [k for k in r if k.startswith("wall_")]:
                del r[k]
    return out


def without_wall(path: Path) -> str:
    """The CSV text with every wall_* column removed (what must be byte-identical across runs)."""
    with open(path, newline="") as f:
        data = list(csv.reader(f))
    keep = [i for i, name in enumerate(data[0]) if not name.startswith("wall_")]
    return "\n".join(",".join(r[i] for i in keep) for r in data)


def wait_until(predicate: Callable[[], T], *, timeout: float, what: str, interval: float = 0.05,
               tolerate: tuple[type[BaseException], ...] = (), on_timeout: Callable[[], str] | None = None) -> T:
    """Poll ``predicate`` until it returns something truthy (returned); fail after ``timeout`` wall seconds.

    The interval is a poll period, never a settle time. Exceptions of the ``tolerate`` types count as
    "not yet" (the last one is reported on timeout); ``on_timeout()`` adds context to the failure.
    """
    deadline = time.monotonic() + timeout
    last_error: Any = None
    while True:
        try:
            result = predicate()
            if result:
                return result
        except tolerate as e:
            last_error = e
        if time.monotonic() > deadline:
            detail = f" (last error: {last_error})" if last_error is not None else ""
            extra = ("\n" + on_timeout()) if on_timeout else ""
            raise AssertionError(f"{what}: not within {timeout:g} s{detail}{extra}")
        time.sleep(interval)


def agent_pids(run_dir: Path, n: int, *, timeout: float, what: str = "the agents to build their vworkers",
               first_rows: bool = False) -> list[int]:
    """The pids of the ``n`` agents once each built its vworkers, from their logs in ``run_dir/agents`` (the
    newest line of each: a restarted agent logs again); with ``first_rows``, also wait for the first three
    rows of metrics.csv."""
    def pids():
        out = []
        for i in range(n):
            p = run_dir / "agents" / f"agent-{i}.log"
            found = re.findall(r"pid (\d+) hosting", p.read_text()) if p.exists() else []
            if not found:
                return None
            out.append(int(found[-1]))
        return out

    got = wait_until(pids, timeout=timeout, what=what)
    if first_rows:
        wait_until(lambda: (run_dir / "metrics.csv").exists()
                   and len((run_dir / "metrics.csv").read_text().splitlines()) > 3,
                   timeout=60, what="the first rows of metrics.csv")
    return got


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" not in f.read()
    except FileNotFoundError:
        return False


def core_rows(reached) -> tuple[list, list]:
    """An AgentCore window's update and eval rows: their order key, then every column but the wall clock."""
    return ([(key, tuple(row[:-1])) for key, row in reached.updates],
            [(key, tuple(row[:-1])) for key, row in reached.evals])


def whole_run_and_cuts(plan: Any, data: Any = None) -> tuple[Any, list, list, list[int]]:
    """Agent 0 of ``plan`` run to the end in this process: (its core, update rows, eval rows, cuts). The cuts are
    window boundaries for checkpoint tests: at 10 %, 45 % and 80 % of the run (odd ns), in the middle of the
    first compute call of each kind of each vworker class (a PS's update, a worker's gradient), and, for every
    chain of frames a vworker class waits in for some time (each collective's phases, each loop's steps), a
    moment it waits there, and one while a partition holds a send — so that a test that restores at each of
    them goes through every tail and every kind of pending event."""
    from agents.core import AgentCore
    from agents.sim.types import INFINITY

    core = AgentCore(plan, 0, data=data)
    firsts: dict[tuple[str, str], int] = {}
    on_compute = core.env.on_compute

    def spy(w, kind, start, end, wall):
        if end > start:
            firsts.setdefault((type(w).__name__, kind), (start + end) // 2)
        return on_compute(w, kind, start, end, wall)

    core.env.on_compute = spy
    waits: dict = {}
    for w in core.workers.values():
        w.run = lambda run=w.run, w=w: _Waits(w, run(), waits)
    hold = core.env.hold

    def held(w, dst, payload, nbytes, tag, until):  # a send a partition holds: its release is a pending event
        if until > w.now:
            waits.setdefault(("partition", "held send"), (w.now + 1, until))
        return hold(w, dst, payload, nbytes, tag, until)

    core.env.hold = held
    updates, evals = core_rows(core.advance(INFINITY))
    end = core.kernel.now
    return core, updates, evals, sorted({*firsts.values(), *(end * k // 20 + 1 for k in (2, 9, 16)),
                                         *_stabbing(waits.values(), end)})


class _Waits:
    """A vworker's coroutine that notes where it waits — (class, the code of each frame) — and the first
    interval [suspended + 1, resumed] of virtual time in which a window boundary finds it waiting there."""

    def __init__(self, w: Any, coro: Any, waits: dict):
        self.w, self.coro, self.waits, self.since = w, coro, waits, None

    def _suspended(self, cmd: Any) -> Any:
        from agents.sim.resume import _links

        self.since = (self.w.now, (type(self.w).__name__,
                                   tuple(frame.f_code.co_qualname for frame, _ in _links(self.coro))))
        return cmd

    def _resumed(self) -> None:
        if self.since is not None:
            t, where = self.since
            if self.w.now > t:
                self.waits.setdefault(where, (t + 1, self.w.now))
            self.since = None

    def send(self, value: Any) -> Any:
        self._resumed()
        return self._suspended(self.coro.send(value))

    def throw(self, *exc: Any) -> Any:
        self._resumed()
        return self._suspended(self.coro.throw(*exc))

    def close(self) -> None:
        self.coro.close()

    def __await__(self):  # (a collections.abc.Coroutine, as the kernel checks)
        return self.coro.__await__()


def _stabbing(intervals: Any, end: int) -> list[int]:
    """The fewest times that fall in every interval [a, b] (clipped to ``end``): the earliest ends first."""
    out: list[int] = []
    for a, b in sorted(((a, min(b, end)) for a, b in intervals if a <= min(b, end)), key=lambda ab: ab[1]):
        if not out or out[-1] < a:
            out.append(b)
    return out


def assert_one_agent_recovered(run_dir: Path, checkpoints: bool) -> list[dict[str, Any]]:
    """``run_dir`` lost one agent and went on: from its latest checkpoint (the rows before it kept, not
    replayed) or, without checkpoints, by replaying from virtual time 0 until it caught up. Returns the
    recovery.jsonl events."""
    import json

    events = [json.loads(line) for line in (run_dir / "recovery.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "restart" and events[0]["rows_written"] > 200, events
    recovery = json.loads((run_dir / "summary.json").read_text())["recovery"]
    assert recovery["agent_restarts"] == 1
    if checkpoints:
        assert events[1]["event"] == "restored" and events[1]["window"] > 0 and events[1]["rows_kept"] > 0, events
        assert recovery["restored_from_window"] == events[1]["window"]
    else:
        assert [e["event"] for e in events] == ["restart", "caught_up"]
    return events

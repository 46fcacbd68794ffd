"""What ends the windows of a multi-agent run: for every window, the queued event behind the earliest
``first(b)`` (docs/distributed.md, "Window ends"), counted by kind.

It runs ``lockstep run`` with the given overrides in this process (use ``launcher=inprocess agents=N``:
the same windows as agent processes) and prints one line per kind, most frequent first. Kinds are the
kernel handler's name, refined for the tcp network: a packet's arrival (``_arrive``) as ``ack`` or
``data`` and by whether its sender is on the same agent, the token bucket's release (``_serve``) by its
head packet's destination; ``pending:K`` is an event of kind K routed to the agent in the window before.
Two lines then count, per agent, the windows whose reports would wake it: as the direct windows send them
(``every runner to every agent``: it wakes whenever another agent ran the window) and at the least any
protocol with a leader that forwards the view would need (``runners and newcomers``: it ran the window
with others, or it runs the next window and not this one; docs/benchmarks.md, "Cheaper windows on the tcp
network"). A last line counts the windows by how many agents ran them (``agents per window: 1:N1 2:N2 ...``).
usage: python benchmarks/why_windows.py run launcher=inprocess agents=2 stop.updates=3000 [k=v ...]
(docs/benchmarks.md, "What bounds the windows on the tcp network").
"""
from __future__ import annotations

import collections
import sys

import agents.sim.kernel as kernel_mod
import controller.clock as clock
from agents.sim.types import INFINITY

_counts: collections.Counter = collections.Counter()
_handles: list = []


def _kind(k: kernel_mod.Kernel, fn, arg) -> str:
    if fn is None:
        return "resume"
    if fn is kernel_mod._fire:
        return "timer:" + type(arg.fn).__name__
    name = getattr(fn, "__name__", "?")
    if name == "_arrive":  # tcp: (src, dst, ack, ...)
        return f"_arrive:{'ack' if arg[2] else 'data'}:{'src-local' if arg[0] in k.workers else 'src-remote'}"
    if name == "_serve" and hasattr(arg, "queue"):
        q = arg.queue
        if not q:
            return "_serve:empty"
        return f"_serve:{'ack' if q[0].ack else 'data'}:{'dst-local' if q[0].dst in k.workers else 'dst-remote'}"
    return name


def _bound_kind(k: kernel_mod.Kernel) -> str:
    """The kind of the queued event that gives ``k.output_bound()`` its value."""
    bound, fn, arg = k.first_output()
    return "none" if bound >= INFINITY else _kind(k, fn, arg)


_run_windows = clock.run_windows
_window_ends = clock.window_ends


_sets: list[frozenset] = []  # the agents that ran each window
_ran: set = set()


class _Counted:
    """An agent handle that notes that it ran the current window."""

    def __init__(self, h, a):
        self._h, self._a = h, a

    def __getattr__(self, name):
        return getattr(self._h, name)

    def advance(self, *args, **kwargs):
        _ran.add(self._a)
        return self._h.advance(*args, **kwargs)


def _recording_run_windows(handles, placement, lookahead, on_window, *args, **kwargs):
    _handles[:] = handles

    def counting(w):
        _sets.append(frozenset(_ran))
        _ran.clear()
        on_window(w)

    counted = [_Counted(h, a) for a, h in enumerate(handles)]
    return _run_windows(counted, placement, lookahead, counting, *args, **kwargs)


def _wakeups(n: int) -> tuple[list[int], list[int]]:
    """Per agent: windows in which another agent ran (every runner sends it a report), and windows it ran
    with others or, not running, whose next window it runs (what it must hear at the least)."""
    every, least = [0] * n, [0] * n
    for k, ran in enumerate(_sets):
        nxt = _sets[k + 1] if k + 1 < len(_sets) else frozenset()
        for c in range(n):
            every[c] += bool(ran - {c})
            least[c] += (c in ran and len(ran) > 1) or (c in nxt and c not in ran)
    return every, least


def _recording_window_ends(T, bound, pending, lookahead):
    first = []
    for b in range(len(bound)):
        routed = min([ev.acts_at for ev in pending[b]], default=INFINITY)
        if routed < bound[b]:
            kinds = sorted({ev.kind for ev in pending[b] if ev.acts_at == routed})
            first.append((routed, "pending:" + ",".join(kinds)))
        else:
            core = getattr(_handles[b], "core", None)
            first.append((bound[b], _bound_kind(core.kernel) if core is not None else "?"))
    _counts[min(first, key=lambda f: f[0])[1]] += 1
    return _window_ends(T, bound, pending, lookahead)


def main() -> int:
    clock.run_windows = _recording_run_windows
    clock.window_ends = _recording_window_ends
    import controller.run as run_mod

    run_mod.run_windows = _recording_run_windows
    from controller.cli import main as lockstep

    rc = lockstep(sys.argv[1:])
    total = sum(_counts.values()) or 1
    print(f"{total} windows; what set the earliest first(b):")
    for kind, n in _counts.most_common():
        print(f"{n:8d} {n / total:6.1%}  {kind}")
    every, least = _wakeups(len(_handles))
    print("wake-ups per agent, every runner to every agent: " + " ".join(f"{a}:{n}" for a, n in enumerate(every)))
    print("wake-ups per agent, runners and newcomers: " + " ".join(f"{a}:{n}" for a, n in enumerate(least)))
    runners = collections.Counter(len(ran) for ran in _sets)
    print("agents per window: " + " ".join(f"{k}:{n}" for k, n in sorted(runners.items())))
    return rc


if __name__ == "__main__":
    sys.exit(main())

"""Where a suspended vworker coroutine is, and a coroutine that goes on from there (agents.checkpoint).

Python cannot pickle a suspended coroutine. It can read one: the chain of frames from ``run()`` down to
the kernel awaitable it waits in (``cr_await``), each with its code and its locals (:func:`frames_of`).
:func:`rebuilt` is a coroutine that, resumed with the value the original was waiting for, runs *the rest
of each frame*, innermost first, from *tails* registered with :func:`continues` — see
:mod:`agents.checkpoint`, which saves and restores the rest of an agent. The kernel's own suspension
points are marked with :func:`leaf`; a frame whose await is its last step registers :func:`finishes`.
"""
from __future__ import annotations

import types
from typing import Any, Awaitable, Callable

from agents.sim.kernel import park, suspend_until

__all__ = ["NotCheckpointable", "continues", "finishes", "leaf", "frames_of", "rebuilt"]


class NotCheckpointable(RuntimeError):
    """This agent cannot be checkpointed now; the message names the vworker and where it waits."""


Tail = Callable[[dict[str, Any], Any, str], Awaitable[Any]]
_TAILS: dict[str, Tail] = {}
_TAIL_CODES: set[types.CodeType] = set()
_LEAVES: set[str] = set()  # the kernel's own suspension points: resumed with the value itself


def _name(module: str, code: types.CodeType) -> str:
    return f"{module}:{code.co_qualname}"


def _of(fn: Callable[..., Any]) -> str:
    fn = getattr(fn, "__func__", fn)
    return _name(fn.__module__, fn.__code__)


def continues(fn: Callable[..., Any]) -> Callable[[Tail], Tail]:
    """Register the decorated ``async def tail(f, value)`` as the rest of ``fn``'s frame after its await."""
    name = _of(fn)

    def register(tail: Tail) -> Tail:
        _TAILS[name] = tail
        _TAIL_CODES.add(tail.__code__)
        return tail
    return register


_AWAITED = object()


def finishes(fn: Callable[..., Any], result: Any = _AWAITED) -> None:
    """Register the rest of ``fn``'s frame where the await it is suspended in is its last step: the frame
    returns what it awaited, or ``result`` (a method that ends in ``await ...`` and returns ``None``, say)."""
    async def tail(f: dict[str, Any], value: Any, below: str) -> Any:
        return value if result is _AWAITED else result
    continues(fn)(tail)


def leaf(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a kernel awaitable (a generator that yields to the kernel) whose result is the value sent in."""
    _LEAVES.add(_of(fn))
    return fn


def _links(coro: Any) -> Any:
    """(frame, what it awaits) of each coroutine or generator in an await chain, outermost first."""
    c = coro
    while c is not None:
        if isinstance(c, types.CoroutineType):
            frame, nxt = c.cr_frame, c.cr_await
        elif isinstance(c, types.GeneratorType):
            frame, nxt = c.gi_frame, c.gi_yieldfrom
        else:
            raise TypeError(type(c).__name__)
        if frame is None:  # a finished coroutine
            return
        yield frame, nxt
        c = nxt


def frames_of(worker: Any) -> list[tuple[str, dict[str, Any] | None]]:
    """Where ``worker``'s coroutine is suspended: (code name, locals) of each frame, ``run()`` first.

    A coroutine rebuilt by an earlier restore is read as the frames it stands for: the frames whose tails
    have not run yet, the one whose tail runs (locals None: its tail, in tail-call form, returns what it
    awaits), then what that tail awaits."""
    out: list[tuple[str, dict[str, Any] | None]] = []
    skip_tail = False
    try:
        for frame, nxt in _links(worker.coro):
            code = frame.f_code
            if skip_tail:  # the running tail of a rebuilt coroutine (checked: a registered tail)
                skip_tail = False
                if code not in _TAIL_CODES:
                    raise NotCheckpointable(f"vworker {worker.name} is suspended in {code.co_qualname}, which a "
                                            "checkpoint cannot save")
                continue
            if code is rebuilt.__code__:
                f = frame.f_locals
                if "i" not in f:  # still waiting where it was saved
                    out.extend(f["frames"])
                    break
                out.extend(f["frames"][:f["i"]])
                out.append((f["frames"][f["i"]][0], None))
                skip_tail = True
                continue
            # the frame's own f_locals dict (3.11 caches it on the frame), not a copy: the checkpoint pickles it
            # before any vworker runs again, and 500 000 frames' copies were 97 MB (docs/benchmarks.md)
            out.append((_name(frame.f_globals.get("__name__", "?"), code), frame.f_locals))
    except TypeError as e:
        raise NotCheckpointable(f"vworker {worker.name} waits in {e}, which a checkpoint cannot save") from None
    if not out:
        return out
    if out[-1][0] not in _LEAVES:
        raise NotCheckpointable(f"vworker {worker.name} is suspended in {out[-1][0].rsplit(':', 1)[1]}, which is "
                                "not one of the kernel's awaitables")
    for name, f in out[:-1]:
        if f is not None and name not in _TAILS:
            raise NotCheckpointable(f"vworker {worker.name} is suspended in {name.rsplit(':', 1)[1]}, which its "
                                    f"strategy ({type(worker).__name__}) cannot checkpoint (docs/recovery.md)")
    return out


def _short(name: str) -> str:
    return name.rsplit(":", 1)[-1].rsplit(".", 1)[-1]


async def rebuilt(frames: list[tuple[str, dict[str, Any] | None]]) -> Any:
    """The rest of a saved coroutine: wait where it waited, then finish each frame, innermost first."""
    value = await park()  # the kernel's pending event resumes it with what the original waited for
    for i in range(len(frames) - 2, -1, -1):
        name, f = frames[i]
        if f is not None:  # (None: a tail that returns what it awaited, saved from a rebuilt coroutine)
            value = await _TAILS[name](f, value, _short(frames[i + 1][0]))
    return value


# ------------------------------------------------------------------------------------------- pickling

leaf(suspend_until)  # where a checkpoint finds a suspended vworker waiting
leaf(park)

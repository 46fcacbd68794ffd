"""Ctrl-C and SIGTERM: a request to stop, seen at defined points — never an exception at a random line.

Python turns SIGINT into a ``KeyboardInterrupt`` raised at whatever bytecode the
main thread runs when the signal lands: inside an import, Hydra's config
composition, a library's ``except BaseException``, a finalizer. Raised there, it
printed tracebacks, aborted the process, or was lost and the run went on (the
``make test`` failure of ``test_ctrl_c_stops_the_controller_and_every_agent_within_seconds``;
docs/security.md). SIGTERM, what Kubernetes sends on every pod deletion,
eviction and preemption, killed the controller outright.

:func:`install` (first thing the CLI does) makes both signals only *record* the
request; :func:`check` raises :class:`Stopped` where the controller can act on
it — between windows, while it waits for an agent, before it starts anything.
A second signal ends the process at once (the default action).
"""
from __future__ import annotations

import os
import signal
import threading

__all__ = ["Stopped", "install", "check", "requested", "wait", "reset"]

_event = threading.Event()
_signum: int | None = None
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):
    """The user (SIGINT) or the cluster (SIGTERM) asked the controller to stop. A BaseException, so no
    ``except Exception`` on the way up takes it for an error."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"stopped by {self.name}")

    @property
    def exit_status(self) -> int:
        return 128 + self.signum  # what a shell reports for a process ended by the signal: 130, 143


def _handler(signum: int, frame: object) -> None:
    global _signum
    if _event.is_set():  # asked twice: stop now, as the signal's default action would
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _signum = signum
    _event.set()


def install() -> None:
    """Record SIGINT and SIGTERM instead of acting on them (main thread only; a no-op elsewhere)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        signal.signal(sig, _handler)


def requested() -> int | None:
    """The signal that asked to stop, or None."""
    return _signum if _event.is_set() else None


def check() -> None:
    """Raise :class:`Stopped` when a stop was requested."""
    if _event.is_set():
        raise Stopped(_signum or signal.SIGINT)


def wait(timeout: float) -> bool:
    """Sleep up to ``timeout`` seconds; True as soon as a stop is requested."""
    return _event.wait(timeout)


def reset() -> None:
    """Forget a request (tests that run several sessions in one process)."""
    global _signum
    _signum = None
    _event.clear()

"""Ctrl-C and SIGTERM: a request to stop, seen at defined points — never an exception at a random line.

Python turns SIGINT into a ``KeyboardInterrupt`` raised at whatever bytecode the
main thread runs when the signal lands: inside an import, Hydra's config
composition, a library's ``except BaseException``, a finalizer. Raised there, it
printed tracebacks, aborted the process, or was lost and the run went on (the
``make test`` failure of ``test_ctrl_c_stops_the_controller_and_every_agent_within_seconds``;
docs/security.md). SIGTERM, what Kubernetes sends on every pod deletion,
eviction and preemption, killed the controller outright.

:func:`install` (first thing the CLI does) takes both signals over. Until
:func:`defer` — while the config is composed and checked, when nothing has been
started — a signal ends the process at once (status 128 + signal), from the
handler itself, so no library frame can swallow it. From :func:`defer` on (a
run is starting) a signal only *records* the request; :func:`check` raises
:class:`Stopped` where the controller can act on it — between windows, while
it waits for an agent — and the run stops gracefully. A second signal ends the
process at once (the default action).
"""
from __future__ import annotations

import os
import signal
import sys
import threading

__all__ = ["Stopped", "install", "defer", "check", "reclaim", "requested", "wait", "reset"]

_event = threading.Event()
_signum: int | None = None
_immediate = False  # between install() and defer(): nothing to clean up, exit on the spot
_installed = False  # install() took the signals (the CLI); an API caller keeps its own
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
    if _immediate:
        sys.stderr.write(f"\nlockstep: interrupted by {signal.Signals(signum).name} before the run started; "
                         "nothing was started.\n")
        sys.stderr.flush()
        os._exit(128 + signum)
    if _event.is_set():  # asked twice: stop now, as the signal's default action would
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _signum = signum
    _event.set()


def install() -> None:
    """Take SIGINT and SIGTERM over: exit at once until :func:`defer` (main thread only; a no-op elsewhere)."""
    global _immediate, _installed
    if threading.current_thread() is not threading.main_thread():
        return
    _immediate = _installed = True
    for sig in SIGNALS:
        signal.signal(sig, _handler)


def reclaim() -> None:
    """Take SIGINT and SIGTERM back from a library that took them, where :func:`install` took them first.

    ``ray.init`` sets a SIGTERM handler of its own (``sys.exit``) and its core worker a C one that aborts
    the process (exit 134, no outputs finalised): the launcher calls this right after it."""
    if _installed and threading.current_thread() is threading.main_thread():
        for sig in SIGNALS:
            signal.signal(sig, _handler)


def defer() -> None:
    """A run starts: from now on a signal is a request, acted on at the next :func:`check`."""
    global _immediate
    _immediate = False


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

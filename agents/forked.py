"""An agent process forked from a warm server instead of started afresh (``launcher.start_method=forkserver``).

``launcher=local`` starts agents through :mod:`multiprocessing`'s *forkserver*: one server process, started
once per controller process, imports torch, grpc and lockstep's agent and reads the installed Fashion-MNIST —
this module is its preload — and then forks one child per agent. A child starts with all of that imported, so an agent is Ready in the time it takes to load its data
and build its vworkers, and ``agents=N`` pays the imports once instead of N times (docs/benchmarks.md,
"agents=2 against one process"). The server is a fresh interpreter, never a copy of the controller: it has
never created a gRPC channel, opened a run's files or installed the controller's signal handlers, so a
forked agent is as clean as one started with ``python -m agents`` (:func:`run` gives it the same session,
stdio, environment and process title).
"""
from __future__ import annotations

import os
import signal

import torch

import agents.agent  # noqa: F401 - preloaded: grpc, torch and the engine
from agents.__main__ import exit_now, main
from agents.workloads.data import DataNotFoundError, load_fashion_mnist

__all__ = ["run"]

torch.set_num_threads(1)  # nothing here may start OpenMP's pool: a forked child would inherit it broken
try:  # the installed data set, read once (load_fashion_mnist caches by file): every agent forked shares its pages
    load_fashion_mnist()
except (DataNotFoundError, OSError, ValueError):  # none installed, or not readable: each agent reports its own
    pass


def run(argv: list[str], env: dict[str, str], log_path: str) -> None:
    """The body of a forked agent: what ``subprocess.Popen(["python", "-m", "agents", *argv], env=env,
    stdout=log, stderr=STDOUT, start_new_session=True)`` would have set up, then :func:`agents.__main__.main`.

    Its exit status is main's; it ends as ``python -m agents`` does (:func:`agents.__main__.exit_now`).
    """
    _set_title(["lockstep", "agent", *argv])  # first: setproctitle finds argv's memory through the environment
    os.setsid()  # its own session: Ctrl-C in the controller's terminal reaches only the controller
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(null)
    os.environ.clear()
    os.environ.update(env)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the forkserver ignores it (controller/launchers/local.py)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    exit_now(main(argv))


def _set_title(argv: list[str]) -> None:
    """Show the agent's command line in ps and /proc/PID/cmdline (the forkserver's would show otherwise)."""
    try:
        import setproctitle
    except ImportError:  # pragma: no cover - a dependency; the title is cosmetic
        return
    setproctitle.setproctitle(" ".join(argv))

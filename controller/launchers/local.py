"""``launcher=local``: every agent is a process on this machine speaking gRPC to 127.0.0.1.

Each agent runs the argv of ``lockstep agent --controller HOST:PORT --agent-id N ...``, gets the token in
``$LOCKSTEP_TOKEN``, and writes its log to ``RUN_DIR/agents/agent-N.log``. ``start_method`` says how the
process starts: ``forkserver`` (the default) forks it from :mod:`multiprocessing`'s forkserver, a server
process started once per controller process that has imported torch and lockstep's agent already
(:mod:`agents.forked`); ``spawn`` runs ``python -m agents`` afresh. Agents run in their own session, so
Ctrl-C reaches only the controller, which then stops them all: SIGTERM, and SIGKILL after
``stop_grace_s``. Every child is reaped.
"""
from __future__ import annotations

import atexit
import logging
import os
import signal
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from agents.__main__ import forked
from controller.launchers.forkserver import FORKSERVER_PRELOAD, warm_forkserver  # noqa: F401 - re-exported
from controller.config.schema import LocalLauncherConfig
from controller.launchers.base import AgentFailure, LaunchSpec

__all__ = ["LocalLauncher", "log_tail", "warm_forkserver"]

log = logging.getLogger("lockstep.controller")


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines)).rstrip()
    except OSError:
        return ""


class _Forked:
    """A forked agent with the part of :class:`subprocess.Popen`'s interface the launcher uses."""

    def __init__(self, proc: Any):
        self.proc, self.pid = proc, proc.pid

    def poll(self) -> int | None:
        return self.proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self.proc.exitcode is None:
            os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        self.proc.join(timeout)
        if self.proc.exitcode is None:
            raise subprocess.TimeoutExpired(f"agent pid {self.pid}", timeout or 0.0)
        return self.proc.exitcode


class LocalLauncher:
    """Agent subprocesses on this machine. ``start`` may be called again after ``stop`` (a restart,
    docs/recovery.md): the new agents append to the same log files."""

    restartable = True

    def __init__(self, cfg: LocalLauncherConfig | None = None, *, python: str | None = None):
        cfg = cfg or LocalLauncherConfig()
        self.stop_grace_s = cfg.stop_grace_s
        self.python = python or sys.executable
        # a given interpreter runs as a command; the forkserver runs this one
        self.ctx = warm_forkserver() if cfg.start_method == "forkserver" and python is None else None
        self.procs: list[Any] = []
        self.logs: list[Path] = []
        self._files: list[Any] = []
        self._stopping = False

    def start(self, spec: LaunchSpec) -> None:
        log_dir = Path(spec.run_dir) / "agents"
        log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(spec.extra_env)
        env["LOCKSTEP_TOKEN"] = spec.token
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.procs, self.logs, self._stopping = [], [], False
        atexit.register(self.stop)
        for i in range(spec.n_agents):
            path = log_dir / f"agent-{i}.log"
            f = open(path, "ab")
            self._files.append(f)
            self.logs.append(path)
            argv = spec.agent_argv(i)[2:]
            if self.ctx is not None:
                p = self.ctx.Process(target=forked, args=(argv, env, str(path)), name=f"agent-{i}", daemon=True)
                p.start()
                self.procs.append(_Forked(p))
            else:
                self.procs.append(subprocess.Popen([self.python, "-m", "agents", *argv], stdin=subprocess.DEVNULL,
                                                   stdout=f, stderr=subprocess.STDOUT, env=env,
                                                   start_new_session=True, close_fds=True))
            log.debug("started agent %d (pid %d), log %s", i, self.procs[-1].pid, path)

    def log_tail(self, agent_id: int, lines: int = 20) -> str:
        if 0 <= agent_id < len(self.logs):
            return log_tail(self.logs[agent_id], lines)
        return ""

    def check(self) -> None:
        if self._stopping:
            return
        for i, p in enumerate(self.procs):
            rc = p.poll()
            if rc is not None:
                how = f"was killed by signal {signal.Signals(-rc).name}" if rc < 0 else f"exited with status {rc}"
                raise AgentFailure(str(i), f"its process (pid {p.pid}) {how}", self.log_tail(i), lost=True)

    def stop(self, restart: bool = False) -> None:
        """Let agents that were told to shut down exit, then SIGTERM, then SIGKILL; reap all. Idempotent.
        (``restart``: nothing outlives the agents here.)"""
        self._stopping = True
        deadline = time.monotonic() + self.stop_grace_s
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            alive = [p for p in self.procs if p.poll() is None]
            if not alive:
                break
            for p in alive:
                if sig is not None:
                    try:
                        p.send_signal(sig)
                    except ProcessLookupError:
                        pass
            for p in alive:
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            deadline = time.monotonic() + self.stop_grace_s / 2
        for p in self.procs:
            if p.poll() is None:  # pragma: no cover - SIGKILL cannot be refused
                p.wait()
        for f in self._files:
            f.close()
        self._files = []
        atexit.unregister(self.stop)

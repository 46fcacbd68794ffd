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
import multiprocessing.forkserver
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


def _stat(pid: int) -> tuple[str, int] | None:
    """Process ``pid``'s state letter and start time (clock ticks since boot) from /proc; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # after "pid (comm) ": state is field 3, starttime field 22
    return fields[0], int(fields[19])


def _running(pid: int, start: int | None = None) -> bool:
    """Whether process ``pid`` runs (not a zombie); with ``start``, whether it is still the one that started then."""
    st = _stat(pid)
    return st is not None and st[0] not in "ZX" and (start is None or st[1] == start)


class _Forked:
    """A forked agent with the part of :class:`subprocess.Popen`'s interface the launcher uses.

    Its exit status comes from the forkserver that forked it (``server_pid``). When that server dies, multiprocessing
    reports the status 255 for every agent it forked, running or not; then :attr:`orphaned` is set and whether the
    agent still runs comes from /proc (its pid and start time), so it is still signalled and waited for."""

    def __init__(self, proc: Any, server_pid: int | None):
        self.proc, self.pid, self.server_pid = proc, proc.pid, server_pid
        st = _stat(self.pid)
        self._start = st[1] if st else None
        self.orphaned = False

    def poll(self) -> int | None:
        rc = self.proc.exitcode
        if rc == 255 and not self.orphaned and self.server_pid is not None and not _running(self.server_pid):
            self.orphaned = True
        if self.orphaned:
            return None if _running(self.pid, self._start) else rc
        return rc

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        if not self.orphaned:
            self.proc.join(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:  # an orphan is not our child: poll /proc until it is gone
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"agent pid {self.pid}", timeout or 0.0)
            time.sleep(0.02)
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
                self.procs.append(_Forked(p, getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)))
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
            if getattr(p, "orphaned", False):
                now = "was still running" if rc is None else "has ended too (its exit status is lost with the server)"
                raise AgentFailure(str(i), f"the forkserver that started the agents (pid {p.server_pid}) died; the "
                                   f"agent's process (pid {p.pid}) {now} and is stopped with the others",
                                   self.log_tail(i), lost=True)
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

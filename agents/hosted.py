"""An agent in a process that someone else started and manages: a Ray actor (``launcher=ray``).

:class:`HostedAgent` is a plain class — ``controller/launchers/ray.py`` makes it remote at creation
(``ray.remote(HostedAgent).options(...).remote(...)``, as Ray's own ``util/queue.py`` does), and the
tests drive it without Ray. It runs the same :class:`~agents.agent.AgentProcess` as ``python -m
agents``: registration with the token, the protocol checks, windows over gRPC. Two things differ
from a subprocess agent, because the host process is not ours:

* its log goes to a buffer the launcher drains (:meth:`take_log`) into ``RUN_DIR/agents/agent-N.log``,
  since the host's stderr belongs to Ray (and may be on another machine);
* it does not end the process when the run is over: :meth:`run` returns the exit status the process
  would have had, and the launcher removes the actor.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from collections import deque
from typing import Any

from agents.observe.logs import LEVELS, LOG_FORMAT

__all__ = ["HostedAgent"]

log = logging.getLogger("lockstep.agent")


class _Buffer(logging.Handler):
    """Formatted log lines, kept until taken; the oldest are dropped (and counted) past ``max_lines``."""

    def __init__(self, max_lines: int):
        super().__init__()
        self.lines: deque[str] = deque(maxlen=max_lines)
        self.dropped = 0
        self.guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # noqa: BLE001 - logging must never raise into the agent
            self.handleError(record)
            return
        with self.guard:
            if len(self.lines) == self.lines.maxlen:
                self.dropped += 1
            self.lines.extend(text.splitlines() or [""])

    def take(self) -> list[str]:
        with self.guard:
            out = list(self.lines)
            if self.dropped:
                out.insert(0, f"... {self.dropped} earlier log lines dropped (the launcher did not collect them in time)")
            self.lines.clear()
            self.dropped = 0
        return out


class HostedAgent:
    """One agent hosted in someone else's process; see the module docstring."""

    def __init__(self, agent_id: int, log_level: str = "INFO", max_log_lines: int = 100_000):
        if log_level not in LEVELS:
            raise ValueError(f"log level {log_level!r} is not one of {' | '.join(LEVELS)}")
        self.agent_id = agent_id
        self._log = _Buffer(max_log_lines)
        self._log.setFormatter(logging.Formatter(f"[agent-{agent_id}]{LOG_FORMAT}"))  # as a subprocess agent's
        root = logging.getLogger()
        root.addHandler(self._log)
        root.setLevel(log_level)

    def where(self) -> dict[str, Any]:
        """The host process: hostname, pid, and the GPUs it may use (``CUDA_VISIBLE_DEVICES``, None when unset)."""
        return {"hostname": socket.gethostname(), "pid": os.getpid(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    def run(self, controller: str, run_id: str, token: str) -> int:
        """Serve the run as agent ``agent_id``: register at ``controller``, run windows until Shutdown.

        Returns the status ``python -m agents`` would exit with (0 done, 1 failed, 3 refused).
        """
        from agents.agent import AgentProcess
        from agents.common.trust import AgentTLS, Trust

        direct = os.environ.get("LOCKSTEP_DIRECT") != "0"
        try:
            # TLS files and trusted modules as `python -m agents` reads them: the launcher's extra_env,
            # which reaches the actor as its runtime_env (no secret in it: the token is an argument)
            return AgentProcess(controller, self.agent_id, run_id, token, direct=direct, tls=AgentTLS.from_env(),
                                trust=Trust.from_env()).run()
        except BaseException:
            log.exception("agent %d stopped with an error", self.agent_id)
            raise

    def take_log(self) -> list[str]:
        """The log lines written since the last call (called from another thread while :meth:`run` runs)."""
        return self._log.take()

"""One logging setup for every lockstep process (controller under Hydra, agent processes).

The controller's handlers come from Hydra (console, and ``lockstep.log`` in the
run directory, ``hydra.job.name: lockstep``); an agent process calls
:func:`configure_logging` with the run's ``log_level`` and, when its launcher
collects logs into the run directory, lets the launcher redirect its stderr to
``<run_dir>/agents/agent-<N>.log`` (``controller.observe.agent_log_path``).
"""
from __future__ import annotations

import logging
import os
import sys

__all__ = ["LOG_FORMAT", "LEVELS", "configure_logging"]

LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] %(message)s"
"""The same as Hydra's job logging, so controller and agent logs read alike."""

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def configure_logging(level: str = "INFO", path: str | os.PathLike[str] | None = None,
                      process: str | None = None) -> None:
    """Root logger at ``level`` to stderr (or ``path``); ``process`` (e.g. ``agent-3``) prefixes lines."""
    if level not in LEVELS:
        raise ValueError(f"log level {level!r} is not one of {' | '.join(LEVELS)}")
    fmt = LOG_FORMAT if process is None else f"[{process}]{LOG_FORMAT}"
    handler: logging.Handler = logging.FileHandler(path) if path is not None else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(fmt))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)

"""The forkserver that local agents are forked from (``launcher.start_method=forkserver``; agents/forked.py).

Only the standard library here: the CLI starts the server before it imports anything heavy
(controller/cli.py), so that the server's imports overlap the controller's own.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import signal
import threading
from typing import Any

__all__ = ["FORKSERVER_PRELOAD", "warm_forkserver"]

FORKSERVER_PRELOAD = ["agents.forked"]
"""What the forkserver imports before it forks agents: torch, grpc, the engine (not torch._dynamo: no run needs the
compiler unless it batches by vmap, and then the agent imports it while preparing, agents.core)."""


def warm_forkserver() -> Any:
    """The forkserver context, its server started (importing the preload runs on there, in the background).

    One server per controller process, shared by every run it makes (a test session, a sweep); it exits
    with the controller. Call early: the imports then overlap the controller's own start-up.
    """
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(FORKSERVER_PRELOAD)
    # Ctrl-C in the terminal reaches the whole process group: the server must not die of it (with a traceback)
    # while it imports, before it ignores SIGINT itself. So it starts with SIGINT ignored (that survives exec);
    # meanwhile SIGINT is blocked here, so one sent to the controller stays pending instead of being dropped.
    if threading.current_thread() is not threading.main_thread():
        multiprocessing.forkserver.ensure_running()
        return ctx
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return ctx

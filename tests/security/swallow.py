"""A strategy whose import, in the controller, meets Ctrl-C inside code that swallows every exception.

That is the start-up window the flaky ``test_ctrl_c_stops_the_controller_and_every_agent_within_seconds``
fell into: a SIGINT landing while a library ran a broad ``except`` (an import, config composition) became a
KeyboardInterrupt there, was swallowed, and the run went on. Agents never import this module (the plan
names the PS classes it inherits), so only the controller meets the interrupt.
"""
import os
import signal
import time

from agents.strategies.ps import PSAsync

try:
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)  # the signal is handled here
except BaseException:  # noqa: BLE001 - on purpose: what a library's broad except does to a KeyboardInterrupt
    pass


class SwallowingPSAsync(PSAsync):
    name = "swallowing_ps_async"

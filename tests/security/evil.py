"""A module no agent should import: importing it leaves a marker file ($LOCKSTEP_TEST_MARKER).

A forged plan names its class; an agent that trusts only registered strategies never imports it.
"""
import os
from pathlib import Path

if os.environ.get("LOCKSTEP_TEST_MARKER"):
    Path(os.environ["LOCKSTEP_TEST_MARKER"]).write_text("imported by a forged plan\n")


class Marker:
    pass

"""The progress bar and the run's log lines share the terminal: a log line written during the run goes on a line of
its own above the bar (tqdm's logging redirection), not onto the end of the bar's line. Hydra's console handler
writes to stdout and the bar to stderr; a terminal shows both, so the test reads them as one stream."""
from __future__ import annotations

import re
import subprocess
import sys

from tests.helpers import FAST

_CONSOLE_LINE = re.compile(r"(.)?\[[0-9 :,-]+\]\[controller\.run\]\[INFO\] - an earlier run's outputs")


def _run(run_dir) -> subprocess.CompletedProcess:
    overrides = [o for o in FAST if not o.startswith("progress=")]
    return subprocess.run([sys.executable, "-m", "controller.cli", "run", *overrides, "progress=true",
                           "stop.updates=30", f"hydra.run.dir={run_dir}"],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)


def test_a_log_line_during_the_run_starts_its_own_line_above_the_bar(tmp_path):
    run_dir = tmp_path / "run"
    assert _run(run_dir).returncode == 0
    again = _run(run_dir)  # the earlier run's outputs are removed, and the run says so while its bar is shown
    assert again.returncode == 0, again.stdout
    found = _CONSOLE_LINE.search(again.stdout)
    assert found is not None, again.stdout
    # at the start of the output or of a line ("\n"), or after tqdm cleared the bar's line ("\r")
    assert found.group(1) in (None, "\n", "\r"), repr(again.stdout[max(0, found.start() - 80):found.end()])
    assert "lockstep:   0%" in again.stdout  # the bar was shown before the line...
    assert again.stdout.rstrip().splitlines()[-1].startswith("lockstep: outputs in ")  # ...and the run ended

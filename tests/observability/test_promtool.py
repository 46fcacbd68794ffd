"""`promtool check metrics` finds nothing to say about a lockstep exposition."""
from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry

from agents.observe.metrics import Metrics, write_exposition

from .test_metrics import _populate


def promtool_check(text: bytes) -> subprocess.CompletedProcess[bytes]:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is not on PATH; install it with scripts/install-prometheus.sh")
    return subprocess.run([exe, "check", "metrics"], input=text, capture_output=True, timeout=30)


@pytest.mark.parametrize("role", ["controller", "agent"])
@pytest.mark.parametrize("per_worker", [False, True])
def test_promtool_check_metrics_reports_nothing(tmp_path, role, per_worker):
    reg = CollectorRegistry()
    _populate(Metrics(reg, role=role, per_worker=per_worker))
    path = write_exposition(reg, tmp_path / "metrics.prom")
    result = promtool_check(path.read_bytes())
    assert (result.returncode, result.stdout + result.stderr) == (0, b"")


def test_promtool_check_metrics_does_complain_about_a_bad_name():
    """The check above can fail: a counter without _total and a non-base unit are reported."""
    bad = b"# HELP x_milliseconds x\n# TYPE x_milliseconds counter\nx_milliseconds 1\n"
    result = promtool_check(bad)
    assert result.returncode != 0 and b"x_milliseconds" in result.stdout + result.stderr

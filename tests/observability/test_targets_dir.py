"""One Prometheus follows every run of a machine through one directory (docs/observability.md, "Pointing
Prometheus at a run"): its file discovery takes a wildcard only in a path's last element, so the doc's
``outputs/*/*/prometheus-targets.json`` was refused; each serving run now also lists its endpoints in
``targets_dir()`` and removes them when it stops serving."""
from __future__ import annotations

import hashlib
import json
import signal

import pytest

from controller.observe import TARGETS_DIR_ENV

from . import runs
from .prom import value

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_one_prometheus_follows_a_run_through_the_shared_targets_directory(prom_server, tmp_path, monkeypatch):
    shared = tmp_path / "targets"
    shared.mkdir()  # as the doc says: Prometheus watches a directory that exists when it starts
    monkeypatch.setenv(TARGETS_DIR_ENV, str(shared))  # the run inherits it
    prom = prom_server(file_sd=[shared / "*.json"])
    run_dir = tmp_path / "run"
    proc = runs.start(run_dir, "workers=4", "stop.updates=200", "eval.every=0", "metrics.port=0",
                      "metrics.linger_s=300", "trace.mode=off")
    try:
        runs.poll("the run finished", (run_dir / "metrics.prom").exists, 180, proc)  # written before the linger
        summary = json.loads((run_dir / "summary.json").read_text())
        digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:8]
        assert [p.name for p in shared.iterdir()] == [f"{summary['run_id']}-{digest}.json"]
        assert (shared / f"{summary['run_id']}-{digest}.json").read_text() == \
            (run_dir / "prometheus-targets.json").read_text()
        run = f'run_id="{summary["run_id"]}"'
        prom.wait_for(f'lockstep_updates_total{{job="controller",{run}}}', 30,
                      lambda r: bool(r) and value(r) == 200)
        prom.wait_for(f'lockstep_events_total{{job="agent",{run}}}', 30,
                      lambda r: bool(r) and value(r) == summary["events"])
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # ends the linger; the run has written everything
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert list(shared.iterdir()) == []  # the run stopped serving: Prometheus stops scraping it
    runs.poll("Prometheus dropped the run's targets", lambda: prom.targets() == [], 30)
    assert json.loads((run_dir / "prometheus-targets.json").read_text())[0]["labels"] == {
        "job": "controller", "run_id": summary["run_id"]}  # the run's own copy stays with its outputs

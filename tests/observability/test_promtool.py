"""`promtool check metrics` finds nothing to say about a lockstep exposition; `promtool check config` accepts
the Prometheus config docs/observability.md gives."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from agents.observe.metrics import Metrics, write_exposition, write_scrape_targets
from controller.observe import TARGETS_DIR_ENV, targets_dir

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


DOC = Path(__file__).resolve().parents[2] / "docs" / "observability.md"


def documented_prometheus_config() -> str:
    """The ```yaml block of docs/observability.md that starts with ``# prometheus.yml``, exactly as written."""
    blocks = re.findall(r"```yaml\n(# prometheus\.yml\n.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1, f"{DOC} should have one prometheus.yml block, has {len(blocks)}"
    return blocks[0]


def promtool_check_config(text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.fail("promtool is not on PATH; install it with scripts/install-prometheus.sh")
    path = tmp_path / "prometheus.yml"
    path.write_text(text)
    return subprocess.run([exe, "check", "config", str(path)], capture_output=True, text=True, timeout=30)


def test_promtool_check_config_accepts_the_documented_prometheus_config(tmp_path):
    config, pattern = tmp_path / "prometheus.yml", "/home/me/.cache/lockstep/prometheus-targets/*.json"
    result = promtool_check_config(documented_prometheus_config(), tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (
        0, f"Checking {config}\n  WARNING: file \"{pattern}\" for file_sd in scrape job \"lockstep\" does not exist\n"
           f" SUCCESS: {config} is valid prometheus config file syntax\n\n", "")
    # with a run's file there, promtool reads it too: no warning
    cache = tmp_path / "cache"
    (cache / "lockstep" / "prometheus-targets").mkdir(parents=True)
    write_scrape_targets(cache / "lockstep" / "prometheus-targets" / "r-1-0123abcd.json",
                         {"controller": ["127.0.0.1:9100"], "agent": ["127.0.0.1:9101"]}, run_id="r-1")
    result = promtool_check_config(documented_prometheus_config().replace("/home/me/.cache", str(cache)), tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (
        0, f"Checking {config}\n SUCCESS: {config} is valid prometheus config file syntax\n\n", "")


def test_promtool_check_config_refuses_a_wildcard_before_the_last_path_element(tmp_path):
    """The check above can fail: the config the doc gave until 2026-12 is refused."""
    old = documented_prometheus_config().replace("/home/me/.cache/lockstep/prometheus-targets/*.json",
                                                 "/path/to/lockstep/outputs/*/*/prometheus-targets.json")
    result = promtool_check_config(old, tmp_path)
    assert result.returncode == 1
    assert ('path name "/path/to/lockstep/outputs/*/*/prometheus-targets.json" is not valid for file discovery'
            in result.stdout + result.stderr)


def test_the_documented_files_pattern_matches_where_a_run_lists_its_endpoints(monkeypatch):
    files = yaml.safe_load(documented_prometheus_config())["scrape_configs"][0]["file_sd_configs"][0]["files"]
    monkeypatch.setenv("HOME", "/home/me")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv(TARGETS_DIR_ENV, raising=False)
    assert targets_dir() == Path("/home/me/.cache/lockstep/prometheus-targets")
    assert files == [str(targets_dir() / "*.json")]
    monkeypatch.setenv("XDG_CACHE_HOME", "/var/cache/me")
    assert targets_dir() == Path("/var/cache/me/lockstep/prometheus-targets")
    monkeypatch.setenv(TARGETS_DIR_ENV, "/srv/prometheus/lockstep")
    assert targets_dir() == Path("/srv/prometheus/lockstep")

"""A real Prometheus server for tests: generated config, tmp dir, free port, 127.0.0.1.

Use the ``prom_server`` fixture (re-exported by this directory's conftest.py;
elsewhere, import it into your conftest.py with
``from tests.observability.prom import prom_server``)::

    def test_run_is_scraped(prom_server):
        prom = prom_server(targets={"controller": ["127.0.0.1:9100"]})  # returns once all targets are up
        prom.wait_for("lockstep_updates_total", timeout_s=30, predicate=lambda r: value(r) == 100)
        assert prom.value("lockstep_training_loss") == pytest.approx(0.25)

or, outside pytest, ``with run_prometheus(targets, workdir) as prom: ...``.
Nothing here sleeps to let things settle: every wait polls the HTTP API until
a condition holds or a deadline passes, then fails saying what it last saw.
"""
from __future__ import annotations

import contextlib
import json
import math
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

__all__ = ["Prometheus", "PrometheusError", "prom_server", "run_prometheus", "value"]

POLL_S = 0.05
"""Pause between two polls of the HTTP API (a poll interval, not a settle time)."""

Result = list[dict[str, Any]]


class PrometheusError(RuntimeError):
    """The server could not start, a query failed, or a wait ran past its deadline."""


def value(result: Result) -> float:
    """The value of a query result that has exactly one series (instant vector or scalar)."""
    if len(result) != 1:
        raise PrometheusError(f"expected exactly one series, got {len(result)}: {result}")
    return float(result[0]["value"][1])


def has_finite_value(result: Result) -> bool:
    """True when some series of an instant query has a number that is not NaN or ±Inf."""
    return any(math.isfinite(float(s["value"][1])) for s in result)


class Prometheus:
    """A running Prometheus: ``url``, ``query()``, ``wait_for()``; ``stop()`` ends it."""

    def __init__(self, url: str, process: subprocess.Popen[bytes], workdir: Path, log_path: Path):
        self.url = url
        self.process = process
        self.workdir = workdir
        self.log_path = log_path

    # -- HTTP API -----------------------------------------------------------

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>`` and return its ``data``; raises PrometheusError on an error reply."""
        url = f"{self.url}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as e:  # 400/422 carry a JSON body naming the PromQL error
            try:
                body = json.load(e)
            except ValueError:
                raise PrometheusError(f"GET {url}: HTTP {e.code}") from e
        if body.get("status") != "success":
            raise PrometheusError(f"GET {url}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> Result:
        """Evaluate ``expr`` now (or at unix time ``at``); returns the list of series.

        Each series is ``{"metric": {label: value}, "value": [t, "number"]}``; a
        scalar result is returned as one series with no labels.
        """
        params = {"query": expr}
        if at is not None:
            params["time"] = repr(at)
        data = self.api("query", **params)
        if data["resultType"] in ("scalar", "string"):
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def value(self, expr: str) -> float:
        """The number of a query that returns exactly one series."""
        return value(self.query(expr))

    def wait_for(self, expr: str, timeout_s: float = 30.0,
                 predicate: Callable[[Result], bool] = bool) -> Result:
        """Poll ``expr`` until ``predicate(result)`` holds (default: any series) and return it.

        Raises PrometheusError after ``timeout_s`` seconds, with the last result.
        """
        return self._poll(lambda: self.query(expr), predicate, timeout_s, f"query {expr!r}")

    def targets(self) -> list[dict[str, Any]]:
        return self.api("targets", state="active")["activeTargets"]

    def wait_until_up(self, n_targets: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """Poll /api/v1/targets until ``n_targets`` targets exist and each was scraped successfully."""
        def all_up(ts: list[dict[str, Any]]) -> bool:
            return len(ts) == n_targets and all(t["health"] == "up" for t in ts)
        return self._poll(self.targets, all_up, timeout_s, f"{n_targets} targets up")

    # -- lifecycle ----------------------------------------------------------

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _poll(self, fetch: Callable[[], Any], ok: Callable[[Any], bool], timeout_s: float,
              what: str) -> Any:
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while True:
            if self.process.poll() is not None:
                raise PrometheusError(f"prometheus exited ({self.process.returncode}) while waiting "
                                      f"for {what}; log:\n{self.log_tail()}")
            last = fetch()
            if ok(last):
                return last
            if time.monotonic() >= deadline:
                raise PrometheusError(f"{what}: not true after {timeout_s}s; last saw {last}")
            time.sleep(POLL_S)


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _config(targets: Mapping[str, Sequence[str]], file_sd: Sequence[Path],
            scrape_interval: str) -> str:
    scrape_configs: list[dict[str, Any]] = [
        {"job_name": job, "static_configs": [{"targets": list(addrs)}]}
        for job, addrs in targets.items()]
    if file_sd:  # each file's groups carry their own job label, which wins over job_name
        scrape_configs.append({"job_name": "file_sd", "file_sd_configs": [
            {"files": [str(f) for f in file_sd], "refresh_interval": scrape_interval}]})
    # JSON is valid YAML, and json.dumps quotes every string safely.
    return json.dumps({
        "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval,
                   "evaluation_interval": scrape_interval},
        "scrape_configs": scrape_configs,
    }, indent=2)


def _count_file_sd_targets(files: Sequence[Path]) -> int:
    """Targets listed in the file_sd files that exist now (a run writes its file when it starts)."""
    return sum(len(group["targets"]) for f in files if Path(f).exists()
               for group in json.loads(Path(f).read_text()))


def _as_jobs(targets: Sequence[str] | Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    if isinstance(targets, str):
        raise TypeError("targets must be a list of host:port or a {job: [host:port]} mapping, not a string")
    jobs = dict(targets) if isinstance(targets, Mapping) else {"lockstep": list(targets)}
    return {job: list(addrs) for job, addrs in jobs.items() if addrs}


@contextlib.contextmanager
def run_prometheus(targets: Sequence[str] | Mapping[str, Sequence[str]] = (),
                   workdir: Path | None = None, *, file_sd: Sequence[Path] = (),
                   scrape_interval: str = "1s", host: str = "127.0.0.1",
                   timeout_s: float = 30.0, binary: str = "prometheus") -> Iterator[Prometheus]:
    """Start Prometheus scraping ``targets`` (``["host:port"]`` as job ``lockstep``, or
    ``{job: ["host:port", ...]}``) and the targets listed in ``file_sd`` files (such as a
    run's ``prometheus-targets.json``); yield it once ready and every target is up; stop it after.

    A ``file_sd`` file that does not exist yet is watched: start Prometheus before a run
    so that it scrapes the run from its first second."""
    if workdir is None:
        raise TypeError("run_prometheus needs a workdir for its config, data and log")
    exe = shutil.which(binary)
    if exe is None:
        raise PrometheusError(f"{binary!r} is not on PATH; install it with scripts/install-prometheus.sh")
    jobs = _as_jobs(targets)
    n_targets = sum(len(a) for a in jobs.values()) + _count_file_sd_targets(file_sd)
    if n_targets == 0 and not file_sd:
        raise ValueError("run_prometheus: no targets given (targets= or file_sd=)")
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(_config(jobs, [Path(f).resolve() for f in file_sd], scrape_interval))
    log_path = workdir / "prometheus.log"

    prom: Prometheus | None = None
    for _attempt in range(3):  # the free port can be taken between probe and bind: retry
        port = _free_port(host)
        with log_path.open("ab") as log:
            proc = subprocess.Popen(
                [exe, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address={host}:{port}", "--storage.tsdb.retention.time=1h",
                 "--log.level=info"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        candidate = Prometheus(f"http://{host}:{port}", proc, workdir, log_path)
        if _wait_ready(candidate, timeout_s):
            prom = candidate
            break
        candidate.stop()
        if "address already in use" not in candidate.log_tail(50):
            raise PrometheusError(f"prometheus did not become ready; log:\n{candidate.log_tail()}")
    if prom is None:
        raise PrometheusError("prometheus could not bind a free port in 3 attempts")
    try:
        if n_targets:
            prom.wait_until_up(n_targets, timeout_s)
        yield prom
    finally:
        prom.stop()


def _wait_ready(prom: Prometheus, timeout_s: float) -> bool:
    """Poll /-/ready; False if the process exits first, PrometheusError past the deadline."""
    deadline = time.monotonic() + timeout_s
    while prom.process.poll() is None:
        try:
            with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # not listening yet, or still loading its storage (503)
        if time.monotonic() >= deadline:
            prom.stop()
            raise PrometheusError(f"prometheus not ready after {timeout_s}s; log:\n{prom.log_tail()}")
        time.sleep(POLL_S)
    return False


@pytest.fixture
def prom_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Prometheus]]:
    """Factory fixture: ``prom_server(targets=..., file_sd=[...], scrape_interval="1s")`` starts a
    Prometheus that scrapes them and returns it once every target is up; all stop at teardown."""
    stack = contextlib.ExitStack()

    def start(targets: Sequence[str] | Mapping[str, Sequence[str]] = (), **kwargs: Any) -> Prometheus:
        workdir = tmp_path_factory.mktemp("prometheus")
        return stack.enter_context(run_prometheus(targets, workdir, **kwargs))

    with stack:
        yield start

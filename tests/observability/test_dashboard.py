"""The Grafana dashboard: fresh from its generator, loads in the SDK's model, covers every metric."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models import dashboard as dash_m
from grafana_foundation_sdk.models import prometheus as prom_m
from prometheus_client import CollectorRegistry

from agents.observe.metrics import Metrics

from . import dashboard


def _drop_empty(x: Any) -> Any:
    """The SDK writes absent optional objects as ``{}``; compare without them."""
    if isinstance(x, dict):
        return {k: _drop_empty(v) for k, v in x.items() if v != {}}
    if isinstance(x, list):
        return [_drop_empty(v) for v in x]
    return x


def test_committed_dashboard_is_what_the_generator_writes():
    result = subprocess.run([sys.executable, str(dashboard.GENERATOR), "--check"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_dashboard_loads_in_the_sdk_model_without_losing_anything():
    register_default_plugins()
    raw = dashboard.load()
    model = dash_m.Dashboard.from_json(raw)
    again = json.loads(JSONEncoder().encode(model))
    assert _drop_empty(again) == _drop_empty(raw)
    targets = [t for p in model.panels or [] if isinstance(p, dash_m.Panel) for t in p.targets or []]
    assert targets and all(isinstance(t, prom_m.Dataquery) for t in targets)


def test_every_panel_queries_the_templated_prometheus_datasource():
    d = dashboard.load()
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for p in dashboard.panels(d):
        if p["type"] == "row":
            continue
        for ref in [p["datasource"]] + [t["datasource"] for t in p["targets"]]:
            assert ref == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}, p["title"]


def test_dashboard_has_the_panels_the_issue_asks_for():
    exprs = " ".join(e for _, e in dashboard.expressions(dashboard.load()))
    f = '{namespace=~"$namespace", release=~"$release", run_id=~"$run"}'
    for needle in ("lockstep_virtual_time_seconds", "lockstep_speed_ratio", "lockstep_training_loss",
                   "lockstep_test_accuracy_ratio", f"sum by (run_id) (rate(lockstep_updates_total{f}[",
                   "lockstep_staleness_updates_bucket", "histogram_quantile(0.9, sum by (run_id, le) "
                   f"(rate(lockstep_barrier_wait_seconds_bucket{f}[",
                   f"sum by (run_id, scope) (rate(lockstep_message_bytes_total{f}[", "lockstep_agents",
                   f"rate(lockstep_events_total{f}["):
        assert needle in exprs
    heatmaps = [p for p in dashboard.panels(dashboard.load()) if p["type"] == "heatmap"]
    assert [t["format"] for p in heatmaps for t in p["targets"]] == ["heatmap"]


def test_every_metric_family_except_per_worker_ones_is_on_the_dashboard():
    exprs = " ".join(e for _, e in dashboard.expressions(dashboard.load()))
    for role in ("controller", "agent"):
        reg = CollectorRegistry()
        Metrics(reg, role=role)
        for fam in reg.collect():
            assert fam.name in exprs, f"{fam.name} ({role}) is not shown on the dashboard"


def test_every_expression_keeps_only_the_chosen_runs_and_never_sums_across_runs():
    d = dashboard.load()
    variables = {v["name"]: v for v in d["templating"]["list"]}
    for name, label in (("namespace", "namespace"), ("release", "release"), ("run", "run_id")):
        v = variables[name]
        assert (v["type"], v["multi"], v["includeAll"], v["allValue"]) == ("query", True, True, ".*")
        assert v["query"].startswith("label_values(lockstep_virtual_time_seconds") and v["query"].endswith(
            f", {label})")
    f = '{namespace=~"$namespace", release=~"$release", run_id=~"$run"}'
    for title, expr in dashboard.expressions(d):
        names = re.findall(r"lockstep_\w+", expr)
        assert names and all(expr.count(n + f) == expr.count(n) for n in set(names)), (title, expr)
        for agg in re.findall(r"(?<!\w)sum(?: by \(([^)]*)\))?", expr):
            assert "run_id" in agg or (title == "Staleness" and agg == "le"), (title, expr)

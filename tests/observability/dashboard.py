"""Reading the committed Grafana dashboard: its JSON and every PromQL expression in it."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts/lockstep/dashboards/lockstep.json"
GENERATOR = ROOT / "scripts/make-dashboard.py"

# Grafana's built-in interval variables, replaced as Grafana would for a 1 s scrape
# interval, but wide enough that a rate sees two scrapes of a test server.
GRAFANA_INTERVALS = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "1m"}
VARIABLES = ("namespace", "release", "run")
_VARIABLE = re.compile(r"\$\{?\w+")


def load() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, including those nested in collapsed rows."""
    out = []
    for p in dashboard.get("panels", []):
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, expr)`` for every Prometheus target of the dashboard."""
    return [(p.get("title", ""), t["expr"])
            for p in panels(dashboard) for t in p.get("targets", []) if "expr" in t]


def runnable(expr: str, namespace: str = ".*", release: str = ".*", run: str = ".*") -> str:
    """``expr`` with Grafana's interval variables and the dashboard's own (namespace, release, run: each a
    regex, All = ``.*`` as the dashboard's allValue) replaced; raises on any other variable."""
    for var, val in GRAFANA_INTERVALS.items():
        expr = expr.replace(var, val)
    for var, val in (("$namespace", namespace), ("$release", release), ("$run", run)):
        expr = expr.replace(var, val)
    left = _VARIABLE.findall(expr)
    if left:
        raise ValueError(f"dashboard expression {expr!r} uses variables {left} "
                         "the tests do not know how to substitute")
    return expr

#!/usr/bin/env python3
"""Generate charts/lockstep/dashboards/lockstep.json, the Grafana dashboard of a run.

Built with grafana-foundation-sdk (the `dev` extra) so panels and queries are
typed; the JSON is committed and tests/observability checks that this script
still produces it byte for byte. Regenerate after editing:

    .venv/bin/python scripts/make-dashboard.py
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.builders import heatmap as heatmap_b
from grafana_foundation_sdk.builders import prometheus as prom_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import timeseries as ts_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_m
from grafana_foundation_sdk.models import dashboard as dash_m
from grafana_foundation_sdk.models import heatmap as heatmap_m
from grafana_foundation_sdk.models import prometheus as prom_m

OUT = Path(__file__).resolve().parent.parent / "charts/lockstep/dashboards/lockstep.json"
UID = "lockstep-runs"  # the chart gives each release's copy a uid of its own

# Every panel queries the data source picked in this variable: provisioning
# (the chart's ConfigMap) resolves it to the default Prometheus, and a manual
# import lets the user choose.
DS_VAR = "DS_PROMETHEUS"
DS = dash_m.DataSourceRef(type_val="prometheus", uid="${%s}" % DS_VAR)

RATE = "$__rate_interval"

# Many runs at once: every query keeps only the series of the chosen namespaces, releases and runs
# (variables namespace, release, run; All = ".*", which also matches a series without the label, as
# a local run's has no namespace or release), and sums per run, never across runs.
FILTER = 'namespace=~"$namespace", release=~"$release", run_id=~"$run"'
VARIABLES = (  # name, label, the label it reads, the filter of its own query
    ("namespace", "Namespace", "namespace", ""),
    ("release", "Release", "release", 'namespace=~"$namespace"'),
    ("run", "Run", "run_id", 'namespace=~"$namespace", release=~"$release"'),
)


def m(name: str) -> str:
    """A metric selector with the dashboard's filter."""
    return f"{name}{{{FILTER}}}"


def variable(name: str, label: str, source: str, filt: str) -> dash_b.QueryVariable:
    return (dash_b.QueryVariable(name).label(label).datasource(DS)
            .query(f"label_values(lockstep_virtual_time_seconds{'{' + filt + '}' if filt else ''}, {source})")
            .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dash_m.VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*")
            .current(dash_m.VariableOption(text="All", value=["$__all"], selected=True)))


def query(expr: str, legend: str = "", ref: str = "A", fmt: prom_m.PromQueryFormat | None = None,
          instant: bool = False) -> prom_b.Dataquery:
    q = prom_b.Dataquery().expr(expr).ref_id(ref).datasource(DS)
    if legend:
        q = q.legend_format(legend)
    if fmt is not None:
        q = q.format(fmt)
    if instant:
        q = q.instant()
    return q


def pos(x: int, y: int, w: int, h: int = 8) -> dash_m.GridPos:
    return dash_m.GridPos(h=h, w=w, x=x, y=y)


def legend() -> common_b.VizLegendOptions:
    return (common_b.VizLegendOptions().display_mode(common_m.LegendDisplayMode.LIST)
            .placement(common_m.LegendPlacement.BOTTOM).show_legend(True))


def timeseries(title: str, description: str, unit: str, grid: dash_m.GridPos,
               *targets: prom_b.Dataquery, min_zero: bool = True) -> ts_b.Panel:
    p = (ts_b.Panel().title(title).description(description).unit(unit).datasource(DS)
         .grid_pos(grid).legend(legend()))
    if min_zero:
        p = p.min(0)
    for t in targets:
        p = p.with_target(t)
    return p


def build() -> dash_b.Dashboard:
    d = (
        dash_b.Dashboard("lockstep runs")
        .uid(UID)
        .description("lockstep runs, one series per run (variables namespace, release, run): virtual "
                     "time, training progress, the window barrier, messages and agents. Metrics: "
                     "docs/observability.md.")
        .tags(["lockstep", "training", "emulation"])
        .refresh("5s")
        .time("now-15m", "now")
        .timezone(common_m.TimeZoneBrowser)
        .editable()
        .with_variable(dash_b.DatasourceVariable(DS_VAR).label("Prometheus").type("prometheus"))
    )
    for v in VARIABLES:
        d = d.with_variable(variable(*v))

    y = 0
    d = d.with_row(dash_b.Row("Progress").grid_pos(pos(0, y, 24, 1)))
    y += 1
    d = d.with_panel(timeseries(
        "Virtual time", "Virtual time reached: the controller's global clock and each agent's "
        "local clock.", "s", pos(0, y, 9),
        query(m("lockstep_virtual_time_seconds"), "{{run_id}} {{job}} {{instance}}")))
    d = d.with_panel(timeseries(
        "Speed ratio", "Virtual seconds emulated per wall second (above 1: faster than the "
        "real cluster would run).", "x", pos(9, y, 9),
        query(m("lockstep_speed_ratio"), "{{run_id}}")))
    d = d.with_panel(
        stat_b.Panel().title("Run").description("lockstep_run_info: strategy, vworkers, agents.")
        .datasource(DS).grid_pos(pos(18, y, 6))
        .with_target(query(m("lockstep_run_info"),
                           "{{strategy}} · {{workers}} vworkers · {{agents}} agents · {{run_id}}",
                           instant=True))
        .text_mode(common_m.BigValueTextMode.NAME)
        .color_mode(common_m.BigValueColorMode.NONE)
        .graph_mode(common_m.BigValueGraphMode.NONE)
        .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"])))
    y += 8

    d = d.with_row(dash_b.Row("Training").grid_pos(pos(0, y, 24, 1)))
    y += 1
    d = d.with_panel(timeseries(
        "Training loss", "Loss of the global model update with the latest virtual time.",
        "none", pos(0, y, 8), query(m("lockstep_training_loss"), "{{run_id}}")))
    d = d.with_panel(timeseries(
        "Test accuracy", "Test accuracy of the global model at the last evaluation.",
        "percentunit", pos(8, y, 8), query(m("lockstep_test_accuracy_ratio"), "{{run_id}}"))
        .max(1))
    d = d.with_panel(timeseries(
        "Updates per second", "Global model updates per wall second.", "ops", pos(16, y, 8),
        query(f"sum by (run_id) (rate({m('lockstep_updates_total')}[{RATE}]))", "{{run_id}}")))
    y += 8
    d = d.with_panel(
        heatmap_b.Panel().title("Staleness")
        .description("Staleness of updates (model versions between read and update), from the "
                     "lockstep_staleness_updates histogram buckets of the chosen runs together.")
        .datasource(DS).grid_pos(pos(0, y, 12))
        .with_target(query(f"sum by (le) (increase({m('lockstep_staleness_updates_bucket')}[{RATE}]))",
                           "{{le}}", fmt=prom_m.PromQueryFormat.HEATMAP))
        .calculate(False)
        .y_axis(heatmap_b.YAxisConfig().unit("none").decimals(0))
        .color(heatmap_b.HeatmapColorOptions().mode(heatmap_m.HeatmapColorMode.SCHEME)
               .scheme("Oranges").scale(heatmap_m.HeatmapColorScale.EXPONENTIAL).exponent(0.5))
        .cell_values(heatmap_b.CellValues().unit("short")))
    d = d.with_panel(timeseries(
        "Mean staleness", "Average staleness of the updates in the interval.", "none",
        pos(12, y, 12),
        query(f"sum by (run_id) (rate({m('lockstep_staleness_updates_sum')}[{RATE}])) / "
              f"sum by (run_id) (rate({m('lockstep_staleness_updates_count')}[{RATE}]))", "{{run_id}}")))
    y += 8

    d = d.with_row(dash_b.Row("Engine").grid_pos(pos(0, y, 24, 1)))
    y += 1
    d = d.with_panel(timeseries(
        "Barrier wait", "Wall time the controller waited at each window barrier (quantiles).",
        "s", pos(0, y, 8),
        *[query(f"histogram_quantile({q}, sum by (run_id, le) "
                f"(rate({m('lockstep_barrier_wait_seconds_bucket')}[{RATE}])))", f"{{{{run_id}}}} p{int(q * 100)}", ref)
          for q, ref in ((0.5, "A"), (0.9, "B"), (0.99, "C"))]))
    d = d.with_panel(timeseries(
        "Windows and events per second", "Time windows completed (controller) and kernel "
        "events processed (all agents) per wall second.", "ops", pos(8, y, 8),
        query(f"sum by (run_id) (rate({m('lockstep_windows_total')}[{RATE}]))", "{{run_id}} windows/s", "A"),
        query(f"sum by (run_id) (rate({m('lockstep_events_total')}[{RATE}]))", "{{run_id}} events/s", "B")))
    d = d.with_panel(timeseries(
        "Compute", "Real compute seconds per wall second (busy cores or devices) by kind, and "
        "virtual compute seconds charged by the compute model.", "s", pos(16, y, 8),
        query(f"sum by (run_id, kind) (rate({m('lockstep_compute_seconds_total')}[{RATE}]))",
              "{{run_id}} {{kind}} real", "A"),
        query(f"sum by (run_id, kind) (rate({m('lockstep_compute_virtual_seconds_total')}[{RATE}]))",
              "{{run_id}} {{kind}} virtual", "B")))
    y += 8

    d = d.with_row(dash_b.Row("Network and agents").grid_pos(pos(0, y, 24, 1)))
    y += 1
    d = d.with_panel(timeseries(
        "Bytes per second", "Payload bytes of messages sent per wall second, local (same agent) "
        "vs remote (across agents).", "Bps", pos(0, y, 8),
        query(f"sum by (run_id, scope) (rate({m('lockstep_message_bytes_total')}[{RATE}]))",
              "{{run_id}} {{scope}}")))
    d = d.with_panel(timeseries(
        "Messages per second", "Messages sent per wall second, local vs remote.", "ops",
        pos(8, y, 8),
        query(f"sum by (run_id, scope) (rate({m('lockstep_messages_total')}[{RATE}]))", "{{run_id}} {{scope}}")))
    d = d.with_panel(timeseries(
        "Agents", "Agents by state.", "none", pos(16, y, 8),
        query(f"sum by (run_id, state) ({m('lockstep_agents')})", "{{run_id}} {{state}}"))
        .stacking(common_b.StackingConfig().mode(common_m.StackingMode.NORMAL)))
    y += 8

    d = d.with_row(dash_b.Row("Data on the network").grid_pos(pos(0, y, 24, 1)))
    y += 1
    d = d.with_panel(timeseries(
        "Cache hits and misses", "Samples training workers found in their node's LRU cache, and samples "
        "they fetched from their end devices (data.placement=end_devices), per wall second.", "ops",
        pos(0, y, 8),
        query(f"sum by (run_id) (rate({m('lockstep_data_cache_hits_total')}[{RATE}]))", "{{run_id}} hits", "A"),
        query(f"sum by (run_id) (rate({m('lockstep_data_cache_misses_total')}[{RATE}]))", "{{run_id}} misses",
              "B")))
    d = d.with_panel(timeseries(
        "Data moved", "Bytes of training samples moved over the network per wall second.", "Bps", pos(8, y, 8),
        query(f"sum by (run_id) (rate({m('lockstep_data_moved_bytes_total')}[{RATE}]))", "{{run_id}}")))
    d = d.with_panel(timeseries(
        "Waiting for data", "Virtual seconds training workers waited for their samples, per wall second.", "s",
        pos(16, y, 8),
        query(f"sum by (run_id) (rate({m('lockstep_data_wait_seconds_total')}[{RATE}]))", "{{run_id}}")))
    return d


def render() -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(build().build()) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help=f"where to write (default {OUT})")
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if the file differs from what this script generates")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is stale: run scripts/make-dashboard.py", file=sys.stderr)
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

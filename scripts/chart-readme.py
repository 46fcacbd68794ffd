#!/usr/bin/env python3
"""Generate charts/lockstep/README.md from Chart.yaml and the `# --` comments of values.yaml.

The comments follow helm-docs' convention (`# -- description` above a key, `# -- (type) description`
to name a type, a documented map is one row with its whole default); the table has helm-docs'
columns. helm-docs itself is a Go program published only as GitHub release binaries and Go
modules, not on PyPI, npm or Debian, which are all this project's machines reach (docs/kubernetes.md).
tests/k8s/test_chart_readme.py checks that the README is fresh and every value is documented.

    .venv/bin/python scripts/chart-readme.py          # writes the README
    .venv/bin/python scripts/chart-readme.py --check  # exit 1 if it is stale
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parent.parent / "charts" / "lockstep"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.\-/\\]+):(?: |$)")
DOC = re.compile(r"^ *# -- (?:\((?P<type>[a-z]+)\) )?(?P<text>.*)$")
PIPE = "\\|"  # a | inside a Markdown table cell
MORE = re.compile(r"^ *# (?P<text>.*)$")


def documented(values_text: str) -> list[tuple[str, str | None, str]]:
    """``(dotted key, type or None, description)`` for every key with a `# --` comment, in file order."""
    out: list[tuple[str, str | None, str]] = []
    stack: list[tuple[int, str]] = []
    pending: tuple[str | None, list[str]] | None = None
    for line in values_text.splitlines():
        if (m := DOC.match(line)) is not None:
            pending = (m["type"], [m["text"]])
            continue
        if pending is not None and (m := MORE.match(line)) is not None:
            pending[1].append(m["text"])
            continue
        if (m := KEY.match(line)) is None:
            if line.strip() and not line.lstrip().startswith(("#", "-")):
                pending = None
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m["key"]))
        if pending is not None:
            out.append((".".join(k for _, k in stack), pending[0], " ".join(pending[1])))
            pending = None
    return out


def value_at(values: dict[str, Any], key: str) -> Any:
    node: Any = values
    for part in key.split("."):
        node = node[part]
    return node


def type_of(v: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "string", dict: "object", list: "list"}.get(
        type(v), "string")


def leaves(values: Any, prefix: str = "") -> list[str]:
    if isinstance(values, dict) and values:
        return [leaf for k, v in values.items() for leaf in leaves(v, f"{prefix}{k}.")]
    return [prefix[:-1]]


def render(chart: Path = CHART) -> str:
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    text = (chart / "values.yaml").read_text()
    values = yaml.safe_load(text)
    rows = []
    for key, typ, desc in sorted(documented(text)):
        default = json.dumps(value_at(values, key), separators=(",", ":")).replace("|", PIPE)
        rows.append(f"| {key} | {typ or type_of(value_at(values, key))} | `{default}` | {desc.replace('|', PIPE)} |")
    return "\n".join([
        f"# {meta['name']}",
        "",
        f"Version: {meta['version']} · Type: {meta['type']} · AppVersion: {meta['appVersion']}",
        "",
        " ".join(meta["description"].split()),
        "",
        "How to install it, run sweeps, fetch results and read the dashboard: "
        "[docs/kubernetes.md](../../docs/kubernetes.md).",
        "",
        "## Requirements",
        "",
        f"Kubernetes: `{meta['kubeVersion']}`",
        "",
        "## Values",
        "",
        "| Key | Type | Default | Description |",
        "|-----|------|---------|-------------|",
        *rows,
        "",
        "----------------------------------------------",
        "Generated from values.yaml by scripts/chart-readme.py (helm-docs' format).",
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if README.md is not what this script writes")
    args = ap.parse_args(argv)
    out = CHART / "README.md"
    text = render()
    if args.check:
        if not out.exists() or out.read_text() != text:
            print(f"{out} is stale: run scripts/chart-readme.py", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""charts/lockstep/README.md is generated from values.yaml (helm-docs' `# --` format) and is fresh."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import yaml

from .conftest import CHART, REPO

GENERATOR = REPO / "scripts" / "chart-readme.py"


def _generator():
    spec = importlib.util.spec_from_file_location("chart_readme", GENERATOR)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_chart_readme_is_what_the_generator_writes():
    proc = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_every_value_is_documented_by_itself_or_by_the_map_that_holds_it():
    gen = _generator()
    text = (CHART / "values.yaml").read_text()
    docs = {key for key, _, _ in gen.documented(text)}
    for leaf in gen.leaves(yaml.safe_load(text)):
        parts = leaf.split(".")
        assert any(".".join(parts[:i]) in docs for i in range(1, len(parts) + 1)), f"{leaf} has no `# --` comment"


def test_the_generator_reads_helm_docs_comments_and_nesting():
    gen = _generator()
    text = ("# a header, not a value's\n\n# -- Top.\ntop: 1\nmap:\n  # -- (bool) Nested,\n  # continued.\n"
            "  flag: null\n  list:\n    - a\n  # -- After a list.\n  other: {}\n")
    assert gen.documented(text) == [("top", None, "Top."), ("map.flag", "bool", "Nested, continued."),
                                    ("map.other", None, "After a list.")]
    assert gen.leaves(yaml.safe_load(text)) == ["top", "map.flag", "map.list", "map.other"]

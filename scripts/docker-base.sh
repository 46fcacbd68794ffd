#!/usr/bin/env bash
# A Debian bookworm base image for the Dockerfile without Docker Hub (docs/kubernetes.md):
# debootstrap a minimal root filesystem with Python 3.11, then `docker import` it.
#
#   sudo scripts/docker-base.sh                 # -> bookworm:local
#   scripts/docker-build.sh                     # then builds FROM it (BASE_IMAGE=bookworm:local)
#
# Settings (environment):
#   TAG      the image to make (bookworm:local)
#   MIRROR   the Debian mirror (http://deb.debian.org/debian; plain http: apt checks the Release
#            signatures, so no TLS and no proxy CA is involved)
#   INCLUDE  extra packages (python3.11 python3.11-venv ca-certificates; empty for a bare
#            bookworm, in which case the Dockerfile installs Python with apt)
# Needs root (debootstrap), a running Docker daemon, and debootstrap (installed with apt if missing).
set -euo pipefail

tag="${TAG:-bookworm:local}"
mirror="${MIRROR:-http://deb.debian.org/debian}"
include="${INCLUDE-python3.11 python3.11-venv ca-certificates}"

die() { echo "docker-base: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "debootstrap needs root; run it with sudo."
command -v docker >/dev/null || die "the docker command is missing (Debian: apt-get install docker.io)."
docker info >/dev/null 2>&1 || die "no Docker daemon answers (start one, e.g. dockerd --bridge=none --iptables=false)."
if ! command -v debootstrap >/dev/null; then
  apt-get install -y --no-install-recommends debootstrap >/dev/null
fi

root="$(mktemp -d "${TMPDIR:-/tmp}/lockstep-bookworm.XXXXXX")"
chmod 755 "$root"  # the image's / (and apt's _apt user must read its cache)
# Kept when something fails, for its debootstrap/debootstrap.log.
trap 'if [ $? = 0 ]; then rm -rf "$root"; else echo "docker-base: failed; the root filesystem is kept in $root" >&2; fi' EXIT
echo "docker-base: debootstrap bookworm from $mirror into $root" >&2
debootstrap --variant=minbase bookworm "$root" "$mirror" >&2 \
  || die "debootstrap failed (see $root/debootstrap/debootstrap.log)."

# The same sources as Debian's own images: the release, its updates and the security archive.
security="${mirror%/debian}/debian-security"
cat > "$root/etc/apt/sources.list" <<EOF
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb $security bookworm-security main
EOF
if [ -n "$include" ]; then
  # apt in a chroot resolves dependencies properly (debootstrap --include does not always).
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  chroot "$root" apt-get update -q >&2
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive chroot "$root" apt-get install -y -q --no-install-recommends $include >&2
  chroot "$root" apt-get clean
fi
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/tmp/* "$root"/var/log/*.log
: > "$root/etc/resolv.conf"  # Docker provides its own at run time

tar --numeric-owner --xattrs -C "$root" -c . \
  | docker import --change 'CMD ["/bin/bash"]' \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
      --message "debootstrap --variant=minbase bookworm ($mirror)" - "$tag" >/dev/null
echo "docker-base: $tag ($(docker image inspect -f '{{.Size}}' "$tag" | numfmt --to=si)B)"

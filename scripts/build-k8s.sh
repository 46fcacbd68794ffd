#!/usr/bin/env bash
# Builds kube-apiserver and kube-controller-manager from Debian's `kubernetes` source package
# (v1.20.2 on bookworm) and caches them in ~/.cache/lockstep/k8s/bin, for tests/k8s.
# Also installs etcd (Debian etcd-server). Idempotent: returns at once when everything is cached.
# The first build takes 4 to 15 minutes on two cores (kube-apiserver is most of it), then nothing.
#   LOCKSTEP_K8S_CACHE  cache root (default ~/.cache/lockstep/k8s)
set -euo pipefail

cache="${LOCKSTEP_K8S_CACHE:-$HOME/.cache/lockstep/k8s}"
bin="$cache/bin"
targets=(kube-apiserver kube-controller-manager)

have_all() {
  command -v etcd >/dev/null || return 1
  for t in "${targets[@]}"; do [ -x "$bin/$t" ] || return 1; done
}
have_all && exit 0

mkdir -p "$cache"
# One build at a time: a second caller waits for the first, then finds the cache.
exec 9>"$cache/.lock"
flock 9
have_all && exit 0

sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive

pkgs=(golang-go dpkg-dev rsync jq etcd-server unzip)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# `apt-get source` needs a deb-src entry for bookworm main.
need_src=0
if ! grep -rqsE '^(deb-src|Types:.*deb-src)' /etc/apt/sources.list /etc/apt/sources.list.d/; then
  need_src=1
  echo "build-k8s: adding a deb-src entry for bookworm main"
  $sudo tee /etc/apt/sources.list.d/lockstep-deb-src.sources >/dev/null <<'EOF'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
fi

if [ ${#missing[@]} -gt 0 ] || [ "$need_src" = 1 ]; then
  $sudo apt-get update -qq
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "build-k8s: installing Debian packages: ${missing[*]}"
  # etcd-server's maintainer script may try to start a service; there is no init system here.
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

src="$cache/src"
mkdir -p "$src" "$bin"
tree=$(find "$src" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -n1)
if [ -z "$tree" ] || [ ! -f "$tree/Makefile" ]; then
  echo "build-k8s: fetching the Debian kubernetes source package into $src"
  (cd "$src" && apt-get source kubernetes) >"$cache/apt-source.log" 2>&1 || {
    echo "build-k8s: apt-get source kubernetes failed:" >&2; tail -n 20 "$cache/apt-source.log" >&2; exit 1; }
  tree=$(find "$src" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -n1)
fi
[ -n "$tree" ] || { echo "build-k8s: apt-get source kubernetes produced no tree in $src" >&2; exit 1; }

cd "$tree"
for t in "${targets[@]}"; do
  [ -x "$bin/$t" ] && continue
  echo "build-k8s: building $t in $tree (several minutes the first time)"
  start=$(date +%s)
  # A plain `go build -mod=vendor` fails on this tree; the Makefile sets up what it needs.
  GOPATH="$PWD/.go" CGO_ENABLED=0 make WHAT="cmd/$t" >"$cache/build-$t.log" 2>&1 || {
    echo "build-k8s: building $t failed; last lines of $cache/build-$t.log:" >&2
    tail -n 40 "$cache/build-$t.log" >&2
    exit 1
  }
  out=$(find _output -type f -name "$t" -perm -u+x | head -n1)
  [ -n "$out" ] || { echo "build-k8s: $t built but not found under $tree/_output" >&2; exit 1; }
  install -m 0755 "$out" "$bin/$t.tmp" && mv "$bin/$t.tmp" "$bin/$t"
  echo "build-k8s: $t ready in $(( $(date +%s) - start ))s -> $bin/$t"
done
have_all

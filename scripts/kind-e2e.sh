#!/usr/bin/env bash
# `make kind-e2e`: the whole Kubernetes path on a throwaway kind cluster (docs/kubernetes.md).
#   create the cluster → docker build → kind load → helm install → the controller Job creates the
#   agent pods, which register over gRPC → scrape /metrics and `helm test` → the Job completes →
#   the agent pods are gone → summary.json on the results volume is checked → lockstep fetch copies the
#   run out → helm test passes after the run → delete the cluster.
# Needs docker, kind, helm, kubectl, jq and curl, and a Docker Hub (or mirror) for kind's node image.
#
# Settings (environment):
#   KIND_CLUSTER   cluster name (lockstep-e2e)          KEEP_CLUSTER=1  keep it afterwards
#   IMAGE          image to build and load (lockstep:e2e)
#   DOCKER_BUILD_ARGS  extra `docker build` arguments, e.g. "--build-arg BASE_IMAGE=bookworm:local"
#   SKIP_BUILD=1   use an IMAGE that is already built
#   AGENTS         agent pods (2)
#   E2E_OVERRIDES  Hydra overrides of the run, comma-separated
#   TIMEOUT        seconds for the run to finish (900)
set -euo pipefail
cd "$(dirname "$0")/.."

cluster="${KIND_CLUSTER:-lockstep-e2e}"
image="${IMAGE:-lockstep:e2e}"
release=e2e
ns=lockstep-e2e
fullname="$release-lockstep"
agents="${AGENTS:-2}"
overrides="${E2E_OVERRIDES:-workers=8,stop.updates=300,eval.every=100,eval.samples=1000}"
timeout="${TIMEOUT:-900}"
metrics_port=9400
local_port="${LOCAL_METRICS_PORT:-19400}"

PATH="$HOME/.cache/lockstep/bin:$PATH"  # helm and kubectl from scripts/install-helm.sh
for tool in docker kind helm kubectl jq curl; do
  command -v "$tool" >/dev/null || { echo "kind-e2e: $tool is required (see docs/kubernetes.md)" >&2; exit 2; }
done

say() { printf '\n== kind-e2e: %s\n' "$*"; }
fail() {
  echo "kind-e2e: FAILED: $*" >&2
  kubectl -n "$ns" get pods -o wide >&2 || true
  kubectl -n "$ns" logs "job/$fullname" --tail=60 >&2 || true
  exit 1
}
pf_pid=""
cleanup() {
  if [ -n "$pf_pid" ]; then kill "$pf_pid" 2>/dev/null || true; fi
  if [ "${KEEP_CLUSTER:-0}" = 1 ]; then
    echo "kind-e2e: keeping cluster $cluster (kind delete cluster --name $cluster)"
  else
    kind delete cluster --name "$cluster" >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT

# poll CMD until it succeeds or SECONDS pass: poll SECONDS WHAT CMD...
poll() {
  local limit=$1 what=$2; shift 2
  local deadline=$(( $(date +%s) + limit ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "$what: not within ${limit}s"
    sleep 2
  done
}

say "creating kind cluster $cluster"
kind get clusters 2>/dev/null | grep -qx "$cluster" && kind delete cluster --name "$cluster"
kind create cluster --name "$cluster" --wait 180s
kubectl config use-context "kind-$cluster" >/dev/null

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  say "building $image"
  # shellcheck disable=SC2086 # DOCKER_BUILD_ARGS is a list of arguments on purpose
  docker build ${DOCKER_BUILD_ARGS:-} -t "$image" .
fi
say "loading $image into the cluster"
kind load docker-image "$image" --name "$cluster"

say "helm install $release ($agents agents: $overrides)"
kubectl create namespace "$ns"
helm install "$release" charts/lockstep --namespace "$ns" \
  --set image.repository="${image%:*}" --set image.tag="${image##*:}" --set image.pullPolicy=Never \
  --set agents.count="$agents" --set experiment.overrides="{$overrides}" \
  --set results.persistence.enabled=true --set metrics.lingerSeconds=120 \
  --set controller.resources.requests.cpu=100m --set controller.resources.requests.memory=256Mi \
  --set agents.resources.requests.cpu=100m --set agents.resources.requests.memory=256Mi

say "waiting for the controller to serve /metrics"
controller_pod_exists() { kubectl -n "$ns" get pod -l "job-name=$fullname" -o name | grep -q .; }
poll 300 "controller pod created" controller_pod_exists
kubectl -n "$ns" wait pod -l "job-name=$fullname" --for=condition=Ready --timeout=300s \
  || fail "controller pod not Ready"

say "checking the agent pods the controller created"
count_agents() {
  kubectl -n "$ns" get pods -l "app.kubernetes.io/component=agent,app.kubernetes.io/instance=$release" \
    -o name | wc -l
}
poll 120 "$agents agent pods created" test "$(count_agents)" -eq "$agents"
kubectl -n "$ns" get pods -l app.kubernetes.io/component=agent \
  -o jsonpath='{range .items[*]}{.metadata.name} owner={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}{"\n"}{end}'

say "scraping /metrics through the Service"
kubectl -n "$ns" port-forward "svc/$fullname" "$local_port:$metrics_port" >/dev/null 2>&1 &
pf_pid=$!
scrape() { curl -fsS "http://127.0.0.1:$local_port/metrics" | grep -q '^lockstep_'; }
poll 60 "lockstep_ metrics on the controller's Service" scrape
curl -fsS "http://127.0.0.1:$local_port/metrics" | grep '^lockstep_' | head -n 15
kill "$pf_pid" 2>/dev/null || true; pf_pid=""

say "helm test"
helm test "$release" --namespace "$ns" --logs || fail "helm test"

say "waiting for the run to finish (up to ${timeout}s)"
job_done() {
  local s f
  s=$(kubectl -n "$ns" get job "$fullname" -o jsonpath='{.status.succeeded}')
  f=$(kubectl -n "$ns" get job "$fullname" -o jsonpath='{.status.failed}')
  [ "${f:-0}" -gt 0 ] && fail "the controller Job failed"
  [ "${s:-0}" -gt 0 ]
}
deadline=$(( $(date +%s) + timeout ))
until job_done; do
  [ "$(date +%s)" -lt "$deadline" ] || fail "the run did not finish within ${timeout}s"
  sleep 5
done
kubectl -n "$ns" logs "job/$fullname" --tail=5

say "the agent pods are deleted at the end"
poll 120 "agent pods deleted" test "$(count_agents)" -eq 0

say "reading summary.json from the results volume"
reader=e2e-read-results
kubectl -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $reader
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  securityContext: {runAsNonRoot: true, runAsUser: 10001, runAsGroup: 10001}
  containers:
    - name: cat
      image: $image
      imagePullPolicy: Never
      args: [cat, /results/$release/summary.json]
      securityContext: {readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
      volumeMounts: [{name: results, mountPath: /results, readOnly: true}]
  volumes:
    - name: results
      persistentVolumeClaim: {claimName: $fullname-results}
EOF
phase() { kubectl -n "$ns" get pod "$reader" -o jsonpath='{.status.phase}'; }
reader_done() { case "$(phase)" in Succeeded|Failed) return 0 ;; *) return 1 ;; esac; }
poll 180 "results reader finished" reader_done
[ "$(phase)" = Succeeded ] || fail "cannot read /results/$release/summary.json: $(kubectl -n "$ns" logs "$reader")"
summary=$(kubectl -n "$ns" logs "$reader")
echo "$summary" | jq .
echo "$summary" | jq -e --argjson n "$agents" '.agents == $n and .updates > 0 and .virtual_time_ns > 0' >/dev/null \
  || fail "summary.json does not show a finished run with $agents agents"

say "lockstep fetch (a reader pod mounts the claim, a tar through exec) and helm test after the run"
fetched=$(mktemp -d)
KUBECONFIG="${KUBECONFIG:-$HOME/.kube/config}" "${LOCKSTEP:-.venv/bin/lockstep}" fetch -n "$ns" "$release" "$fetched" \
  || fail "lockstep fetch"
jq -e '.complete == true' "$fetched/$release/summary.json" >/dev/null || fail "the fetched summary.json is not complete"
[ -s "$fetched/$release/metrics.csv" ] || fail "the fetched run has no metrics.csv"
helm test "$release" --namespace "$ns" --logs || fail "helm test after the run"

say "PASSED: $agents agent pods, metrics scraped, helm test passed (during and after), run finished, results fetched, agents cleaned up"

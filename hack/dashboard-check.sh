#!/usr/bin/env bash
# Builds (once) the Grafana dashboard checker of hack/dashboard-check/ (a Go program on the
# Grafana Foundation SDK's dashboard schema) into the same cache as hack/k8s-bins.sh, keyed by
# its source. tests/monitoring.rs runs it on deploy/monitoring/dashboard.json. Prints the path
# as a shell export on stdout; progress goes to stderr.
#
#   eval "$(hack/dashboard-check.sh)"
#
# Uses DASHBOARD_CHECK from the environment when it is already set and executable. The build
# needs Go and the Go module proxy (about a minute on 2 cores).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
src="$here/dashboard-check"
cache_root="${CATALOGSYNC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/catalogsync}"
key="$(cat "$src/go.mod" "$src/go.sum" "$src/main.go" | sha256sum | cut -c1-12)"
out="$cache_root/dashboard-check/dashboard-check-$key"

log() { printf 'dashboard-check: %s\n' "$*" >&2; }

if [[ -n "${DASHBOARD_CHECK:-}" && -x "${DASHBOARD_CHECK}" ]]; then
  log "using DASHBOARD_CHECK=$DASHBOARD_CHECK from the environment"
  printf 'export DASHBOARD_CHECK=%q\n' "$DASHBOARD_CHECK"
  exit 0
fi

if [[ -x "$out" ]]; then
  log "cached at $out"
  printf 'export DASHBOARD_CHECK=%q\n' "$out"
  exit 0
fi

command -v go >/dev/null || { log "error: go is not installed; it is needed to build the dashboard checker"; exit 1; }
mkdir -p "$(dirname "$out")"
rm -f "$(dirname "$out")"/dashboard-check-* # builds of an older source
log "building $src (about a minute)"
start=$SECONDS
(cd "$src" && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly \
  go build -trimpath -ldflags "-s -w" -o "$out.tmp" .)
mv "$out.tmp" "$out"
log "built in $((SECONDS - start)) s at $out"
printf 'export DASHBOARD_CHECK=%q\n' "$out"

#!/usr/bin/env bash
# Builds (once) the pinned kustomize that renders deploy/ for the tests and the docs, into the
# same cache as hack/k8s-bins.sh. Prints the path as a shell export on stdout; progress goes to
# stderr.
#
#   eval "$(hack/kustomize.sh)"
#
# Uses KUSTOMIZE from the environment when it is already set and executable. It does not use
# `kubectl kustomize`: kubectl is not guaranteed to be installed, and its embedded kustomize
# version varies. The build needs Go and the Go module proxy (about a minute on 2 cores).
set -euo pipefail

KUSTOMIZE_VERSION=v5.7.1
cache_root="${CATALOGSYNC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/catalogsync}"
bin_dir="$cache_root/kustomize/$KUSTOMIZE_VERSION"
out="$bin_dir/kustomize"

log() { printf 'kustomize: %s\n' "$*" >&2; }

if [[ -n "${KUSTOMIZE:-}" && -x "${KUSTOMIZE}" ]]; then
  log "using KUSTOMIZE=$KUSTOMIZE from the environment"
  printf 'export KUSTOMIZE=%q\n' "$KUSTOMIZE"
  exit 0
fi

if [[ -x "$out" ]] && "$out" version 2>/dev/null | grep -qF -- "$KUSTOMIZE_VERSION"; then
  log "$KUSTOMIZE_VERSION: cached at $out"
  printf 'export KUSTOMIZE=%q\n' "$out"
  exit 0
fi

command -v go >/dev/null || { log "error: go is not installed; it is needed to build kustomize"; exit 1; }
mkdir -p "$bin_dir"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/kustomize-build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
log "$KUSTOMIZE_VERSION: building sigs.k8s.io/kustomize/kustomize/v5 (about a minute)"
start=$SECONDS
# `go install module@version` ignores any go.mod around it; run it from an empty directory anyway.
(cd "$tmp" && GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$tmp/bin" \
  go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION")
mv "$tmp/bin/kustomize" "$out"
if ! "$out" version 2>/dev/null | grep -qF -- "$KUSTOMIZE_VERSION"; then
  log "error: $out does not report version $KUSTOMIZE_VERSION: $("$out" version 2>&1 || true)"
  exit 1
fi
log "$KUSTOMIZE_VERSION: built in $((SECONDS - start)) s at $out"
printf 'export KUSTOMIZE=%q\n' "$out"

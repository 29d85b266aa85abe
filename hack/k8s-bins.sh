#!/usr/bin/env bash
# Builds (once) the kube-apiserver and etcd binaries that catalogsync's tests and
# local demo run, from the Go modules under hack/k8s/, into a cache outside the
# work tree. Prints the two paths as shell exports on stdout; progress goes to stderr.
#
#   eval "$(hack/k8s-bins.sh)"
#
# Reuses, in this order: TEST_ASSET_KUBE_APISERVER / TEST_ASSET_ETCD, KUBEBUILDER_ASSETS
# (envtest's layout), then the cache (checked by each binary's --version).
set -euo pipefail

KUBE_VERSION=v1.35.4
ETCD_VERSION=v3.6.16
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${CATALOGSYNC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/catalogsync}"
bin_dir="$cache_root/k8s/kube-$KUBE_VERSION-etcd-$ETCD_VERSION"

log() { printf 'k8s-bins: %s\n' "$*" >&2; }

if [[ -n "${TEST_ASSET_KUBE_APISERVER:-}" && -n "${TEST_ASSET_ETCD:-}" ]]; then
  log "using TEST_ASSET_KUBE_APISERVER and TEST_ASSET_ETCD from the environment"
  printf 'export TEST_ASSET_KUBE_APISERVER=%q\nexport TEST_ASSET_ETCD=%q\n' "$TEST_ASSET_KUBE_APISERVER" "$TEST_ASSET_ETCD"
  exit 0
fi
if [[ -n "${KUBEBUILDER_ASSETS:-}" && -x "$KUBEBUILDER_ASSETS/kube-apiserver" && -x "$KUBEBUILDER_ASSETS/etcd" ]]; then
  log "using binaries from KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
  printf 'export TEST_ASSET_KUBE_APISERVER=%q\nexport TEST_ASSET_ETCD=%q\n' "$KUBEBUILDER_ASSETS/kube-apiserver" "$KUBEBUILDER_ASSETS/etcd"
  exit 0
fi

command -v go >/dev/null || { log "error: go is not installed; it is needed to build kube-apiserver and etcd"; exit 1; }
mkdir -p "$bin_dir"

build() { # name version-regex module-dir ldflags
  local name=$1 want=$2 dir=$3 ldflags=$4 out="$bin_dir/$1"
  if [[ -x "$out" ]] && "$out" --version 2>/dev/null | grep -q -- "$want"; then
    log "$name $want: cached at $out"
    return
  fi
  log "$name $want: building from $dir (a cold build takes 10-25 minutes on 2 cores)"
  local start=$SECONDS
  (cd "$dir" && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly \
    go build -trimpath -ldflags "-s -w $ldflags" -o "$out.tmp" .)
  mv "$out.tmp" "$out"
  log "$name $want: built in $((SECONDS - start)) s"
}

build etcd "${ETCD_VERSION#v}" "$here/k8s/etcd" \
  "-X go.etcd.io/etcd/api/v3/version.Version=${ETCD_VERSION#v}"
build kube-apiserver "Kubernetes $KUBE_VERSION" "$here/k8s/kube-apiserver" \
  "-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35 -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.buildDate=2026-01-01T00:00:00Z"

printf 'export TEST_ASSET_KUBE_APISERVER=%q\nexport TEST_ASSET_ETCD=%q\n' "$bin_dir/kube-apiserver" "$bin_dir/etcd"

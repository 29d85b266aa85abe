#!/usr/bin/env bash
# Builds (once) the Kubernetes binaries that catalogsync's tests and local demo run, from the
# Go modules under hack/k8s/, into a cache outside the work tree: etcd, kube-apiserver and
# kube-controller-manager (the control planes), and kubelet, kube-proxy, kube-scheduler and
# pause (the real test node of tests/deployment.rs, see docs/testing.md). Prints the paths as
# shell exports on stdout; progress goes to stderr.
#
#   eval "$(hack/k8s-bins.sh)"                         # all of them
#   eval "$(hack/k8s-bins.sh etcd kube-apiserver)"     # only these
#
# Reuses for each binary, in this order: TEST_ASSET_KUBE_APISERVER / TEST_ASSET_ETCD /
# TEST_ASSET_KUBE_CONTROLLER_MANAGER, KUBEBUILDER_ASSETS (envtest's layout), then the cache
# (checked by each binary's --version).
set -euo pipefail

KUBE_VERSION=v1.35.4
ETCD_VERSION=v3.6.16
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${CATALOGSYNC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/catalogsync}"
bin_dir="$cache_root/k8s/kube-$KUBE_VERSION-etcd-$ETCD_VERSION"

log() { printf 'k8s-bins: %s\n' "$*" >&2; }

# One binary: from $env_var, else $KUBEBUILDER_ASSETS/<name>, else nothing (built below).
given() { # env-var name
  local env_var=$1 name=$2
  if [[ -n "${!env_var:-}" ]]; then
    printf '%s' "${!env_var}"
  elif [[ -n "${KUBEBUILDER_ASSETS:-}" && -x "$KUBEBUILDER_ASSETS/$name" ]]; then
    printf '%s' "$KUBEBUILDER_ASSETS/$name"
  fi
}

build() { # name version-regex module-dir ldflags
  local name=$1 want=$2 dir=$3 ldflags=$4 out="$bin_dir/$1"
  if [[ -x "$out" ]] && "$out" --version 2>/dev/null | grep -- "$want" >/dev/null; then
    log "$name $want: cached at $out"
    return
  fi
  command -v go >/dev/null || { log "error: go is not installed; it is needed to build $name"; exit 1; }
  mkdir -p "$bin_dir"
  log "$name $want: building from $dir (a cold build takes 10-25 minutes on 2 cores)"
  local start=$SECONDS
  (cd "$dir" && GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=readonly \
    go build -trimpath -ldflags "-s -w $ldflags" -o "$out.tmp" .)
  mv "$out.tmp" "$out"
  log "$name $want: built in $((SECONDS - start)) s"
}

kube_ldflags="-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=35 -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.buildDate=2026-01-01T00:00:00Z"

# Prints `export VAR=path` for one binary, building it into the cache when not given.
provide() { # env-var name version-regex module-dir ldflags
  local env_var=$1 name=$2 path
  path="$(given "$env_var" "$name")"
  if [[ -n "$path" ]]; then
    log "$name: using $path (from $env_var or KUBEBUILDER_ASSETS)"
  else
    build "$name" "$3" "$4" "$5"
    path="$bin_dir/$name"
  fi
  printf 'export %s=%q\n' "$env_var" "$path"
}

# kube-controller-manager runs the Deployment, ReplicaSet, HPA and disruption controllers in
# the tests of deploy/ (tests/deployment.rs); envtest does not ship it, so it is built even
# when the other two come from KUBEBUILDER_ASSETS. So are the node's binaries.
all=(etcd kube-apiserver kube-controller-manager kubelet kube-proxy kube-scheduler pause)
wanted=("$@")
if ((${#wanted[@]} == 0)); then wanted=("${all[@]}"); fi
for name in "${wanted[@]}"; do
  if [[ " ${all[*]} " != *" $name "* ]]; then
    log "error: unknown binary $name (${all[*]})"
    exit 2
  fi
done
wants() { [[ " ${wanted[*]} " == *" $1 "* ]]; }

# (`if`, not `wants x && provide ...`: bash ignores `set -e` inside an `&&` list.)
if wants etcd; then
  provide TEST_ASSET_ETCD etcd "${ETCD_VERSION#v}" "$here/k8s/etcd" \
    "-X go.etcd.io/etcd/api/v3/version.Version=${ETCD_VERSION#v}"
fi
if wants kube-apiserver; then
  provide TEST_ASSET_KUBE_APISERVER kube-apiserver "Kubernetes $KUBE_VERSION" "$here/k8s/kube-apiserver" "$kube_ldflags"
fi
if wants kube-controller-manager; then
  provide TEST_ASSET_KUBE_CONTROLLER_MANAGER kube-controller-manager "Kubernetes $KUBE_VERSION" \
    "$here/k8s/kube-controller-manager" "$kube_ldflags"
fi
for name in kubelet kube-proxy kube-scheduler; do
  if wants "$name"; then
    var="TEST_ASSET_$(tr 'a-z-' 'A-Z_' <<<"$name")"
    provide "$var" "$name" "Kubernetes $KUBE_VERSION" "$here/k8s/$name" "$kube_ldflags"
  fi
done
# The sandbox image's binary has no --version; the cache key is its source.
if wants pause; then
  pause_out="$bin_dir/pause-$(cat "$here/k8s/pause/main.go" "$here/k8s/pause/go.mod" | sha256sum | cut -c1-12)"
  if [[ -n "${TEST_ASSET_PAUSE:-}" ]]; then
    pause_out=$TEST_ASSET_PAUSE
  elif [[ ! -x "$pause_out" ]]; then
    mkdir -p "$bin_dir"
    (cd "$here/k8s/pause" && GOTOOLCHAIN=local CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$pause_out.tmp" .)
    mv "$pause_out.tmp" "$pause_out"
    log "pause: built"
  fi
  printf 'export TEST_ASSET_PAUSE=%q\n' "$pause_out"
fi

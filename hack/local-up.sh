#!/usr/bin/env bash
# Starts a local KCP and SKRs (real kube-apiservers on one etcd), installs the CRDs, RBAC and
# the sample catalog (hack/sample/catalog.yaml), creates one Kyma with its access Secret per
# SKR, and runs catalogsync replicas against them, sharing the SKRs through their Leases.
# Once every shard is held and every Kyma synced, it prints who holds which shard. Ctrl-C
# stops everything.
#
#   hack/local-up.sh [--replicas N] [--skrs M] [--dir DIR] [--no-controller]
#   hack/local-up.sh --help
#
# Defaults: one replica, two SKRs. Files (kubeconfigs, logs, audit logs) go to
# ~/.cache/catalogsync/local-up by default; the directory is wiped at start and kept after exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

eval "$(hack/k8s-bins.sh etcd kube-apiserver)"
cargo build --locked --bin catalogsync --bin local-up
exec "${CARGO_TARGET_DIR:-target}/debug/local-up" "$@"

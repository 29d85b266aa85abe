#!/usr/bin/env bash
# Starts a local KCP and two SKRs (real kube-apiservers on one etcd), installs the CRDs,
# RBAC and the sample catalog (hack/sample/catalog.yaml), creates two Kymas with access
# Secrets, and runs catalogsync against them. Ctrl-C stops everything.
#
#   hack/local-up.sh [--dir DIR] [--no-controller]
#
# Files (kubeconfigs, logs, audit logs) go to ~/.cache/catalogsync/local-up by default;
# the directory is wiped at start and kept after exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

eval "$(hack/k8s-bins.sh etcd kube-apiserver)"
cargo build --locked --bin catalogsync --bin local-up
exec "${CARGO_TARGET_DIR:-target}/debug/local-up" "$@"

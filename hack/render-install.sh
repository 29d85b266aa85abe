#!/usr/bin/env bash
# Renders deploy/install.yaml, the single-file install of catalogsync: deploy/base (namespace
# catalogsync-system, ServiceAccount and RBAC, Deployment, metrics Service,
# PodDisruptionBudget) as the pinned kustomize of hack/kustomize.sh renders it, under a header
# that says so. kustomize stays the source; tests/deploy.rs fails when the file is stale.
#
#   hack/render-install.sh      # rewrite deploy/install.yaml
#   hack/render-install.sh -    # print it to stdout instead
#
# The CRDs are not in it: on a KCP with lifecycle-manager they are KLM's (deploy/crds is for a
# KCP without KLM, see docs/operations.md).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

eval "$(hack/kustomize.sh)"
version="$("$KUSTOMIZE" version)"

render() {
  cat <<HEADER
# catalogsync, all in one file: namespace catalogsync-system, ServiceAccount and RBAC (a Role
# in kcp-system, where the Kymas live), Deployment (3 replicas), metrics Service and
# PodDisruptionBudget. Not the CRDs (deploy/crds, only for a KCP without lifecycle-manager).
#
#   kubectl apply --server-side -f deploy/install.yaml
#
# GENERATED from deploy/base by hack/render-install.sh with kustomize $version: do not edit.
# Change deploy/ and run hack/render-install.sh; tests/deploy.rs fails when this file is stale.
HEADER
  "$KUSTOMIZE" build deploy/base
}

if [[ "${1:-}" == "-" ]]; then
  render
else
  trap 'rm -f deploy/install.yaml.tmp' EXIT
  render >deploy/install.yaml.tmp
  mv deploy/install.yaml.tmp deploy/install.yaml
  printf 'render-install: wrote deploy/install.yaml\n' >&2
fi

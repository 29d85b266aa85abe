#!/usr/bin/env bash
# The fleet-scale performance harness (docs/performance.md): a real KCP apiserver with
# thousands of Kymas, catalogsync replicas as real processes, an SKR simulator, and
# lifecycle-manager's in-loop sync reproduced as the baseline.
#
#   hack/fleet.sh run fleet       # the fleet-scale scenarios at 5,000 Kymas, with the baseline (about 50 min)
#   hack/fleet.sh run propagation # propagation only, per --replicas (about 15 min at 3 replicas)
#   hack/fleet.sh run baseline    # lifecycle-manager's in-loop sync alone (about 20 min at 5,000)
#   hack/fleet.sh run reconcile   # KLM's Kyma reconcile with and without its catalog part, and
#                                 # catalogsync's steady state at a 5-min resync (about 45 min at 5,000)
#   hack/fleet.sh run calibrate   # real SKR apiservers vs the simulator (about 3 min)
#   hack/fleet.sh run smoke       # a small end-to-end run (about 1 min; CI runs it)
#   hack/fleet.sh run --help      # every flag
#
# Builds catalogsync and the harness with the release profile (FLEET_PROFILE=debug for a
# debug build, as CI's smoke run does) and kube-apiserver/etcd through hack/k8s-bins.sh.
# Files, logs and the report (report.md, and its rows as report.json) go to
# ~/.cache/catalogsync/fleet by default.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

eval "$(hack/k8s-bins.sh etcd kube-apiserver)"
profile="${FLEET_PROFILE:-release}"
if [[ "$profile" == release ]]; then
  cargo build --locked --release --bin catalogsync --bin fleet
else
  cargo build --locked --bin catalogsync --bin fleet
fi
# Keep every log (the harness directory is wiped at the next run instead).
export CATALOGSYNC_KEEP_TEST_DIRS=1
# One TLS connection per simulated SKR, in the simulator and in the replicas.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
dir="${CARGO_TARGET_DIR:-target}/$([[ "$profile" == release ]] && echo release || echo debug)"
exec "$dir/fleet" "$@"

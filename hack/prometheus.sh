#!/usr/bin/env bash
# Builds (once) the pinned Prometheus server and promtool from the Go module
# github.com/prometheus/prometheus, into the same cache as hack/k8s-bins.sh. Prints the paths
# as shell exports on stdout; progress goes to stderr.
#
#   eval "$(hack/prometheus.sh)"     # PROMETHEUS and PROMTOOL
#
# The tests run them: promtool checks and unit-tests the alerts of deploy/monitoring
# (tests/monitoring.rs), and the server scrapes a replica (tests/monitoring.rs) and the pods of
# the Deployment through Kubernetes service discovery (tests/deployment.rs). Debian's
# prometheus package is built without Kubernetes service discovery, hence this build: with
# every service discovery but Kubernetes' left out (build tags remove_all_sd and
# enable_kubernetes_sd), which keeps it to a few minutes cold on 2 cores.
#
# Uses PROMETHEUS and PROMTOOL from the environment when they are already set and executable.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/go-tool.sh"

version=v0.316.0 # Prometheus 3.16
tags=remove_all_sd,enable_kubernetes_sd
go_tool PROMETHEUS prometheus "$version" github.com/prometheus/prometheus/cmd/prometheus "$tags"
go_tool PROMTOOL promtool "$version" github.com/prometheus/prometheus/cmd/promtool "$tags"

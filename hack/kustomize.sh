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
source "$(dirname "${BASH_SOURCE[0]}")/lib/go-tool.sh"

go_tool KUSTOMIZE kustomize v5.7.1 sigs.k8s.io/kustomize/kustomize/v5

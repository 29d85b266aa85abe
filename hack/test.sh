#!/usr/bin/env bash
# The test command of catalogsync: everything CI checks, in the order CI checks it.
#
#   hack/test.sh
#
# Steps: toolchains, Debian packages (installed with apt-get when missing and run as root:
# libfaketime, and containerd, runc, the CNI plugins and iptables of the test node),
# the Kubernetes binaries (etcd, kube-apiserver, kube-controller-manager, and the test node's
# kubelet, kube-proxy, kube-scheduler and pause; hack/k8s-bins.sh: built from source on the
# first run, 15-30 minutes on 2 cores, cached in ~/.cache/catalogsync afterwards),
# kustomize, Prometheus and promtool, and the Grafana dashboard checker (hack/kustomize.sh,
# hack/prometheus.sh, hack/dashboard-check.sh, same cache), the release image and the pause image
# (hack/image.sh; tests/deployment.rs runs them on the test node),
# rustfmt, clippy, all unit and integration tests (the integration tests start their own
# apiservers), rustdoc, and the fleet harness's smoke scenario. Every step runs even when an earlier one failed, so one run reports
# everything; the exit status is non-zero when any step failed.
#
# The last line of output is always the test summary, `N passed, N failed`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ -n "${CI:-}" ]]; then
  export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
fi

start=$SECONDS
failed_steps=()
passed=0
failed=0
test_log="$(mktemp "${TMPDIR:-/tmp}/catalogsync-test.XXXXXX")"
trap 'rm -f "$test_log"' EXIT

elapsed() {
  local s=$((SECONDS - start))
  printf '%dm%02ds' $((s / 60)) $((s % 60))
}

header() {
  printf '\n==> %s  [%s]\n' "$*" "$(elapsed)"
}

summary() {
  printf '\n'
  if ((${#failed_steps[@]} > 0)); then
    local list
    printf -v list '%s, ' "${failed_steps[@]}"
    printf 'FAILED steps: %s  [%s]\n' "${list%, }" "$(elapsed)"
  else
    printf 'all steps passed  [%s]\n' "$(elapsed)"
  fi
  printf '%d passed, %d failed\n' "$passed" "$failed"
}

# Stops the run before any step could start (missing toolchain, no apiserver binaries).
abort() {
  printf 'error: %s\n' "$*" >&2
  failed_steps+=("setup")
  summary
  exit 1
}

# Runs one step; records a failure and carries on.
step() {
  local name=$1
  shift
  header "$name"
  local t=$SECONDS
  if "$@"; then
    printf -- '--- ok: %s (%ds)\n' "$name" $((SECONDS - t))
  else
    printf -- '--- FAILED: %s (%ds)\n' "$name" $((SECONDS - t))
    failed_steps+=("$name")
  fi
}

header "check toolchains"
command -v cargo >/dev/null || abort "cargo not found: install Rust (https://rustup.rs) and put ~/.cargo/bin on PATH"
command -v go >/dev/null || abort "go not found: install Go (https://go.dev/dl); it builds kube-apiserver and etcd for the tests"
cargo fmt --version >/dev/null 2>&1 || abort "rustfmt missing: rustup component add rustfmt"
cargo clippy --version >/dev/null 2>&1 || abort "clippy missing: rustup component add clippy"
printf '%s\n%s\n%s\n' "$(cargo --version)" "$(rustc --version)" "$(go version)"

# Installs the Debian packages named when any is missing (as root, with apt-get).
apt_install() { # reason package...
  local reason=$1 missing=()
  shift
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]} == 0)); then
    echo "$reason: installed ($*)"
    return
  fi
  if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
    echo "$reason: installing ${missing[*]} with apt-get"
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" ||
      { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; }; } >/dev/null ||
      abort "apt-get could not install ${missing[*]}"
  else
    abort "$reason needs the Debian/Ubuntu packages ${missing[*]} (as root: apt-get install ${missing[*]})"
  fi
}

header "Debian packages"
# tests/sharding_faults.rs runs a replica whose wall clock is offset.
apt_install "libfaketime" libfaketime
# tests/deployment.rs runs the pods of deploy/ on a real node (testenv::node).
apt_install "the test node" containerd runc containernetworking-plugins iptables

header "Kubernetes binaries (hack/k8s-bins.sh; first run builds them, 15-30 min on 2 cores)"
bins="$(hack/k8s-bins.sh)" || abort "hack/k8s-bins.sh failed to provide the Kubernetes binaries"
eval "$bins"
printf '%s\n' "$bins" | sed -e 's/^export //'

header "kustomize (hack/kustomize.sh; first run builds it, about a minute)"
kustomize="$(hack/kustomize.sh)" || abort "hack/kustomize.sh failed to provide kustomize (tests/deploy.rs renders deploy/ with it)"
eval "$kustomize"
printf 'KUSTOMIZE=%s\n' "$KUSTOMIZE"

header "Prometheus and promtool (hack/prometheus.sh; first run builds them, about 3 minutes)"
prometheus="$(hack/prometheus.sh)" ||
  abort "hack/prometheus.sh failed to provide prometheus and promtool (tests/monitoring.rs and tests/deployment.rs run them)"
eval "$prometheus"
printf 'PROMETHEUS=%s\nPROMTOOL=%s\n' "$PROMETHEUS" "$PROMTOOL"

header "Grafana dashboard checker (hack/dashboard-check.sh; first run builds it, about a minute)"
dashboard_check="$(hack/dashboard-check.sh)" ||
  abort "hack/dashboard-check.sh failed to build the dashboard checker (tests/monitoring.rs runs it)"
eval "$dashboard_check"
printf 'DASHBOARD_CHECK=%s\n' "$DASHBOARD_CHECK"

# The release image and the pause image, as OCI archives for the test node's containerd. The
# static release build has a target directory of its own in the cache, so that it is warm
# across clones (cold: about 5-10 minutes on 2 cores).
images() {
  local target="${CATALOGSYNC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/catalogsync}/image-target"
  CATALOGSYNC_TEST_IMAGE="$(CARGO_TARGET_DIR="$target" hack/image.sh catalogsync)" &&
    CATALOGSYNC_TEST_PAUSE_IMAGE="$(CARGO_TARGET_DIR="$target" hack/image.sh pause)" &&
    export CATALOGSYNC_TEST_IMAGE CATALOGSYNC_TEST_PAUSE_IMAGE &&
    printf 'CATALOGSYNC_TEST_IMAGE=%s\nCATALOGSYNC_TEST_PAUSE_IMAGE=%s\n' "$CATALOGSYNC_TEST_IMAGE" "$CATALOGSYNC_TEST_PAUSE_IMAGE"
}
step "images (hack/image.sh)" images

step "cargo fmt" cargo fmt --all -- --check
step "cargo clippy" cargo clippy --locked --workspace --all-targets -- -D warnings

run_tests() {
  # --no-fail-fast: a failing test binary must not hide the results of the others.
  cargo test --locked --workspace --no-fail-fast 2>&1 | tee "$test_log"
}
# The hostile-SKR fuzzer's figures: tests/hostile_fuzz.rs writes them here, as a passing
# test's own output is not shown.
fuzz_summary="${CARGO_TARGET_DIR:-target}/tmp/hostile-fuzz-summary.txt"
rm -f "$fuzz_summary"
step "cargo test" run_tests
if [[ -f "$fuzz_summary" ]]; then
  cat "$fuzz_summary"
fi
# Sum the `test result: ok. X passed; Y failed; ...` lines of every test binary.
read -r passed failed < <(
  sed -nE 's/^test result: [A-Za-z]+\. ([0-9]+) passed; ([0-9]+) failed;.*/\1 \2/p' "$test_log" |
    awk '{p += $1; f += $2} END {print p + 0, f + 0}'
)
if ((failed > 0)) && [[ " ${failed_steps[*]} " != *" cargo test "* ]]; then
  failed_steps+=("cargo test")
fi

step "cargo doc" env RUSTDOCFLAGS=-Dwarnings cargo doc --locked --workspace --no-deps

# The fleet harness's smoke scenario (docs/performance.md): 50 simulated SKRs, two replicas and
# the baseline, end to end, so the harness does not rot. Counted as one test.
fleet_smoke() {
  local dir
  dir="$(mktemp -d "${TMPDIR:-/tmp}/catalogsync-fleet-smoke.XXXXXX")"
  FLEET_PROFILE=debug hack/fleet.sh run smoke --dir "$dir"
  local rc=$?
  rm -rf "$dir"
  return $rc
}
step "fleet smoke" fleet_smoke
if [[ " ${failed_steps[*]} " == *" fleet smoke "* ]]; then
  failed=$((failed + 1))
else
  passed=$((passed + 1))
fi

summary
if ((${#failed_steps[@]} > 0)); then
  exit 1
fi

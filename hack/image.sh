#!/usr/bin/env bash
# Builds catalogsync's release image as an OCI archive, with no container engine and no base
# image to pull; or, with `pause`, the sandbox image of the test node's containerd.
#
#   hack/image.sh [catalogsync|pause] [--out FILE] [--name REF]
#
#   hack/image.sh          # target/image/catalogsync-<version>.oci.tar, catalogsync:<version>
#   hack/image.sh pause    # target/image/pause-3.10.oci.tar, registry.k8s.io/pause:3.10
#
# Prints the archive's path on stdout; progress, the image's digest and its size (archive and
# unpacked) go to stderr. The archive goes to ${CARGO_TARGET_DIR:-target}/image/ unless --out
# names a file. It carries the fully qualified name (catalogsync:0.1.0 becomes
# docker.io/library/catalogsync:0.1.0, the name a pod's `image: catalogsync:0.1.0` is looked
# up by), so containerd imports it under that name:
#
#   ctr -n k8s.io images import FILE
#   skopeo copy oci-archive:FILE docker://<registry>/catalogsync:<tag>      # or push it
#
# The catalogsync image, one layer (8.4 MiB archive, 22.5 MiB unpacked for 0.1.0):
#
#   /usr/local/bin/catalogsync            the release binary, static-pie, debug info stripped
#   /etc/passwd, /etc/group               root, nobody, nonroot (65532:65532)
#   /etc/nsswitch.conf                    hosts: files dns
#   /etc/ssl/certs/ca-certificates.crt    Debian's ca-certificates, as update-ca-certificates
#                                         bundles them; SSL_CERT_FILE points at it
#   /usr/share/doc/ca-certificates/copyright, /tmp
#
# Entrypoint /usr/local/bin/catalogsync, cmd `run`, user 65532:65532, port 8080, linux/amd64.
# No shell and no package manager, and nothing in it is written to: it runs with a read-only
# root filesystem.
#
# Why a static binary on an empty base, not the dynamic binary on libc6 and libgcc-s1 from
# Debian (the way distroless/cc is made): one Debian package to fetch instead of five, a
# smaller image (those packages alone are 5.4 MiB compressed, 14 MiB unpacked), and no
# libraries that can differ from those the binary was linked against. The binary is built with
# `-C target-feature=+crt-static` for an explicit `--target x86_64-unknown-linux-gnu`, so that
# build scripts and proc macros stay dynamic; linking needs glibc's static libraries (Debian
# libc6-dev, Fedora glibc-static). A static glibc cannot load NSS modules, but since glibc
# 2.34 `files` and `dns` are built into libc: getaddrinfo, which resolves the KCP's and the
# SKRs' apiserver names, reads /etc/hosts and /etc/resolv.conf as in a dynamic binary. Checked
# on the built image with containerd and runc (read-only root, uid 65532): a kubeconfig server
# whose name only the container's /etc/hosts knows ends in "Connection refused", a public name
# is resolved through the nameserver of /etc/resolv.conf. The other difference: the getrandom
# crate reads /dev/urandom in a static binary, which every container runtime provides.
#
# The CA bundle is required: without one catalogsync cannot build a Kubernetes client at all
# ("No CA certificates were loaded from the system"). It comes from the ca-certificates .deb
# of the host's apt sources (`apt-get download`, cached in
# ${CATALOGSYNC_CACHE:-~/.cache/catalogsync}/image/debs/).
#
# Reproducible: the layer is tarred with fixed order, owners, modes and times, and every
# timestamp in the image is 1970-01-01, so the same binary and the same ca-certificates version
# give the same image digest and the same archive bytes.
#
# Needs umoci, jq and binutils (installed with apt-get when missing and run as root), and for
# the catalogsync image cargo and dpkg-deb. The pause image packs the static Go binary
# $TEST_ASSET_PAUSE (`hack/k8s-bins.sh pause` builds it when that is unset) as /pause, user
# 65535:65535, for the CRI sandbox image of the test node's containerd.
set -euo pipefail
shopt -s inherit_errexit
umask 022

caller_dir=$PWD
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PAUSE_VERSION=3.10
TARGET=x86_64-unknown-linux-gnu
cache_dir="${CATALOGSYNC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/catalogsync}/image"
start=$SECONDS

log() { printf 'image: %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}
usage() {
  sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
  exit 0
}
usage_error() {
  log "error: $*"
  log "usage: hack/image.sh [catalogsync|pause] [--out FILE] [--name REF] (--help for more)"
  exit 2
}

kind=catalogsync
out=
name=
while (($# > 0)); do
  case $1 in
    catalogsync | pause) kind=$1 ;;
    --out | --name)
      (($# > 1)) || usage_error "$1 needs a value"
      if [[ $1 == --out ]]; then out=$2; else name=$2; fi
      shift
      ;;
    --out=*) out=${1#--out=} ;;
    --name=*) name=${1#--name=} ;;
    -h | --help) usage ;;
    *) usage_error "unknown argument $1" ;;
  esac
  shift
done

# Installs a Debian package when a command is missing (as hack/test.sh does for libfaketime).
need() { # command package
  command -v "$1" >/dev/null && return
  if ((EUID == 0)) && command -v apt-get >/dev/null; then
    log "installing $2 (for $1)"
    apt-get install -y -q "$2" >&2 || { apt-get update -q >&2 && apt-get install -y -q "$2" >&2; }
  fi
  command -v "$1" >/dev/null || die "$1 is missing: install the $2 package"
}

# The fully qualified name that a pod's `image:` resolves to, e.g. catalogsync:0.1.0 ->
# docker.io/library/catalogsync:0.1.0: containerd looks images up under that name.
qualified() { # ref
  local ref=$1 first
  [[ $ref != *@* ]] || die "--name $ref: give a tag, not a digest"
  [[ ${ref##*/} == *:* ]] || ref+=:latest
  first=${ref%%/*}
  if [[ $ref != */* ]]; then
    ref=docker.io/library/$ref
  elif [[ $first != *.* && $first != *:* && $first != localhost ]]; then
    ref=docker.io/$ref
  fi
  printf '%s' "$ref"
}

# Fails unless the binary is statically linked (no program interpreter, no shared libraries).
require_static() { # file
  if readelf -lW "$1" | grep -q 'program interpreter' || readelf -dW "$1" | grep -q '(NEEDED)'; then
    die "$1 is not statically linked"
  fi
}

# The release binary, static-pie; prints its path.
build_catalogsync() {
  log "building the release binary (static-pie, target $TARGET)"
  local t=$SECONDS bin
  bin="$(RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked \
    --package catalogsync --bin catalogsync --target "$TARGET" \
    --message-format=json-render-diagnostics |
    jq -r 'select(.reason == "compiler-artifact" and .target.name == "catalogsync"
      and .executable != null) | .executable')"
  [[ -x $bin ]] || die "cargo build did not report the catalogsync executable"
  log "built $bin in $((SECONDS - t)) s"
  printf '%s' "$bin"
}

# The candidate version of a Debian package in the host's apt lists, or nothing.
candidate() { # package
  apt-cache policy "$1" 2>/dev/null | awk '$1 == "Candidate:" && $2 != "(none)" { print $2 }'
}

# Path of the cached ca-certificates .deb, downloaded on first use (and when the apt sources
# move to a new version).
ca_deb() {
  local dir=$cache_dir/debs version file tmp
  mkdir -p "$dir"
  if ! command -v apt-get >/dev/null; then
    file="$(find "$dir" -name 'ca-certificates_*_all.deb' | LC_ALL=C sort -V | tail -n1)"
    [[ -n $file ]] || die "no apt-get to download ca-certificates, and no .deb in $dir"
    printf '%s' "$file"
    return
  fi
  version="$(candidate ca-certificates)"
  if [[ -z $version ]] && ((EUID == 0)); then
    apt-get update -q >&2
    version="$(candidate ca-certificates)"
  fi
  [[ -n $version ]] || die "apt knows no ca-certificates package (run apt-get update)"
  file="$dir/ca-certificates_${version//:/%3a}_all.deb"
  if [[ -f $file ]]; then
    log "ca-certificates $version: cached"
  else
    log "ca-certificates $version: downloading"
    tmp="$(mktemp -d "$dir/download.XXXXXX")"
    (cd "$tmp" && apt-get download -q -o APT::Sandbox::User=root "ca-certificates=$version" >&2) ||
      { rm -rf "$tmp" && die "apt-get download ca-certificates=$version failed (run apt-get update?)"; }
    mv "$tmp"/ca-certificates_*.deb "$file"
    rm -rf "$tmp"
  fi
  printf '%s' "$file"
}

# The catalogsync image's root filesystem.
rootfs_catalogsync() { # dir binary
  local root=$1 bin=$2 deb=$work/ca-certificates deb_file
  install -d -m 0755 "$root"/{etc/ssl/certs,usr/local/bin,usr/share/doc/ca-certificates}
  install -d -m 1777 "$root/tmp"
  # Strip the debug info (the release profile keeps line tables: 120 MB), keep the symbols
  # for backtraces.
  objcopy --strip-debug "$bin" "$root/usr/local/bin/catalogsync"
  chmod 0755 "$root/usr/local/bin/catalogsync"
  require_static "$root/usr/local/bin/catalogsync"

  printf '%s\n' \
    'root:x:0:0:root:/root:/sbin/nologin' \
    'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' >"$root/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$root/etc/group"
  # Only the NSS modules built into glibc exist in a static binary.
  printf '%s\n' 'passwd: files' 'group: files' 'hosts: files dns' >"$root/etc/nsswitch.conf"

  # What update-ca-certificates makes of the package: every certificate, in file name order,
  # each ending in a newline (awk 1).
  deb_file="$(ca_deb)"
  mkdir -p "$deb"
  dpkg-deb -x "$deb_file" "$deb"
  find "$deb/usr/share/ca-certificates" -type f -name '*.crt' -print0 | LC_ALL=C sort -z |
    xargs -0 awk 1 >"$root/etc/ssl/certs/ca-certificates.crt"
  local count
  count="$(grep -c 'BEGIN CERTIFICATE' "$root/etc/ssl/certs/ca-certificates.crt" || true)"
  ((count > 0)) || die "the ca-certificates package holds no certificates"
  log "CA bundle: $count certificates"
  install -m 0644 "$deb/usr/share/doc/ca-certificates/copyright" "$root/usr/share/doc/ca-certificates/"
}

# The pause image's root filesystem: the static pause binary as /pause.
rootfs_pause() { # dir
  local root=$1
  if [[ -z ${TEST_ASSET_PAUSE:-} ]]; then
    eval "$(hack/k8s-bins.sh pause)"
  fi
  [[ -x $TEST_ASSET_PAUSE ]] || die "TEST_ASSET_PAUSE=$TEST_ASSET_PAUSE is not an executable"
  require_static "$TEST_ASSET_PAUSE"
  install -d -m 0755 "$root"
  install -m 0755 "$TEST_ASSET_PAUSE" "$root/pause"
}

# One reproducible layer: fixed order, owners, times; modes as laid out above.
layer_tar() { # rootfs out
  local entries
  mapfile -t entries < <(cd "$1" && find . -mindepth 1 -maxdepth 1 -printf '%P\n' | LC_ALL=C sort)
  tar -C "$1" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu \
    -cf "$2" "${entries[@]}"
}

need jq jq
need umoci umoci
need readelf binutils

epoch=1970-01-01T00:00:00Z
case $kind in
  catalogsync)
    command -v cargo >/dev/null || die "cargo is missing: install Rust (https://rustup.rs)"
    need dpkg-deb dpkg
    version="$(cargo metadata --no-deps --format-version 1 |
      jq -r '.packages[] | select(.name == "catalogsync") | .version')"
    name="${name:-catalogsync:$version}"
    default_out="catalogsync-$version.oci.tar"
    config=(--config.entrypoint /usr/local/bin/catalogsync --config.cmd run
      --config.user 65532:65532 --config.exposedports 8080/tcp
      --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
      --config.env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
      --config.label org.opencontainers.image.title=catalogsync
      --config.label "org.opencontainers.image.version=$version"
      --config.label org.opencontainers.image.licenses=Apache-2.0
      --config.label org.opencontainers.image.source=https://github.com/kyma-project/catalogsync)
    ;;
  pause)
    name="${name:-registry.k8s.io/pause:$PAUSE_VERSION}"
    default_out="pause-$PAUSE_VERSION.oci.tar"
    config=(--config.entrypoint /pause --config.user 65535:65535)
    ;;
esac
ref="$(qualified "$name")"
if [[ -z $out ]]; then
  out="${CARGO_TARGET_DIR:-target}/image/$default_out"
elif [[ $out != /* ]]; then
  out="$caller_dir/$out"
fi
mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"

work="$(mktemp -d "${TMPDIR:-/tmp}/catalogsync-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT
root=$work/rootfs
if [[ $kind == catalogsync ]]; then
  bin="$(build_catalogsync)"
  rootfs_catalogsync "$root" "$bin"
else
  rootfs_pause "$root"
fi

layout=$work/layout
layer_tar "$root" "$work/layer.tar"
umoci init --layout "$layout" >&2
umoci new --image "$layout:image" >&2
umoci raw add-layer --image "$layout:image" --history.created "$epoch" \
  --history.created_by "hack/image.sh $kind" "$work/layer.tar" >&2
umoci config --image "$layout:image" --created "$epoch" --no-history \
  --os linux --architecture amd64 "${config[@]}" >&2
umoci gc --layout "$layout" >&2

# The name, fully qualified, in both annotations that name an image in an OCI layout:
# containerd's import takes io.containerd.image.name first (a bare tag in
# org.opencontainers.image.ref.name would become import-<date>:<tag>), skopeo and podman read
# org.opencontainers.image.ref.name. The platform spares importers a look into the config.
jq -c --arg ref "$ref" '.manifests[0] += {
    platform: {architecture: "amd64", os: "linux"},
    annotations: {"io.containerd.image.name": $ref, "org.opencontainers.image.ref.name": $ref}
  }' "$layout/index.json" >"$work/index.json"
mv "$work/index.json" "$layout/index.json"
tar -C "$layout" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu \
  --mode=u+rw,go+r,go-w -cf "$out.tmp" oci-layout index.json blobs
mv "$out.tmp" "$out"

digest="$(jq -r '.manifests[0].digest' "$layout/index.json")"
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
unpacked="$(find "$root" -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }')"
log "$ref: $digest"
log "size: archive $(mib "$(stat -c %s "$out")"), unpacked $(mib "$unpacked"); made in $((SECONDS - start)) s"
printf '%s\n' "$out"

# Sourced by the scripts that provide one pinned Go tool from the Go module proxy, built once
# into catalogsync's cache (hack/kustomize.sh, hack/prometheus.sh). Not a command of its own.

cache_root="${CATALOGSYNC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/catalogsync}"

# go_tool VAR NAME VERSION PACKAGE [TAGS]
#
# Prints `export VAR=<path>` for the command NAME of Go package PACKAGE at module version
# VERSION: $VAR from the environment when it names an executable; else the cached build; else
# it builds it with `go install PACKAGE@VERSION` (with the comma-separated build TAGS) into
# $cache_root/NAME/VERSION[-TAGS]/NAME. Progress goes to stderr.
go_tool() {
  local var=$1 name=$2 version=$3 package=$4 tags=${5:-}
  local key=$version
  if [[ -n $tags ]]; then key="$version-$(printf '%s' "$tags" | tr ',' '-')"; fi
  local out="$cache_root/$name/$key/$name"
  if [[ -n "${!var:-}" && -x "${!var}" ]]; then
    printf '%s: using %s=%s from the environment\n' "$name" "$var" "${!var}" >&2
  elif [[ -x $out ]]; then
    printf '%s %s: cached at %s\n' "$name" "$version" "$out" >&2
    printf -v "$var" '%s' "$out"
  else
    command -v go >/dev/null || { printf '%s: error: go is not installed; it is needed to build it\n' "$name" >&2; return 1; }
    mkdir -p "$(dirname "$out")"
    local tmp start=$SECONDS
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/$name-build.XXXXXX")"
    printf '%s %s: building %s@%s%s\n' "$name" "$version" "$package" "$version" "${tags:+ (tags $tags)}" >&2
    # `go install module@version` ignores any go.mod around it; run it from an empty directory anyway.
    if ! (cd "$tmp" && GOTOOLCHAIN=local CGO_ENABLED=0 GOBIN="$tmp/bin" \
      go install -trimpath ${tags:+-tags "$tags"} -ldflags "-s -w" "$package@$version"); then
      rm -rf "$tmp"
      return 1
    fi
    mv "$tmp/bin/$name" "$out"
    rm -rf "$tmp"
    printf '%s %s: built in %d s at %s\n' "$name" "$version" $((SECONDS - start)) "$out" >&2
    printf -v "$var" '%s' "$out"
  fi
  printf 'export %s=%q\n' "$var" "${!var}"
}

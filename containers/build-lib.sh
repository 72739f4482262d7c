# Shared by the images' `build` scripts (sourced, not run): the container tool, the local
# Debian base and the host's pip settings. The sourcing script sets `prog` and `usage`.
#
# The tool: SPECTRUM_CONTAINER_TOOL=docker|podman, else docker where a docker daemon answers,
# else podman (installed with apt-get when absent and run as root) with the project's
# containers.conf (runc, the host's limits).
# The base: localhost/spectrum-base:bookworm, Debian bookworm made with debootstrap (no
# registry needed), made once and reused by every image built on it.
# pip's settings reach a build without entering any layer: the CA bundle (PIP_CERT /
# SSL_CERT_FILE) and the PIP_FIND_LINKS folders are mounted read-only, private indexes
# (PIP_INDEX_URL, PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST) come in a mounted pip.conf.

containers_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo_root=$(cd "$containers_dir/.." && pwd)
BASE_IMAGE=localhost/spectrum-base:bookworm
DEBIAN_MIRROR=${SPECTRUM_DEBIAN_MIRROR:-http://deb.debian.org/debian}
# Packages of the base: Python for the servers, libnuma for vLLM's CPU engine.
BASE_PACKAGES=python3,python3-venv,ca-certificates,libnuma1

say() { echo "build: $*" >&2; }
bad_input() { echo "$prog: $*" >&2; echo "$usage" >&2; exit 2; }
fail() { echo "$prog: $*" >&2; exit 1; }

# check_tag TAG EXAMPLE: Docker's reference grammar (lowercase path components, optional
# :tag of up to 128 characters).
check_tag() {
  local name_re='^([a-z0-9.-]+(:[0-9]+)?/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?$'
  [[ "$1" =~ $name_re ]] || bad_input "--tag '$1' is not an image name: use lowercase letters, digits and . _ - with an optional :tag, e.g. $2"
}

as_root_apt_install() {   # packages...
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing $* (Debian packages)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
  else
    fail "missing $*: install them (Debian: apt-get install $*) and rerun"
  fi
}

# choose_tool: sets `tool` (docker or podman) and, for podman, CONTAINERS_CONF.
choose_tool() {
  tool=${SPECTRUM_CONTAINER_TOOL:-}
  case "$tool" in
    ""|docker|podman) ;;
    *) bad_input "SPECTRUM_CONTAINER_TOOL='$tool' is not a container tool: use docker or podman" ;;
  esac
  if [ -z "$tool" ]; then
    if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then tool=docker; else tool=podman; fi
  fi
  if [ "$tool" = docker ]; then
    docker info >/dev/null 2>&1 || fail "SPECTRUM_CONTAINER_TOOL=docker but no docker daemon answers (docker info failed)"
  else
    local need=() cmd
    for cmd in podman runc; do command -v $cmd >/dev/null 2>&1 || need+=("$cmd"); done
    [ ${#need[@]} -eq 0 ] || as_root_apt_install "${need[@]}"
    export CONTAINERS_CONF="$containers_dir/podman/containers.conf"
  fi
  say "using $tool"
}

image_exists() { "$tool" image inspect "$1" >/dev/null 2>&1; }

# ensure_base: the local Debian base, made with debootstrap when the tool lacks it.
ensure_base() {
  image_exists "$BASE_IMAGE" && return 0
  command -v debootstrap >/dev/null 2>&1 || as_root_apt_install debootstrap
  [ "$(id -u)" = 0 ] || fail "making $BASE_IMAGE needs root (debootstrap); rerun as root"
  base_root=$(mktemp -d /tmp/spectrum-base.XXXXXX)
  trap 'rm -rf "$base_root"' EXIT
  say "making $BASE_IMAGE with debootstrap from $DEBIAN_MIRROR (about a minute)"
  if ! debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$base_root/fs" \
      "$DEBIAN_MIRROR" >"$base_root/debootstrap.log" 2>&1; then
    tail -20 "$base_root/debootstrap.log" >&2
    fail "debootstrap failed (mirror $DEBIAN_MIRROR; set SPECTRUM_DEBIAN_MIRROR to use another)"
  fi
  rm -rf "$base_root"/fs/var/cache/apt/archives/*.deb "$base_root"/fs/var/lib/apt/lists/*
  tar -C "$base_root/fs" -c . | "$tool" import - "$BASE_IMAGE" >/dev/null
  rm -rf "$base_root"
  trap - EXIT
}

# forward_pip_settings: fills `pip_flags` with build flags that put nothing into a layer.
pip_flags=()
forward_pip_settings() {
  local cert=${PIP_CERT:-${SSL_CERT_FILE:-}} dir conf
  if [ "$tool" = docker ]; then
    # docker build cannot mount host files: the build uses the daemon's network as it is.
    [ -z "${PIP_FIND_LINKS:-}" ] || say "docker build cannot mount PIP_FIND_LINKS; pip uses the indexes"
    return
  fi
  if [ -n "$cert" ] && [ -f "$cert" ]; then
    pip_flags+=(--volume "$cert:/host-ca.pem:ro" --build-arg PIP_CERT=/host-ca.pem)
  fi
  if [ -n "${PIP_FIND_LINKS:-}" ]; then
    for dir in $PIP_FIND_LINKS; do
      [ -d "$dir" ] && pip_flags+=(--volume "$dir:$dir:ro")
    done
    pip_flags+=(--build-arg "PIP_FIND_LINKS=$PIP_FIND_LINKS")
  fi
  if [ -n "${PIP_INDEX_URL:-}${PIP_EXTRA_INDEX_URL:-}${PIP_TRUSTED_HOST:-}" ]; then
    # Index URLs may carry credentials: a mounted file keeps them out of the image history.
    conf=$(mktemp /tmp/spectrum-pip.XXXXXX.conf)
    {
      echo "[global]"
      [ -z "${PIP_INDEX_URL:-}" ] || echo "index-url = $PIP_INDEX_URL"
      [ -z "${PIP_EXTRA_INDEX_URL:-}" ] || echo "extra-index-url = $PIP_EXTRA_INDEX_URL"
      [ -z "${PIP_TRUSTED_HOST:-}" ] || echo "trusted-host = $PIP_TRUSTED_HOST"
    } >"$conf"
    pip_flags+=(--volume "$conf:/host-pip.conf:ro" --build-arg PIP_CONFIG_FILE=/host-pip.conf)
  fi
}

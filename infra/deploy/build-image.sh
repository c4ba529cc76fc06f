#!/usr/bin/env bash
# Builds the router image from infra/deploy/Dockerfile.
#
#   infra/deploy/build-image.sh [TAG]          # TAG defaults to rhumbatron:<the project's version>
#   infra/deploy/build-image.sh run [OPTIONS] IMAGE [ARGS]
#                                              # `ENGINE run`, with this machine's options below
#
# Environment:
#   ENGINE  podman or docker (default: podman when installed, else docker)
#   BASE    the base image (default: the Dockerfile's, python:3.11-slim-bookworm). BASE=debian
#           builds a stand-in from Debian bookworm's own packages with mmdebstrap (CPython 3.11
#           in a venv at /usr/local/python, first on PATH, so `python` and `pip` behave as in
#           the official image) and tags it localhost/rhumbatron-base:bookworm: for a machine
#           that reaches Debian's mirror and PyPI but no container registry.
#
# The build context is a folder holding only what the Dockerfile's COPY lines name, so neither
# a virtualenv nor the state in .local is sent to the engine.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DOCKERFILE="$ROOT/infra/deploy/Dockerfile"
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$ROOT/pyproject.toml" | head -n 1)
STAND_IN=localhost/rhumbatron-base:bookworm

if [[ -z "${ENGINE:-}" ]]; then
  if command -v podman >/dev/null; then ENGINE=podman; else ENGINE=docker; fi
fi
command -v "$ENGINE" >/dev/null || {
  echo "build-image.sh: no container engine: '$ENGINE' is not installed (set ENGINE=podman or docker)" >&2
  exit 2
}

# Options for a builder without CAP_SYS_RESOURCE (a container or a micro-VM's root): the
# engine's default limits for the build's containers are higher than its own, and raising a
# limit needs that capability, so each is held to the builder's own (nproc also to pid_max,
# which the runtime refuses to exceed there). crun refuses a hybrid cgroup hierarchy (v1
# controllers beside a v2 mount); runc runs in one.
engine_opts=()
run_opts=()
cap_eff=$(awk '/^CapEff:/ {print $2}' /proc/self/status)
if (((16#$cap_eff >> 24 & 1) == 0)); then
  nproc=$(ulimit -Hu)
  pid_max=$(cat /proc/sys/kernel/pid_max)
  if [[ "$nproc" == unlimited ]] || ((nproc > pid_max)); then nproc=$pid_max; fi
  run_opts+=(--ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit "nproc=$nproc:$nproc")
fi
if [[ "$ENGINE" == podman ]] && mountpoint -q /sys/fs/cgroup/unified 2>/dev/null; then
  command -v runc >/dev/null || {
    echo "build-image.sh: this machine's cgroups are hybrid (v1 and v2), which crun refuses: install runc" >&2
    exit 2
  }
  engine_opts+=(--runtime runc)
fi

if [[ "${1:-}" == run ]]; then
  shift
  exec "$ENGINE" "${engine_opts[@]}" run "${run_opts[@]}" "$@"
fi

TAG=${1:-rhumbatron:$VERSION}

stand_in_base() {
  if "$ENGINE" image inspect "$STAND_IN" >/dev/null 2>&1; then return; fi
  command -v mmdebstrap >/dev/null || {
    echo "build-image.sh: BASE=debian needs mmdebstrap (apt-get install mmdebstrap)" >&2
    exit 2
  }
  local tree
  tree=$(mktemp -d)
  # The machine's own CAs (/usr/local/share/ca-certificates) are trusted in the base too, so
  # pip reaches PyPI through a TLS-inspecting proxy as it does on the machine. The hooks' "$1"
  # (the tree) is mmdebstrap's to expand, hence the single quotes.
  # shellcheck disable=SC2016
  mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    --customize-hook='if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
        cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/"
        chroot "$1" update-ca-certificates; fi' \
    --customize-hook='chroot "$1" python3 -m venv /usr/local/python' \
    bookworm "$tree/base.tar"
  "$ENGINE" import \
    --change 'ENV PATH=/usr/local/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    "$tree/base.tar" "$STAND_IN"
  rm -rf "$tree"
}

build_args=(--build-arg "VERSION=$VERSION")
case "${BASE:-}" in
  "") ;;
  debian)
    stand_in_base
    build_args+=(--build-arg "BASE=$STAND_IN")
    ;;
  *) build_args+=(--build-arg "BASE=$BASE") ;;
esac

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
# Every source of a COPY without --from: all its words but the instruction and the destination.
mapfile -t sources < <(awk '$1 == "COPY" && $2 !~ /^--/ { for (i = 2; i < NF; i++) print $i }' "$DOCKERFILE")
for source in "${sources[@]}"; do
  (cd "$ROOT" && cp -r --parents "$source" "$context/")
done
find "$context" \( -name __pycache__ -o -name '*.egg-info' \) -prune -exec rm -rf {} +

"$ENGINE" "${engine_opts[@]}" build "${run_opts[@]}" "${build_args[@]}" \
  -f "$DOCKERFILE" -t "$TAG" "$context"
echo "built $TAG"

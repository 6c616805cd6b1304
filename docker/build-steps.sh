#!/usr/bin/env bash
# The worker image's build steps, one sub-command per step, so that the Dockerfile and CI
# (tools/check-docker.sh, without a Docker engine) run and check the same thing.
#
#   build DEST             build stage: the build deps of tools/setup-deps.sh without the PyPI
#                          venv, a Release build (tools/build.sh), then the binary and the
#                          scripts installed under DEST/usr/local/bin for the runtime stage
#   runtime-packages       the Debian packages the runtime stage needs, one per line
#   install-runtime        runtime stage: installs them (apt, no recommends), then empties apt's lists
#
# Run from the repository root (the build stage's WORKDIR).
set -euo pipefail

# Debian 12 packages of the shared libraries build/tools/ptcfs links (`readelf -d`: NEEDED),
# and fuse3 for fusermount3 (an unprivileged unmount; the entrypoint clears a stale mount with
# it). The libraries those pull in (libcurl4, libsz2, libssl3, ... under libhdf5-103-1) come as
# their dependencies; tools/check-docker.sh checks every library `ldd` lists is covered.
RUNTIME_PACKAGES=(
  libc6 libgcc-s1 libstdc++6
  libfuse3-3 fuse3
  libhdf5-103-1 libxxhash0 zlib1g libcpp-httplib0.11
)

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

build() {
  local dest="${1:?usage: build-steps.sh build DEST}"
  cd "$root"
  PTCFS_NO_VENV=1 bash tools/setup-deps.sh
  bash tools/build.sh release
  install -D -m 755 build/tools/ptcfs "$dest/usr/local/bin/ptcfs"
  install -D -m 755 docker/entrypoint.sh "$dest/usr/local/bin/ptcfs-worker"
  install -D -m 755 docker/init-job.sh "$dest/usr/local/bin/ptcfs-init-job"
  # The image must run what it was built with: every library resolved.
  if ldd "$dest/usr/local/bin/ptcfs" | grep -q 'not found'; then
    ldd "$dest/usr/local/bin/ptcfs" >&2
    echo "build-steps: ptcfs links a library that is not found" >&2
    exit 1
  fi
}

install_runtime() {
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${RUNTIME_PACKAGES[@]}"
  $sudo rm -rf /var/lib/apt/lists/*
}

case "${1:-}" in
  build) shift; build "$@" ;;
  runtime-packages) printf '%s\n' "${RUNTIME_PACKAGES[@]}" ;;
  install-runtime) install_runtime ;;
  *)
    echo "usage: $0 build DEST | runtime-packages | install-runtime" >&2
    exit 2
    ;;
esac

#!/usr/bin/env bash
# The worker image's build steps, one sub-command per step, so that the Dockerfiles and CI
# (docker/check.sh, without a Docker engine) run and check the same thing.
#
#   build DEST              docker/Dockerfile's build stage: the build packages (apt, no
#                           recommends), a Release build of the ptcfs binary alone (no tests),
#                           then install-binary of it into DEST
#   install-binary BIN DEST the binary BIN and the worker's scripts under DEST/usr/local/bin, as
#                           the runtime stage copies them (docker/env.sh stages a host
#                           build this way for docker/Dockerfile.prebuilt); fails when BIN
#                           links a library that is not found here
#   build-packages          the Debian packages the build needs, one per line
#   runtime-packages        the Debian packages the runtime stage needs, one per line
#   install-runtime         runtime stage: installs them (apt, no recommends), then empties apt's lists
#
# Run from anywhere; build works in the repository this script is in.
set -euo pipefail

# The part of tools/setup-deps.sh's list that the ptcfs binary needs (no clang, Python, torch,
# GoogleTest or etcd: none of the tests is built). docker/check.sh checks each is there.
BUILD_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libhdf5-dev nlohmann-json3-dev libcli11-dev libxxhash-dev libfuse3-dev zlib1g-dev libdeflate-dev libcpp-httplib-dev libssl-dev libjemalloc-dev
)

# Debian 12 packages of the shared libraries build/tools/ptcfs links (`readelf -d`: NEEDED),
# and fuse3 for fusermount3 (an unprivileged unmount; the entrypoint clears a stale mount with
# it). The libraries those pull in (libcurl4, libsz2, libssl3, ... under libhdf5-103-1) come as
# their dependencies; docker/check.sh checks every library `ldd` lists is covered.
RUNTIME_PACKAGES=(
  libc6 libgcc-s1 libstdc++6
  libfuse3-3 fuse3
  libhdf5-103-1 libxxhash0 zlib1g libdeflate0 libcpp-httplib0.11 libssl3 libjemalloc2
)

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

apt_install() {
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "$@"
  $sudo rm -rf /var/lib/apt/lists/*
}

install_binary() {
  local bin="${1:?usage: build-steps.sh install-binary BIN DEST}" dest="${2:?usage: build-steps.sh install-binary BIN DEST}"
  install -D -m 755 "$bin" "$dest/usr/local/bin/ptcfs"
  install -D -m 755 "$here/entrypoint.sh" "$dest/usr/local/bin/ptcfs-worker"
  install -D -m 755 "$here/init-job.sh" "$dest/usr/local/bin/ptcfs-init-job"
  # The image must run what it was built with: every library resolved.
  if ldd "$dest/usr/local/bin/ptcfs" | grep -q 'not found'; then
    ldd "$dest/usr/local/bin/ptcfs" >&2
    echo "build-steps: $bin links a library that is not found" >&2
    exit 1
  fi
}

build() {
  local dest="${1:?usage: build-steps.sh build DEST}"
  apt_install "${BUILD_PACKAGES[@]}"
  cd "$root"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPTCFS_BUILD_TESTS=OFF > /dev/null
  # PTCFS_BUILD_JOBS (a build argument of docker/Dockerfile): parallel compiles, default one per CPU.
  cmake --build build --target ptcfs -j "${PTCFS_BUILD_JOBS:-$(nproc)}"
  install_binary build/tools/ptcfs "$dest"
}

case "${1:-}" in
  build) shift; build "$@" ;;
  install-binary) shift; install_binary "$@" ;;
  build-packages) printf '%s\n' "${BUILD_PACKAGES[@]}" ;;
  runtime-packages) printf '%s\n' "${RUNTIME_PACKAGES[@]}" ;;
  install-runtime) apt_install "${RUNTIME_PACKAGES[@]}" ;;
  *)
    echo "usage: $0 build DEST | install-binary BIN DEST | build-packages | runtime-packages | install-runtime" >&2
    exit 2
    ;;
esac

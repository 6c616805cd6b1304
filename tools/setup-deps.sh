#!/usr/bin/env bash
# Installs what ptcfs needs to build and test on Debian 12, from Debian packages.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
PACKAGES=(
  build-essential cmake ninja-build pkg-config clang
  libhdf5-dev nlohmann-json3-dev libcli11-dev libxxhash-dev libgtest-dev libfuse3-dev fuse3
  python3 python3-numpy python3-h5py
  zlib1g-dev python3-torch
  libcpp-httplib-dev etcd-server etcd-client
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "ptcfs setup: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

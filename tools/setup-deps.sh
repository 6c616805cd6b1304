#!/usr/bin/env bash
# Installs what ptcfs needs to build and test on Debian 12, from Debian packages.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# What the build needs, and the quickstart (PTCFS_PACKAGES=build: its job runs the venv's Python).
PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libhdf5-dev nlohmann-json3-dev libcli11-dev libxxhash-dev libgtest-dev libfuse3-dev fuse3
  python3 python3-venv zlib1g-dev libdeflate-dev libcpp-httplib-dev libjemalloc-dev libssl-dev mold
)
# What only the tests need: clang (the ThreadSanitizer build), Debian's Python clients (numpy,
# h5py, torch, yaml for docker/check.sh), etcd for the cluster suites, a single-node Ceph's
# radosgw (and curl) for the S3 durable tier's.
TEST_PACKAGES=(clang python3-numpy python3-h5py python3-torch python3-yaml
               etcd-server etcd-client curl ceph-mon ceph-osd radosgw ceph-common)
[ "${PTCFS_PACKAGES:-all}" = build ] || PACKAGES+=("${TEST_PACKAGES[@]}")
missing=()
[ "${PTCFS_VENV_ONLY:-0}" = 1 ] && PACKAGES=()  # the venv part alone (the quickstart runs it beside the build)
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "ptcfs setup: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The Python clients people use, from PyPI (tools/requirements-clients.txt: torch 2,
# safetensors, megatron-core, transformers, numpy) in .venv/ at the repository root, for the tests
# labelled `clients` and the quickstart. Debian's /usr/bin/python3 clients stay in use too.
# Quick when already there: a stamp records the requirements the venv was made from.
# PTCFS_VENV overrides the place; PTCFS_NO_VENV=1 skips this part; PTCFS_VENV_SET=quickstart
# installs only what the quickstart imports (tools/requirements-quickstart.txt).
if [ "${PTCFS_NO_VENV:-0}" != 1 ]; then
  root="$(cd "$(dirname "$0")/.." && pwd)"
  venv="${PTCFS_VENV:-$root/.venv}"
  requirements="$root/tools/requirements-clients.txt"
  no_deps="$root/tools/requirements-no-deps.txt"
  quick="$root/tools/requirements-quickstart.txt"
  stamp="$venv/ptcfs-requirements.txt"
  quick_stamp="$venv/ptcfs-quickstart.txt"
  pip=(-m pip install --disable-pip-version-check --progress-bar off)
  if [ -x "$venv/bin/python" ] && cat "$requirements" "$no_deps" | cmp -s - "$stamp"; then
    echo "ptcfs setup: $venv is up to date"
  elif [ "${PTCFS_VENV_SET:-all}" = quickstart ] && [ -x "$venv/bin/python" ] && cmp -s "$quick" "$quick_stamp"; then
    echo "ptcfs setup: $venv has the quickstart's clients"
  elif [ "${PTCFS_VENV_SET:-all}" = quickstart ]; then
    echo "ptcfs setup: making $venv with $(grep -v '^#' "$quick" | xargs) from PyPI"
    [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
    "$venv/bin/python" "${pip[@]}" -r "$quick"
    cp "$quick" "$quick_stamp"
  else
    echo "ptcfs setup: making $venv with $(grep -v '^#' "$requirements" | xargs) from PyPI (about 5 GB, a minute or more)"
    [ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
    "$venv/bin/python" "${pip[@]}" -r "$requirements"
    "$venv/bin/python" "${pip[@]}" --no-deps -r "$no_deps"
    cat "$requirements" "$no_deps" > "$stamp"
    echo "ptcfs setup: $venv ready ($("$venv/bin/python" -c 'import torch, safetensors; print("torch", torch.__version__, "safetensors", safetensors.__version__)'))"
  fi
fi

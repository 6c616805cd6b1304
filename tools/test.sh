#!/usr/bin/env bash
# Sets up, builds (Release, then AddressSanitizer+UBSan) and runs every test,
# then builds the concurrency suites with clang (ThreadSanitizer, and its
# -Wthread-safety analysis of every lock) and runs them.
# This is the README's test command and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-deps.sh
# The S3 server of the durable tier's tests (radosgw on a single-node Ceph,
# tests/ceph/ceph.sh, ~20 s): started once for every stage, always stopped.
ceph_dir=$(mktemp -d /tmp/ptcfs-ceph.XXXXXX)
trap 'bash tests/ceph/ceph.sh stop "$ceph_dir"' EXIT
bash tests/ceph/ceph.sh start "$ceph_dir"
source "$ceph_dir/env"
for kind in release asan; do
  echo "== build ($kind)"
  bash tools/build.sh "$kind"
  dir=build; [ "$kind" = asan ] && dir=build-asan
  echo "== test ($kind)"
  # Under ASan every suite but the real clients' (label clients: clients_test,
  # hf_clients_test, cluster_train_test, cluster_dcp_test: minutes of torch,
  # megatron-core and transformers in Python; the daemon paths they drive are
  # the mount and cluster suites', which run here too).
  skip=(); [ "$kind" = asan ] && skip=(-LE clients)
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$dir" -j "$(nproc)" --output-on-failure "${skip[@]}"
done
echo "== build (tsan: clang, ThreadSanitizer and -Wthread-safety)"
bash tools/build.sh tsan
echo "== test (tsan: the suites labelled threads)"
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tools/tsan.supp ctest --test-dir build-tsan -L threads -j "$(nproc)" --output-on-failure
echo "== all tests passed"

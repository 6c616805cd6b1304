#!/usr/bin/env bash
# Sets up, builds (Release, then AddressSanitizer+UBSan) and runs every test,
# then builds the concurrency suites with clang (ThreadSanitizer, and its
# -Wthread-safety analysis of every lock) and runs them.
# This is the README's test command and what CI runs.
#
# The stages overlap where one leaves the CPU idle: the Python clients download
# while the Release build compiles; the sanitizer builds compile at the lowest
# priority while the Release suites run (most of them wait on mounts, daemons,
# etcd and the disk); the TSan suites run beside the ASan ones. Each stage's
# time is printed (`== ... done in M:SS`); a background stage's log is kept in
# the directory printed first and shown when it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
logs=$(mktemp -d /tmp/ptcfs-test.XXXXXX)
echo "== logs of the background stages: $logs"
t0=$SECONDS
stage_start=$SECONDS
done_in() {  # done_in WHAT: the time since the last stage ended
  printf '== %s done in %d:%02d (%d:%02d in all)\n' "$1" $(((SECONDS - stage_start) / 60)) $(((SECONDS - stage_start) % 60)) \
    $(((SECONDS - t0) / 60)) $(((SECONDS - t0) % 60))
  stage_start=$SECONDS
}
# bg LOG CMD...: CMD in the background, in a process group of its own (stopped on exit), into LOG.
bg_pids=()
bg() {
  local log="$1"
  shift
  setsid -w "$@" >"$log" 2>&1 &
  bg_pids+=($!)
}
stop_bg() { for p in "${bg_pids[@]}"; do kill -- "-$p" 2>/dev/null || true; done; }
# await PID WHAT LOG: waits for a background stage; on failure shows its log's end and stops.
await() {
  if ! wait "$1"; then
    echo "== FAILED: $2 (the end of $3:)" >&2
    tail -n 60 "$3" >&2
    exit 1
  fi
}

PTCFS_NO_VENV=1 bash tools/setup-deps.sh  # Debian packages: the build needs them
bg "$logs/venv.log" env PTCFS_VENV_ONLY=1 bash tools/setup-deps.sh
venv_pid=$!
# The S3 server of the durable tier's tests (radosgw on a single-node Ceph,
# tests/ceph/ceph.sh, ~20 s): started once for every stage, always stopped.
ceph_dir=$(mktemp -d /tmp/ptcfs-ceph.XXXXXX)
trap 'stop_bg; bash tests/ceph/ceph.sh stop "$ceph_dir"' EXIT
bg "$logs/ceph.log" bash tests/ceph/ceph.sh start "$ceph_dir"
ceph_pid=$!

echo "== build (release)"
bash tools/build.sh release
await "$venv_pid" "the Python clients (.venv)" "$logs/venv.log"
await "$ceph_pid" "the S3 server (tests/ceph/ceph.sh)" "$logs/ceph.log"
source "$ceph_dir/env"
done_in "setup and build (release)"

# ASan+UBSan, then TSan (clang, ThreadSanitizer and -Wthread-safety: the suites labelled
# threads), built at the lowest priority beside the Release suites.
bg "$logs/sanitizer-builds.log" nice -n 19 bash -c 'bash tools/build.sh asan && bash tools/build.sh tsan'
builds_pid=$!
echo "== test (release; the sanitizer builds beside it: $logs/sanitizer-builds.log)"
ctest --test-dir build -j "$(nproc)" --output-on-failure
done_in "test (release)"
await "$builds_pid" "the sanitizer builds" "$logs/sanitizer-builds.log"
done_in "the rest of the sanitizer builds"

# Under ASan every suite but the real clients' (label clients: clients_test,
# hf_clients_test, cluster_train_test, cluster_dcp_test: minutes of torch,
# megatron-core and transformers in Python; the daemon paths they drive are
# the mount and cluster suites', which run here too). The TSan suites beside them.
echo "== test (asan, and tsan beside it: $logs/tsan.log)"
bg "$logs/tsan.log" env TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tools/tsan.supp \
  ctest --test-dir build-tsan -L threads -j 1 --output-on-failure
tsan_pid=$!
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan -j "$(nproc)" --output-on-failure -LE clients
await "$tsan_pid" "test (tsan)" "$logs/tsan.log"
tail -n 4 "$logs/tsan.log"
done_in "test (asan, tsan)"
echo "== all tests passed"

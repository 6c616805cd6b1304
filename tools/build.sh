#!/usr/bin/env bash
# Builds ptcfs. Usage: tools/build.sh [release|asan|tsan] [TARGET...] -> build/, build-asan/ or build-tsan/
#   TARGET...: only these (tools/quickstart.sh builds `ptcfs` alone: its job needs nothing else)
#   tsan: ThreadSanitizer, the tool and the suites labelled `threads` only,
#         built by clang with its thread-safety analysis (PTCFS_THREAD_SAFETY):
#         any lock misuse in the libraries, the tool or those suites fails the build.
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:-release}"
shift || true
target=()
[ "$#" -gt 0 ] && target=(--target "$@")
case "$kind" in
  release) dir=build; flags=(-DCMAKE_BUILD_TYPE=Release) ;;
  asan) dir=build-asan; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DPTCFS_SANITIZE=ON -DPTCFS_SHARED_LAYERS=ON) ;;
  tsan)
    dir=build-tsan
    flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DPTCFS_TSAN=ON -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++
           -DPTCFS_THREAD_SAFETY=ON -DPTCFS_SHARED_LAYERS=ON)
    [ "$#" -gt 0 ] || target=(--target ptcfs env_test virtual_file_test transform_test mount_test store_lock_test filesystem_test
            cluster_peer_test cluster_pull_test cluster_etcd_test cluster_slowloris_test switch_cpu_test worker_agent_test cluster_kv_test)
    ;;
  *) echo "usage: $0 [release|asan|tsan] [TARGET...]" >&2; exit 2 ;;
esac
# ccache when present: a rebuild after a change, or in another worktree of the
# same repository, compiles only what changed (paths taken relative to the
# checkout; the precompiled headers' defines and times are the build's own).
if command -v ccache >/dev/null; then
  flags+=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
fi
cmake -S . -B "$dir" -G Ninja "${flags[@]}" >/dev/null
cmake --build "$dir" -j "$(nproc)" "${target[@]}"

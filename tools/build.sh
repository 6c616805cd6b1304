#!/usr/bin/env bash
# Builds ptcfs. Usage: tools/build.sh [release|asan|tsa|tsan] -> build/, build-asan/, build-tsa/ or build-tsan/
#   tsan: ThreadSanitizer, the tool and the suites labelled `threads` only.
#   tsa: clang's thread-safety analysis (PTCFS_THREAD_SAFETY) over the
#        libraries, the ptcfs tool and the cluster layer, at -O0; any lock misuse fails the build.
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:-release}"
target=()
case "$kind" in
  release) dir=build; flags=(-DCMAKE_BUILD_TYPE=Release) ;;
  asan) dir=build-asan; flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DPTCFS_SANITIZE=ON) ;;
  tsa)
    dir=build-tsa
    flags=(-DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0 -DCMAKE_C_COMPILER=clang
           -DCMAKE_CXX_COMPILER=clang++ -DPTCFS_THREAD_SAFETY=ON -DPTCFS_BUILD_TESTS=OFF)
    target=(--target ptcfs cluster worker)
    ;;
  tsan)
    dir=build-tsan
    flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DPTCFS_TSAN=ON)
    target=(--target ptcfs env_test virtual_file_test transform_test mount_test store_lock_test filesystem_test
            cluster_peer_test cluster_etcd_test cluster_slowloris_test switch_cpu_test worker_agent_test cluster_kv_test)
    ;;
  *) echo "usage: $0 [release|asan|tsa|tsan]" >&2; exit 2 ;;
esac
cmake -S . -B "$dir" -G Ninja "${flags[@]}" >/dev/null
cmake --build "$dir" -j "$(nproc)" "${target[@]}"

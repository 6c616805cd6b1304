#!/usr/bin/env bash
# The GPU check of layout switching (docs/switching.md), as ONE script for a
# machine with a GPU (the device tool's H200: 16 cores, about 3 minutes):
#   1. builds, without CMake or the project's other dependencies (the GPU
#      image has none of HDF5, FUSE, CLI11), what the check needs: the model
#      layer, the planner, transform/device with its CUDA kernels and NCCL
#      executor, tests/switch_cuda_test.cc and bench/switch_cuda.cc;
#   2. runs switch_cuda_test: the kernels against the CPU executor bit for bit,
#      several ranks as streams in one process, NCCL over the devices present;
#   3. runs switch_cuda_bench: repack throughput against cudaMemcpy D2D for the
#      same bytes (target: >= 0.8x);
#   4. prints a summary (and writes it to $OUT/summary.txt when $OUT is set).
# Before: bash bench/device_prepare.sh here (copies nlohmann/json and
# GoogleTest into .device-deps/). Then, from the repository root:
#   run(command="bash bench/device_check.sh", carry=[".device-deps"], timeout_s=540)
# Exit status: 0 when the tests pass and the throughput target is met.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
B=${BUILD:-/tmp/ptcfs-device-build}
LOG=${OUT:-$B}
mkdir -p "$B/obj" "$LOG"
DEPS=$ROOT/.device-deps
JOBS=$(nproc)
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
CXX=${CXX:-g++}
ARCH=${CUDA_ARCH:-90}
say() { echo "== $*"; }

# NCCL: the system's, else the nvidia-nccl wheel's, with the header carried as a fallback.
PYNCCL=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)
NCCL_INC=""; NCCL_LIB=""
for d in /usr/include /usr/local/include "$CUDA_HOME/include" ${PYNCCL:+$PYNCCL/include} "$DEPS/include"; do
  [ -f "$d/nccl.h" ] && { NCCL_INC=$d; break; }
done
for d in /usr/lib/x86_64-linux-gnu /usr/local/lib "$CUDA_HOME/lib" "$CUDA_HOME/lib64" ${PYNCCL:+$PYNCCL/lib}; do
  ls "$d"/libnccl.so* >/dev/null 2>&1 && { NCCL_LIB=$d; break; }
done
if [ -z "$NCCL_INC" ] || [ -z "$NCCL_LIB" ]; then echo "device_check: NCCL not found (header: '$NCCL_INC', library: '$NCCL_LIB')"; exit 2; fi
[ -f "$NCCL_LIB/libnccl.so" ] || ln -sf "$(ls "$NCCL_LIB"/libnccl.so* | head -1)" "$B/libnccl.so"
[ -f "$DEPS/include/nlohmann/json.hpp" ] || { echo "device_check: run bench/device_prepare.sh first and carry .device-deps"; exit 2; }
say "nvcc $("$NVCC" --version | tail -1); $($CXX --version | head -1); NCCL $NCCL_LIB; $(nvidia-smi -L 2>/dev/null | head -1)"

DEFS=(-DPTCFS_WITH_CUDA=1 "-DPTCFS_BINARY=\"/bin/false\"" "-DPTCFS_SOURCE_DIR=\"$ROOT\"" "-DPTCFS_SWITCH_LIB=\"\"")
INC=(-I"$ROOT" -I"$ROOT/tests" -I"$DEPS/include" -I"$CUDA_HOME/include" -I"$NCCL_INC")
SRCS=(ptc/model/*.cc ptc/base/status.cc ptc/base/kv_text.cc ptc/base/json_fields.cc transform/plan.cc
      transform/device/strided_copy.cc transform/device/switch_plan.cc transform/device/cpu_executor.cc
      tests/switch_cuda_test.cc bench/switch_cuda.cc)
t0=$(date +%s)
# Flags in a response file: the string defines keep their quotes through xargs.
{
  for d in "${DEFS[@]}" "${INC[@]}"; do printf "'%s'\n" "$d"; done
} > "$B/flags.rsp"
say "building (${#SRCS[@]} C++ files, 2 CUDA files, $JOBS jobs)"
printf '%s\n' "${SRCS[@]}" | xargs -P "$JOBS" -I{} sh -c \
  'o='"$B"'/obj/$(echo {} | tr / _).o; '"$CXX"' -std=c++20 -O2 -w @'"$B"'/flags.rsp -c {} -o $o || echo FAILED {}' \
  > "$B/build.log" 2>&1
for cu in cuda_kernels cuda_executor; do
  "$NVCC" -std=c++20 -O2 -arch=sm_$ARCH -diag-suppress=2810 "${DEFS[@]}" "${INC[@]}" \
    -c transform/device/$cu.cu -o "$B/obj/$cu.o" >> "$B/build.log" 2>&1 || echo "FAILED $cu.cu" >> "$B/build.log"
done
if grep -q FAILED "$B/build.log"; then cat "$B/build.log"; echo "device_check: build failed"; exit 1; fi
LIBOBJ=$(ls "$B"/obj/*.o | grep -v -e tests_switch_cuda_test -e bench_switch_cuda)
LINK=(-L"$CUDA_HOME/lib64" -L"$CUDA_HOME/lib" -lcudart -L"$NCCL_LIB" -L"$B" -lnccl -Wl,-rpath,"$NCCL_LIB" -Wl,-rpath,"$CUDA_HOME/lib64" -lpthread)
$CXX -o "$B/switch_cuda_test" "$B/obj/tests_switch_cuda_test.cc.o" $LIBOBJ "$DEPS/lib/libgtest.a" "${LINK[@]}" &&
$CXX -o "$B/switch_cuda_bench" "$B/obj/bench_switch_cuda.cc.o" $LIBOBJ "${LINK[@]}" || { echo "device_check: link failed"; exit 1; }
say "built in $(( $(date +%s) - t0 )) s"

say "switch_cuda_test"
timeout 300 "$B/switch_cuda_test" 2>&1 | tee "$LOG/switch_cuda_test.log" | grep -E '^\[ *(OK|FAILED|PASSED|SKIPPED) |Failure|NCCL over|SKIPPED|differs' | head -40
test_rc=${PIPESTATUS[0]}
say "switch_cuda_bench"
timeout 200 "$B/switch_cuda_bench" --iters 20 2>&1 | tee "$LOG/switch_cuda_bench.log"
bench_rc=${PIPESTATUS[0]}

{
  echo "device_check summary ($(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
  echo "switch_cuda_test: exit $test_rc ($([ $test_rc = 0 ] && echo passed || { [ $test_rc = 77 ] && echo skipped || echo FAILED; }))"
  grep -E '^\[  PASSED|^\[  FAILED' "$LOG/switch_cuda_test.log" | head -5
  echo "switch_cuda_bench: exit $bench_rc"
  grep -E 'GB/s|->|PASS|FAIL' "$LOG/switch_cuda_bench.log"
} | tee "$LOG/summary.txt"
[ $test_rc = 0 ] && [ $bench_rc = 0 ]

#!/usr/bin/env bash
# Runs every libFuzzer target (tests/fuzz, clang, ASan+UBSan) for SECONDS each
# on its corpus (tests/fuzz/corpus/TARGET; new inputs found go to a scratch
# copy, not into the repository) and prints a table of executions per target.
# A crash stops the script with the target's report; the crashing input is
# written to build-fuzz/crashes/TARGET/ (keep it under tests/fuzz/corpus/TARGET
# as a regression input once fixed).
#   SECONDS_PER_TARGET=600 JOBS=2 bash bench/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${SECONDS_PER_TARGET:-60}"
jobs="${JOBS:-1}"
targets=(safetensors_fuzz torch_fuzz text_fuzz manifest_fuzz dataset_fuzz)
declare -A max_len=([safetensors_fuzz]=4096 [torch_fuzz]=4096 [text_fuzz]=4096 [manifest_fuzz]=32768
                    [dataset_fuzz]=4096)

cmake -S . -B build-fuzz -G Ninja -DPTCFS_FUZZ=ON -DPTCFS_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]}"

printf '| target | seconds | jobs | executions | exec/s | corpus | result |\n|---|---|---|---|---|---|---|\n' >build-fuzz/table.md
for t in "${targets[@]}"; do
  work="build-fuzz/work/$t" crashes="build-fuzz/crashes/$t"
  rm -rf "$work" && mkdir -p "$work" "$crashes"
  cp tests/fuzz/corpus/"$t"/* "$work"/
  log="build-fuzz/$t.log"
  status=clean
  # With JOBS > 1 libFuzzer runs that many processes; totals are their sum.
  parallel=()
  [ "$jobs" -gt 1 ] && parallel=(-jobs="$jobs" -workers="$jobs")
  if ! UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "build-fuzz/tests/fuzz/$t" "$work" \
      -max_total_time="$seconds" -max_len="${max_len[$t]}" "${parallel[@]}" \
      -artifact_prefix="$crashes/" -print_final_stats=1 >"$log" 2>&1; then
    status="CRASH (see $log)"
  fi
  [ "$jobs" -gt 1 ] && cat fuzz-*.log >>"$log" 2>/dev/null && rm -f fuzz-*.log
  execs=$(grep -h 'stat::number_of_executed_units' "$log" | awk '{s += $2} END {print s + 0}')
  corpus=$(ls "$work" | wc -l)
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$t" "$seconds" "$jobs" "$execs" \
    "$((execs / (seconds * jobs)))" "$corpus" "$status" | tee -a build-fuzz/table.md
  if [ "$status" != clean ]; then tail -40 "$log"; exit 1; fi
done
cat build-fuzz/table.md

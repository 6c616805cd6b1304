#!/usr/bin/env bash
# Runs the libFuzzer targets (tests/fuzz, clang, ASan+UBSan) for SECONDS each,
# appends each run to the ledger bench/fuzz_ledger.tsv (date = the run's end,
# commit, target, target_sha, seconds, jobs, max_len, executions, result:
# clean or crash) and prints, per target,
# the executions summed over every clean run of the target as it is defined
# now (rows are keyed by a hash of tests/fuzz/TARGET.cc; a changed target
# starts again from 0).
#   SECONDS_PER_TARGET=600 JOBS=2 bash bench/fuzz.sh
#   TARGETS="torch_fuzz text_fuzz" UNTIL_GOAL=1 bash bench/fuzz.sh  # skip targets at GOAL (10M)
#   bash bench/fuzz.sh totals                                       # only print the totals
# Each target starts from its corpus in tests/fuzz/corpus/TARGET plus what
# earlier runs found (build-fuzz/work/TARGET; not copied into the repository:
# merge interesting inputs by hand with -merge=1). A crash stops the script
# with the target's report; the input is written to build-fuzz/crashes/TARGET/
# (keep it under tests/fuzz/corpus/TARGET as regression-WHAT once fixed).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
seconds="${SECONDS_PER_TARGET:-60}"
jobs="${JOBS:-1}"
goal="${GOAL:-10000000}"
ledger=bench/fuzz_ledger.tsv
all=(safetensors_fuzz torch_fuzz dcp_fuzz mcore_common_fuzz dcp_optimizer_fuzz text_fuzz manifest_fuzz dataset_fuzz cluster_fuzz
     save_parts_fuzz megatron_names_fuzz hf_config_fuzz)
read -r -a targets <<<"${TARGETS:-${all[*]}}"
# The longest input libFuzzer makes; each covers its largest seed.
declare -A max_len=([safetensors_fuzz]=2048 [torch_fuzz]=4096 [dcp_fuzz]=65536 [mcore_common_fuzz]=4096 [dcp_optimizer_fuzz]=4096 [text_fuzz]=4096 [manifest_fuzz]=4096
                    [dataset_fuzz]=4096 [cluster_fuzz]=4096 [save_parts_fuzz]=4096 [megatron_names_fuzz]=4096 [hf_config_fuzz]=4096)

[ -f "$ledger" ] || printf 'date\tcommit\ttarget\ttarget_sha\tseconds\tjobs\tmax_len\texecutions\tresult\n' >"$ledger"
definition() { sha256sum "tests/fuzz/$1.cc" | cut -c1-12; }
total() {
  awk -F'\t' -v t="$1" -v d="$(definition "$1")" '$3 == t && $4 == d && $9 == "clean" {s += $8} END {print s + 0}' \
    "$ledger"
}
print_totals() {
  printf '| target | definition | clean runs | executions | goal |\n|---|---|---|---|---|\n'
  for t in "${all[@]}"; do
    runs=$(awk -F'\t' -v t="$t" -v d="$(definition "$t")" '$3 == t && $4 == d && $9 == "clean"' "$ledger" | wc -l)
    n=$(total "$t")
    printf '| %s | %s | %s | %s | %s |\n' "$t" "$(definition "$t")" "$runs" "$n" \
      "$([ "$n" -ge "$goal" ] && echo reached || echo "$((goal - n)) to go")"
  done
}
if [ "${1:-}" = totals ]; then print_totals; exit 0; fi

cmake -S . -B build-fuzz -G Ninja -DPTCFS_FUZZ=ON -DPTCFS_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]}"

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- ptc tests/fuzz 2>/dev/null || commit="$commit+dirty"
table=build-fuzz/table.md
printf '| target | seconds | jobs | executions | exec/s | corpus | result |\n|---|---|---|---|---|---|---|\n' >"$table"
for t in "${targets[@]}"; do
  if [ "${UNTIL_GOAL:-0}" = 1 ] && [ "$(total "$t")" -ge "$goal" ]; then
    echo "$t: $(total "$t") executions, at the goal; skipped"
    continue
  fi
  work="$root/build-fuzz/work/$t" crashes="$root/build-fuzz/crashes/$t" logs="$root/build-fuzz/logs/$t"
  mkdir -p "$work" "$crashes" "$logs"
  cp -n tests/fuzz/corpus/"$t"/* "$work"/
  # libFuzzer leaves every input it ever added in the directory (tens of
  # thousands after a few runs), and each run first executes them all: past
  # 3000 files, replace them by a covering set (-merge=1) before the run.
  if [ "$(ls "$work" | wc -l)" -gt 3000 ]; then
    rm -rf "$work.merged" && mkdir -p "$work.merged"
    if (cd "$logs" && "$root/build-fuzz/tests/fuzz/$t" -merge=1 -max_len="${max_len[$t]}" "$work.merged" "$work" \
        >"$logs/merge.log" 2>&1); then
      echo "$t: corpus $(ls "$work" | wc -l) -> $(ls "$work.merged" | wc -l) files"
      rm -rf "$work" && mv "$work.merged" "$work"
    fi
  fi
  rm -f "$logs"/fuzz-*.log
  log="$logs/run.log"
  status=clean
  # With JOBS > 1 libFuzzer runs that many processes, each logging to
  # fuzz-N.log in its working directory, and copies each log into its own
  # output when the process ends; the executions are their sum.
  parallel=()
  [ "$jobs" -gt 1 ] && parallel=(-jobs="$jobs" -workers="$jobs")
  before=$(ls "$crashes" | wc -l)
  if ! (cd "$logs" && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$root/build-fuzz/tests/fuzz/$t" "$work" \
      -max_total_time="$seconds" -max_len="${max_len[$t]}" -timeout=30 "${parallel[@]}" \
      -artifact_prefix="$crashes/" -print_final_stats=1 >"$log" 2>&1); then
    status=crash
  fi
  # libFuzzer keeps any unit that took over 10 s as slow-unit-*, also when the machine merely
  # stalled: replayed alone, one still slower than 1 s is a finding (kept, the run a crash);
  # the others are dropped, with their time.
  for unit in "$crashes"/slow-unit-*; do
    [ -e "$unit" ] || continue
    start=$(date +%s%N)
    "$root/build-fuzz/tests/fuzz/$t" "$unit" >/dev/null 2>&1 || true
    ms=$((($(date +%s%N) - start) / 1000000))
    if [ "$ms" -gt 1000 ]; then
      echo "$t: $(basename "$unit") takes $ms ms alone"
    else
      echo "$t: $(basename "$unit") takes $ms ms alone: the run stalled, not the input; dropped"
      rm -f "$unit"
    fi
  done
  [ "$(ls "$crashes" | wc -l)" -ne "$before" ] && status=crash
  rm -f "$logs"/fuzz-*.log
  execs=$(grep -h 'stat::number_of_executed_units' "$log" | awk '{s += $2} END {print s + 0}')
  corpus=$(ls "$work" | wc -l)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$commit" "$t" "$(definition "$t")" \
    "$seconds" "$jobs" "${max_len[$t]}" "$execs" "$status" >>"$ledger"
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$t" "$seconds" "$jobs" "$execs" \
    "$((execs / (seconds * jobs)))" "$corpus" "$status" | tee -a "$table"
  if [ "$status" != clean ]; then
    tail -60 "$log"
    exit 1
  fi
done
cat "$table"
echo
print_totals

#!/usr/bin/env bash
# Dataset-state benchmarks; writes their tables into bench/RESULTS.md between
# <!-- dataset:begin --> and <!-- dataset:end --> (nothing else in the file changes).
#
#   bench/dataset.sh [BUILD_DIR]        default BUILD_DIR: build
#
# 1. dataset_order_bench: order + partition over 10^9 samples, no index file
#    (ids/s, peak RSS; median of 5 runs).
# 2. `ptcfs data view`: ids/s of rendering ids.txt (PTCFS_BENCH_SAMPLES samples,
#    default 10^7, of 1-16 tokens), and MB/s of samples.bin against reading the
#    source .bin, for those short samples and for PTCFS_BENCH_LONG_SAMPLES
#    (default 10^5) samples of 512-4096 tokens. Median of 5 runs each.
# 3. The same files through a real mount (needs /dev/fuse and root): `cat` of
#    data/rank-00000/ids.txt and samples.bin on a fresh mount (first read) and
#    again (page cache), against `cat` of the source .bin; interleaved, after
#    `sync; sleep 8`, median of 5.
#
# Needs the bench target: add_subdirectory(bench) in the top-level CMakeLists.txt
# (or ORDER_BENCH=/path/to/dataset_order_bench in the environment).
# PTCFS_BENCH_ORDER_ARGS replaces the order benchmark's arguments (for a quick try).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
SAMPLES=${PTCFS_BENCH_SAMPLES:-10000000}
LONG_SAMPLES=${PTCFS_BENCH_LONG_SAMPLES:-100000}
ORDER_ARGS=${PTCFS_BENCH_ORDER_ARGS:---samples 1000000000 --global-batch 1024 --dp 8 --runs 5}
RESULTS=$ROOT/bench/RESULTS.md
CMDLINE="bench/dataset.sh $*"
for v in ORDER_BENCH PTCFS_BENCH_SAMPLES PTCFS_BENCH_LONG_SAMPLES PTCFS_BENCH_ORDER_ARGS; do
  [ -n "${!v:-}" ] && CMDLINE="$v='${!v}' $CMDLINE"
done

if [ -z "${ORDER_BENCH:-}" ]; then
  ninja -C "$BUILD" dataset_order_bench >/dev/null
  ORDER_BENCH=$BUILD/bench/dataset_order_bench
fi
ninja -C "$BUILD" ptcfs >/dev/null
PTCFS=$BUILD/tools/ptcfs
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

# Runs "$@" 5 times with stdout to /dev/null; prints the median seconds.
time5() {
  for _ in 1 2 3 4 5; do
    local t0; t0=$(now)
    "$@" >/dev/null
    awk -v a="$t0" -v b="$(now)" 'BEGIN {print b - a}'
  done | median
}

echo "order + partition: $ORDER_ARGS (10^9 samples: about 2 minutes)..." >&2
# shellcheck disable=SC2086
ORDER_TABLE=$("$ORDER_BENCH" $ORDER_ARGS)

echo "ptcfs data view on synthetic datasets..." >&2
# Short samples (1-16 tokens): many ids, the worst case for samples.bin (one pread per sample).
PTCFS_PROGRESS=0 "$PTCFS" data synth --samples "$SAMPLES" --min-len 1 --max-len 16 --vocab 32000 "$TMP/s" >/dev/null
"$PTCFS" data import --format megatron "$TMP/s" "$TMP/s-store" --global-batch 1024 --seed 1 >/dev/null
# Training-sized samples (512-4096 tokens).
PTCFS_PROGRESS=0 "$PTCFS" data synth --samples "$LONG_SAMPLES" --min-len 512 --max-len 4096 --vocab 32000 \
  "$TMP/l" >/dev/null
"$PTCFS" data import --format megatron "$TMP/l" "$TMP/l-store" --global-batch 256 --seed 1 >/dev/null

view() { "$PTCFS" data view --config "dp=$2" --rank 0 --file "$3" "$1"; }
T_IDS=$(time5 view "$TMP/s-store" 1 ids.txt)
T_SBIN=$(time5 view "$TMP/s-store" 8 samples.bin)
SBIN_BYTES=$(view "$TMP/s-store" 8 samples.bin | wc -c)
T_SSRC=$(time5 cat "$TMP/s.bin")
T_LBIN=$(time5 view "$TMP/l-store" 1 samples.bin)
T_LSRC=$(time5 cat "$TMP/l.bin")
S_BYTES=$(stat -c %s "$TMP/s.bin")
L_BYTES=$(stat -c %s "$TMP/l.bin")

row() {  # label samples-in-view bytes-in-view seconds source-bytes source-seconds
  awk -v l="$1" -v n="$2" -v b="$3" -v t="$4" -v sb="$5" -v st="$6" 'BEGIN {
    printf "| %s | %d | %.1f M samples/s, %.0f MB/s (%.2f s) | %.0f MB/s |\n", l, n, n / t / 1e6, b / t / 1e6, t, sb / st / 1e6 }'
}
IDS_LINES=$SAMPLES
IDS_BYTES=$(view "$TMP/s-store" 1 ids.txt | wc -c)
VIEW_TABLE=$(
  echo '| file (dataset) | samples in the file | `data view` rate (time) | source .bin via `cat` |'
  echo '|---|---|---|---|'
  row "ids.txt, dp=1 ($SAMPLES samples of 1-16 tokens)" "$IDS_LINES" "$IDS_BYTES" "$T_IDS" "$S_BYTES" "$T_SSRC"
  row "samples.bin, dp=8 rank 0 (same dataset)" $((SAMPLES / 8)) "$SBIN_BYTES" "$T_SBIN" "$S_BYTES" "$T_SSRC"
  row "samples.bin, dp=1 ($LONG_SAMPLES samples of 512-4096 tokens)" "$LONG_SAMPLES" "$L_BYTES" "$T_LBIN" \
    "$L_BYTES" "$T_LSRC"
)

echo "the same files through a mount..." >&2
# A tiny model: the mount serves a model store; the dataset is what is measured.
MODEL="--schema megatron-gpt --dims layers=2,hidden=32,heads=4,vocab=128,seq=16 --config tp=1,pp=1"
mount_store() {  # DATASET_PREFIX STORE
  "$PTCFS" synth $MODEL "$2-ck" >/dev/null
  "$PTCFS" import $MODEL "$2-ck" "$2" >/dev/null
  "$PTCFS" data import --format megatron "$1" "$2" --global-batch 1024 --seed 1 >/dev/null
}
mount_store "$TMP/s" "$TMP/ms"
mount_store "$TMP/l" "$TMP/ml"
MNT=$TMP/mnt
mkdir -p "$MNT"
trap 'fusermount3 -u "$MNT" 2>/dev/null || true; rm -rf "$TMP"' EXIT
timed() { local t0; t0=$(now); "$@" >/dev/null; awk -v a="$t0" -v b="$(now)" 'BEGIN {print b - a}'; }
declare -A M
for store in ms ml; do
  first=(); again=(); src=()
  file=ids.txt; [ "$store" = ml ] && file=samples.bin
  for _ in 1 2 3 4 5; do
    "$PTCFS" mount "$TMP/$store" "$MNT"
    sync; sleep 8
    first+=("$(timed cat "$MNT/data/rank-00000/$file")")
    again+=("$(timed cat "$MNT/data/rank-00000/$file")")
    fusermount3 -u "$MNT"
    sync; sleep 8
    src+=("$(timed cat "$TMP/${store#m}.bin")")
  done
  M[$store-first]=$(printf '%s\n' "${first[@]}" | median)
  M[$store-again]=$(printf '%s\n' "${again[@]}" | median)
  M[$store-src]=$(printf '%s\n' "${src[@]}" | median)
done
MIDS_BYTES=$IDS_BYTES
MOUNT_TABLE=$(
  echo '| file through the mount | first read | again (page cache) | source .bin via `cat` | first / source | again / source |'
  echo '|---|---|---|---|---|---|'
  awk -v n="$SAMPLES" -v b="$MIDS_BYTES" -v f="${M[ms-first]}" -v a="${M[ms-again]}" -v sb="$S_BYTES" -v s="${M[ms-src]}" 'BEGIN {
    printf "| ids.txt, dp=1 (%d ids) | %.1f M ids/s, %.0f MB/s | %.1f M ids/s, %.0f MB/s | %.0f MB/s | %.2f (bytes) | %.2f (bytes) |\n",
      n, n / f / 1e6, b / f / 1e6, n / a / 1e6, b / a / 1e6, sb / s / 1e6, (b / f) / (sb / s), (b / a) / (sb / s) }'
  awk -v b="$L_BYTES" -v f="${M[ml-first]}" -v a="${M[ml-again]}" -v s="${M[ml-src]}" 'BEGIN {
    printf "| samples.bin, dp=1 (%s samples of 512-4096 tokens) | %.0f MB/s | %.0f MB/s | %.0f MB/s | %.2f | %.2f |\n",
      "'"$LONG_SAMPLES"'", b / f / 1e6, b / a / 1e6, b / s / 1e6, (b / f) / (b / s), (b / a) / (b / s) }'
)

SECTION=$(cat <<EOF
<!-- dataset:begin -->
## Dataset order and views

Produced by \`$CMDLINE\` on $(date -u +%Y-%m-%d) ($(nproc) cores, $(uname -m)).

Order and partition functions (\`ptc/dataset/order.h\`), no index file; one core; median of 5 runs.
"stream" walks every dp rank's stream over the whole epoch; "random access" looks up random
positions of one rank's stream from the middle of the epoch. Peak RSS is the whole process.

$ORDER_TABLE

\`ptcfs data view\` writing a whole file to /dev/null (with dp=1 the file covers the epoch), median
of 5 runs; the time includes starting the process, opening the store and checking the dataset
fingerprint (hashing the .idx). samples.bin reads each sample with its own pread, in the permuted
order, page cache warm: short samples are its worst case.

$VIEW_TABLE

Through a real mount (\`ptcfs mount\`, files under \`data/rank-00000/\`): \`cat\` of the whole file on a
fresh mount ("first read": rendered by the daemon) and once more ("again": the kernel's page
cache), against \`cat\` of the source .bin (page cache warm); \`sync; sleep 8\` before each, median of
5. samples.bin is in permuted order, so its first read is one pread per sample from the source.

$MOUNT_TABLE
<!-- dataset:end -->
EOF
)

[ -f "$RESULTS" ] || printf '# Benchmark results\n' >"$RESULTS"
python3 - "$RESULTS" "$SECTION" <<'PY'
import re, sys
path, section = sys.argv[1], sys.argv[2]
text = open(path).read()
pattern = re.compile(r'<!-- dataset:begin -->.*?<!-- dataset:end -->', re.S)
text = pattern.sub(lambda _: section, text) if pattern.search(text) else text.rstrip('\n') + '\n\n' + section + '\n'
open(path, 'w').write(text)
PY
echo "wrote the dataset section of $RESULTS" >&2

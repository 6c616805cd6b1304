#!/usr/bin/env bash
# bench/readpath_floor.sh: the first read of every rank file through a fresh
# ptcfs mount, side by side with the floor it is measured against: a direct
# read of the shard files, and the same shard files read through libfuse's own
# passthrough examples (passthrough_ll: buffered, its defaults; passthrough_hp:
# splice), each through a fresh mount too.
#
# Stores (made once unless given): the GPT of bench/covering.sh imported at
# tp=2,pp=2, transformed (a covering, by reference) to tp=4,pp=1 = STORE_A,
# and a copy of it compacted = STORE_B.
#
# Methods (in each of REPS rounds every method runs once, the order rotating
# from round to round; shard files warm in the page cache and
# `sync; sleep SETTLE` before every timed read; one reader, READER):
#   a, b          ptcfs mount --format safetensors of STORE_A / STORE_B, every
#                 MNT/model/rank-*/*.safetensors read once (PTCFS)
#   a-old, b-old  the same with PTCFS_OLD (when given: a build to compare with)
#   direct        the .h5 files STORE_B's current generation references
#   ll, hp        those files through PASSTHROUGH_LL -o source=STORE_B /
#                 PASSTHROUGH_HP STORE_B (when given)
#   ll-ra         passthrough_ll with its mount's read_ahead_kb raised to 4096
#                 after the mount (what ptcfs does for itself)
#
# Build the passthrough examples from the libfuse release of the system's
# libfuse3 (pkg-config --modversion fuse3; example/ of its git tag):
#   gcc -O2 passthrough_ll.c $(pkg-config --cflags --libs fuse3) -o passthrough_ll
#   g++ -O2 -std=c++17 passthrough_hp.cc $(pkg-config --cflags --libs fuse3) -o passthrough_hp
#
# Environment: PTCFS (default build/tools/ptcfs), PTCFS_OLD, PASSTHROUGH_LL,
# PASSTHROUGH_HP, READER (default "python3 bench/mount_read.py 1", as
# bench/covering.sh; any command taking files and printing GB/s), REPS (3),
# SETTLE (2 s), WORK (/tmp/ptcfs-readpath-bench), STORE_A, STORE_B. Prints every
# run, then medians (GB/s; CPU seconds of the serving daemon and of the reader,
# which a shared machine's load disturbs less) and ratios of medians (with the
# range of per-round ratios).
# Needs root (read_ahead_kb), /dev/fuse and fusermount3.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PTCFS=${PTCFS:-$ROOT/build/tools/ptcfs}
PTCFS_OLD=${PTCFS_OLD:-}
PASSTHROUGH_LL=${PASSTHROUGH_LL:-}
PASSTHROUGH_HP=${PASSTHROUGH_HP:-}
READER=${READER:-python3 $ROOT/bench/mount_read.py 1}
REPS=${REPS:-3}
SETTLE=${SETTLE:-2}
WORK=${WORK:-/tmp/ptcfs-readpath-bench}
export PTCFS_PROGRESS=0
DIMS=layers=24,hidden=1024,heads=16,vocab=32768,seq=2048

die() { echo "readpath_floor.sh: $*" >&2; exit 1; }
[[ -x $PTCFS ]] || die "$PTCFS not found"
mkdir -p "$WORK/mnt"
MNT=$WORK/mnt
unmount() { if mountpoint -q "$MNT" 2> /dev/null; then fusermount3 -u "$MNT" || fusermount3 -uz "$MNT" || true; fi; }
trap unmount EXIT
unmount

if [[ -z ${STORE_A:-} || -z ${STORE_B:-} ]]; then
  STORE_A=$WORK/cov STORE_B=$WORK/cmp
  if [[ ! -f $STORE_B/manifest.json ]]; then
    rm -rf "$WORK/src" "$WORK/store" "$STORE_A" "$STORE_B"
    "$PTCFS" synth --schema megatron-gpt --dims $DIMS --config tp=2,pp=2 "$WORK/src" > /dev/null
    "$PTCFS" import --schema megatron-gpt --dims $DIMS --config tp=2,pp=2 "$WORK/src" "$WORK/store" > /dev/null
    rm -rf "$WORK/src"
    mv "$WORK/store" "$STORE_A"
    "$PTCFS" transform "$STORE_A" --to tp=4,pp=1 > /dev/null
    cp -r "$STORE_A" "$STORE_B"
    "$PTCFS" compact --keep-old "$STORE_B" > /dev/null
  fi
fi

shard_files() {  # STORE -> the .h5 files its current generation references, relative, one a line
  python3 - "$1" << 'EOF'
import json, os, sys
store = sys.argv[1]
g = json.load(open(os.path.join(store, "manifest.json")))["generation"]
m = json.load(open(os.path.join(store, f"gen-{g:06d}", "manifest.json")))
for f in sorted({s["file"] for s in m["shards"]}):
    print(f)
EOF
}
mapfile -t REL_A < <(shard_files "$STORE_A")
mapfile -t REL_B < <(shard_files "$STORE_B")

METHODS=(a b direct)
[[ -n $PTCFS_OLD ]] && METHODS+=(a-old b-old)
[[ -n $PASSTHROUGH_LL ]] && METHODS+=(ll ll-ra)
[[ -n $PASSTHROUGH_HP ]] && METHODS+=(hp)
LOG=$WORK/runs.tsv
: > "$LOG"

read_once() {  # METHOD ROUND
  local m=$1 store=$STORE_B rel=("${REL_B[@]}") files=() f
  case $m in a | a-old) store=$STORE_A rel=("${REL_A[@]}") ;; esac
  case $m in
    a | b) "$PTCFS" mount --wait --format safetensors "$store" "$MNT" ;;
    a-old | b-old) "$PTCFS_OLD" mount --wait --format safetensors "$store" "$MNT" ;;
    ll | ll-ra) "$PASSTHROUGH_LL" -o source="$store" "$MNT" ;;
    hp) "$PASSTHROUGH_HP" "$store" "$MNT" ;;
  esac
  case $m in
    direct) for f in "${rel[@]}"; do files+=("$store/$f"); done ;;
    ll | ll-ra | hp) for f in "${rel[@]}"; do files+=("$MNT/$f"); done ;;
    *) mapfile -t files < <(find "$MNT/model" -name '*.safetensors' | sort) ;;
  esac
  if [[ $m == ll-ra ]]; then
    stat "$MNT" > /dev/null  # INIT answered: the kernel no longer lowers read_ahead_kb
    echo 4096 > "/sys/class/bdi/$(mountpoint -d "$MNT")/read_ahead_kb"
  fi
  for f in "${rel[@]}"; do cat "$store/$f"; done > /dev/null
  sync
  sleep "$SETTLE"
  local gbps pid= t0=0 t1=0 reader_cpu daemon_cpu=0
  if [[ $m != direct ]]; then
    pid=$(pgrep -n -f -- "$MNT")
    t0=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  fi
  gbps=$(/usr/bin/time -f "%U %S" -o "$WORK/time.txt" $READER "${files[@]}") || { unmount; die "$m: the read failed"; }
  [[ -n $pid ]] && t1=$(awk '{print $14 + $15}' "/proc/$pid/stat")
  reader_cpu=$(awk '{print $1 + $2}' "$WORK/time.txt")
  daemon_cpu=$(awk -v a="$t0" -v b="$t1" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.2f", (b - a) / hz}')
  unmount
  printf '%s\t%s\t%s\t%s\t%s\n' "$m" "$2" "$gbps" "$daemon_cpu" "$reader_cpu" >> "$LOG"
  echo "round $2 $m: $gbps GB/s, CPU s daemon $daemon_cpu reader $reader_cpu" >&2
}
for ((r = 0; r < REPS; r++)); do
  for ((i = 0; i < ${#METHODS[@]}; i++)); do read_once "${METHODS[$(((i + r) % ${#METHODS[@]}))]}" "$r"; done
done

python3 - "$LOG" << 'EOF'
import collections, statistics, sys
runs = collections.defaultdict(dict)
cpu = collections.defaultdict(list)
for line in open(sys.argv[1]):
    m, r, g, d, c = line.split()
    runs[m][int(r)] = float(g)
    cpu[m].append((float(d), float(c)))
med = {m: statistics.median(v.values()) for m, v in runs.items()}
print("| read | GB/s (median) | runs | CPU s, daemon / reader (median) |\n|---|---|---|---|")
for m in runs:
    print(f"| {m} | {med[m]:.3f} | {', '.join(f'{runs[m][r]:.3f}' for r in sorted(runs[m]))} | "
          f"{statistics.median(d for d, _ in cpu[m]):.2f} / {statistics.median(c for _, c in cpu[m]):.2f} |")
print("\n| ratio (of GB/s) | value (paired range) |\n|---|---|")
for x, y in (("a", "b"), ("a", "direct"), ("b", "direct"), ("ll", "direct"), ("ll-ra", "direct"), ("hp", "direct"),
             ("a", "ll"), ("b", "ll"), ("a", "hp"), ("a", "a-old"), ("b", "b-old"), ("a-old", "direct"),
             ("b-old", "direct")):
    if x not in runs or y not in runs: continue
    p = [runs[x][r] / runs[y][r] for r in runs[x] if r in runs[y]]
    print(f"| ({x}) / ({y}) | **{med[x] / med[y]:.3f}** ({min(p):.3f}–{max(p):.3f}) |")
EOF

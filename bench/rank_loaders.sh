#!/usr/bin/env bash
# bench/rank_loaders.sh: 8 concurrent rank loaders (8 processes, each reading
# its own rank's model.safetensors whole with 1 MiB reads, bench/mount_read.py)
# through the mount, on the daemon path (--passthrough off) and the kernel
# path (FUSE passthrough of the rank files a compaction wrote), against the
# same readers on local copies (`ptcfs export`). Each round and method: a
# fresh mount (its page cache empty; the store's files and the local copies
# page-cache warm), `sync; sleep SETTLE`, the 8 readers, wall clock from the
# first start to the last end. Order rotating per round; medians of REPS
# rounds, the ratio of medians and the median (range) of per-round ratios.
# BEFORE=PATH: one more method, daemon-before: the daemon path of that ptcfs
# binary (a build before a change), in the same rounds. METHODS: the methods
# to run, of local daemon kernel daemon-before (local is the base, always needed).
# Environment: PTCFS (build/tools/ptcfs), BEFORE, REPS (5), WORK (/tmp/ptcfs-rank-loaders),
# DIMS, CONFIG (8 ranks on one worker), SETTLE (3). Prints the load average
# before and after. Needs root and /dev/fuse.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PTCFS=${PTCFS:-$ROOT/build/tools/ptcfs}
REPS=${REPS:-5}
WORK=$(realpath -m "${WORK:-/tmp/ptcfs-rank-loaders}")
DIMS=${DIMS:-layers=8,hidden=2048,heads=16,vocab=32000,seq=128}
CONFIG=${CONFIG:-tp=4,pp=2,dp=1,per_worker=8}
SETTLE=${SETTLE:-3}
MODEL=(--schema megatron-gpt --dims "$DIMS")
mkdir -p "$WORK"
unmount() { findmnt -rn -M "$1" > /dev/null 2>&1 || return 0; fusermount3 -u "$1" 2> /dev/null || fusermount3 -uz "$1" || true; }
cleanup() { unmount "$WORK/mnt"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP
cleanup
if [ ! -f "$WORK/store/manifest.json" ]; then
  rm -rf "$WORK/src" "$WORK/store" "$WORK/local"
  "$PTCFS" synth "${MODEL[@]}" --dtype bf16 --config "$CONFIG" "$WORK/src" > /dev/null
  "$PTCFS" import "${MODEL[@]}" --config "$CONFIG" "$WORK/src" "$WORK/store" > /dev/null
  rm -rf "$WORK/src"
  "$PTCFS" compact --rank-files "$WORK/store" > /dev/null
  "$PTCFS" export --config "$CONFIG" "$WORK/store" "$WORK/local" > /dev/null
fi
mapfile -t local_files < <(find "$WORK/local" -name model.safetensors | sort)
bytes=$(cat "${local_files[@]}" | wc -c)
[ ${#local_files[@]} -eq 8 ] || { echo "rank_loaders.sh: ${#local_files[@]} rank files, expected 8" >&2; exit 1; }
echo "model: $DIMS bf16, $CONFIG, 8 rank files, $bytes bytes"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
cat "${local_files[@]}" > /dev/null
find "$WORK/store" -type f -exec cat {} + > /dev/null

loaders() { python3 "$ROOT/bench/mount_read.py" 8 "$@"; }  # one process per file: rank r reads rank r's
results="$WORK/results.txt"; : > "$results"
BEFORE=${BEFORE:-}
read -r -a methods <<< "${METHODS:-local daemon kernel${BEFORE:+ daemon-before}}"
for round in $(seq 1 "$REPS"); do
  shift_by=$(( (round - 1) % ${#methods[@]} ))
  for method in "${methods[@]:shift_by}" "${methods[@]:0:shift_by}"; do
    if [ "$method" = local ]; then
      files=("${local_files[@]}")
    else
      mode=auto; [ "$method" = kernel ] || mode=off
      binary=$PTCFS; [ "$method" = daemon-before ] && binary=$BEFORE
      mkdir -p "$WORK/mnt"
      "$binary" mount --passthrough $mode "$WORK/store" "$WORK/mnt"
      mapfile -t files < <(ls "$WORK"/mnt/model/rank-*/model.safetensors)
    fi
    sync; sleep "$SETTLE"
    echo "$round $method $(loaders "${files[@]}")" >> "$results"
    if [ "$method" = kernel ]; then
      python3 -c "import json,sys; s=json.load(open(sys.argv[1]))['passthrough']; print(f'  kernel path: {s[\"kernel\"]} files by the kernel, {s[\"daemon\"]} by the daemon')" "$WORK/mnt/.ptcfs/status"
    fi
    [ "$method" = local ] || unmount "$WORK/mnt"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 "$ROOT/bench/ratio_table.py" "$results" local "${methods[@]}"

#!/usr/bin/env bash
# bench/megatron_open.sh: torch.load(mmap=True) of the Megatron tree's
# model_optim_rng.pt files on the daemon path (--passthrough off, no rank
# files: as right after a reconfigure), each round on a fresh mount so that
# the first open composes (or computes) the zip CRC-32s, against the same
# load of a local copy (`ptcfs export --format megatron`), page cache warm.
#
# Stores (synthetic GPT, DIMS, bf16, no optimizer), each mounted at CONFIG:
#   imported   imported at CONFIG (every storage a whole piece)
#   changed    imported at FROM, then `ptcfs transform --to CONFIG` (a
#              covering over the same pieces, what a reconfigure commits:
#              row slices and column slices of them)
# and for each a copy with the manifest's block CRC-32s removed ("old": every
# tensor byte read for the CRCs on the first open, as before they were recorded).
# Methods per round, order rotating: local, imported, imported-old, changed,
# changed-old; `sync; sleep SETTLE` before each. Medians of REPS rounds and
# the median of the per-round ratios to local.
# Environment: PTCFS (build/tools/ptcfs), PY (.venv/bin/python), REPS (5), WORK
# (/tmp/ptcfs-megatron-open), DIMS, CONFIG (tp=2,pp=1), FROM (tp=1,pp=1),
# SETTLE (3). Prints the load average before and after. Needs root and /dev/fuse.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PTCFS=${PTCFS:-$ROOT/build/tools/ptcfs}
PY=${PY:-$ROOT/.venv/bin/python}
REPS=${REPS:-5}
WORK=$(realpath -m "${WORK:-/tmp/ptcfs-megatron-open}")
DIMS=${DIMS:-layers=8,hidden=1024,heads=16,vocab=32000,seq=128}
CONFIG=${CONFIG:-tp=2,pp=1}
FROM=${FROM:-tp=1,pp=1}
SETTLE=${SETTLE:-3}
MODEL=(--schema megatron-gpt --dims "$DIMS")
mkdir -p "$WORK"
unmount() { findmnt -rn -M "$1" > /dev/null 2>&1 || return 0; fusermount3 -u "$1" 2> /dev/null || fusermount3 -uz "$1" || true; }
cleanup() { unmount "$WORK/mnt"; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP
cleanup

make_store() {  # NAME SYNTH_CONFIG [TRANSFORM_TO]
  [ -f "$WORK/$1/manifest.json" ] && return 0
  rm -rf "$WORK/src" "$WORK/$1" "$WORK/$1-old"
  "$PTCFS" synth "${MODEL[@]}" --dtype bf16 --config "$2" "$WORK/src" > /dev/null
  "$PTCFS" import "${MODEL[@]}" --config "$2" "$WORK/src" "$WORK/$1" > /dev/null
  rm -rf "$WORK/src"
  [ $# -lt 3 ] || "$PTCFS" transform "$WORK/$1" --to "$3" > /dev/null
  # The same store as a manifest without block CRC-32s: hard links, the manifests rewritten.
  cp -al "$WORK/$1" "$WORK/$1-old"
  rm -f "$WORK/$1-old/lock"  # a store's lock is never a hard link: the mount makes its own
  for m in "$WORK/$1-old"/gen-*/manifest.json; do
    python3 -c 'import json,sys; p=sys.argv[1]; m=json.load(open(p))
for s in m["shards"]: s.pop("crc32s", None)
open(p + ".new", "w").write(json.dumps(m, indent=2))' "$m"
    mv "$m.new" "$m"  # a new inode: the original's manifest stays as it was
  done
}
make_store imported "$CONFIG"
make_store changed "$FROM" "$CONFIG"
if [ ! -d "$WORK/local" ]; then
  "$PTCFS" export --format megatron --config "$CONFIG" "$WORK/imported" "$WORK/local" > /dev/null
fi
mapfile -t local_files < <(find "$WORK/local" -name model_optim_rng.pt | sort)
bytes=$(cat "${local_files[@]}" | wc -c)
echo "model: $DIMS bf16, $CONFIG (changed: from $FROM), ${#local_files[@]} files, $bytes bytes"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
cat "${local_files[@]}" > /dev/null
for s in imported imported-old changed changed-old; do find "$WORK/$s" -name '*.h5' -exec cat {} + > /dev/null; done

load() { "$PY" "$ROOT/bench/torch_load_mmap.py" "$@"; }
results="$WORK/results.txt"; : > "$results"
methods=(local imported imported-old changed changed-old)
for round in $(seq 1 "$REPS"); do
  shift_by=$(( (round - 1) % ${#methods[@]} ))
  for method in "${methods[@]:shift_by}" "${methods[@]:0:shift_by}"; do
    if [ "$method" = local ]; then
      sync; sleep "$SETTLE"
      echo "$round local $(load "${local_files[@]}")" >> "$results"
      continue
    fi
    mkdir -p "$WORK/mnt"
    "$PTCFS" mount --format megatron --passthrough off "$WORK/$method" "$WORK/mnt"
    mapfile -t files < <(ls "$WORK"/mnt/megatron/iter_*/mp_rank_*/model_optim_rng.pt)
    sync; sleep "$SETTLE"
    echo "$round $method $(load "${files[@]}")" >> "$results"
    unmount "$WORK/mnt"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 "$ROOT/bench/ratio_table.py" "$results" local local imported imported-old changed changed-old

#!/usr/bin/env bash
# bench/dcp_load.sh: torch.distributed.checkpoint.load of a model from a ptcfs
# mount's dcp/ (issue 28) against the same state from a DCP directory on local
# disk written by dcp.save, side by side, 1 process (plain tensors) and 2
# (DTensors sharded on dim 0). Per round and process count the two sides are
# interleaved, each after `sync` and SETTLE seconds, page cache warm (the store
# and the local directory were read before). Medians of REPS rounds; the
# ratio mount / local; the daemon's peak RSS (VmHWM).
#
# Store: a synthetic llama (DIMS, bf16 parameters, f32 Adam state) imported in
# CONFIG. Environment: PTCFS (build/tools/ptcfs), PY (.venv/bin/python), REPS (3),
# WORK (/tmp/ptcfs-dcp-bench), DIMS, CONFIG, SETTLE (8), NAMES (torch, or
# torchtitan: dcp/ in torchtitan's names, wq/wk heads woven on read; the local
# side is then dcp.save's of those keys), COLD (1: mount again before each
# mount-side load, so that every one reads through the daemon; else only the
# first does, later ones hit the kernel's cache of the mount's pages),
# RANK_FILES (1: the store compacted with --rank-files --rank-file-format dcp
# in NAMES first, so that the kernel reads dcp/'s chunk files itself, FUSE
# passthrough; 0: as imported, every read through the daemon), PASSTHROUGH
# (auto, or off: the mount serves every file itself). Needs root and
# /dev/fuse.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PTCFS=${PTCFS:-$ROOT/build/tools/ptcfs}
PY=${PY:-$ROOT/.venv/bin/python}
REPS=${REPS:-3}
WORK=${WORK:-/tmp/ptcfs-dcp-bench}
DIMS=${DIMS:-layers=8,hidden=1024,heads=16,kv_heads=8,vocab=32000,seq=128}
CONFIG=${CONFIG:-tp=2,pp=2}
SETTLE=${SETTLE:-8}
NAMES=${NAMES:-torch}
COLD=${COLD:-0}
RANK_FILES=${RANK_FILES:-0}
PASSTHROUGH=${PASSTHROUGH:-auto}
MODEL="--schema llama --dims $DIMS"
mkdir -p "$WORK"
mnt="$WORK/mnt"
cleanup() { mountpoint -q "$mnt" && "$PTCFS" umount "$mnt" || true; }
trap cleanup EXIT
if [ ! -f "$WORK/store/manifest.json" ]; then
  rm -rf "$WORK/src" "$WORK/store" "$WORK"/local-*
  "$PTCFS" synth $MODEL --dtype bf16 --optimizer adam --config "$CONFIG" "$WORK/src" >/dev/null
  "$PTCFS" import $MODEL --config "$CONFIG" "$WORK/src" "$WORK/store" >/dev/null
  rm -rf "$WORK/src"
fi
if [ "$RANK_FILES" = 1 ]; then  # nothing written when they are the current generation's already
  "$PTCFS" compact --rank-files --rank-file-format dcp --dcp-names "$NAMES" "$WORK/store"
fi
mkdir -p "$mnt"
mount_dcp() { "$PTCFS" mount --wait --format dcp --dcp-names "$NAMES" --passthrough "$PASSTHROUGH" "$WORK/store" "$mnt"; }
mount_dcp
local_dir="$WORK/local-$NAMES"
if [ ! -f "$local_dir/.metadata" ]; then
  "$PY" "$ROOT/bench/dcp_load.py" save "$mnt/dcp" "$local_dir" 2>/dev/null
fi
bytes=$(cat "$mnt/dcp/"__*.distcp | wc -c)
local_bytes=$(cat "$local_dir/"__*.distcp | wc -c)
find "$WORK/store" "$local_dir" -type f -exec cat {} + >/dev/null  # page cache warm, both sides
echo "model: $DIMS llama, bf16 + Adam (f32), stored in $CONFIG; dcp/ ($NAMES names) $bytes bytes, local $local_bytes bytes; cold=$COLD rank_files=$RANK_FILES"
python3 -c "import json,sys; print('passthrough:', json.dumps(json.load(open(sys.argv[1]))['passthrough']['files']))" "$mnt/.ptcfs/status"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
results="$WORK/results.txt"; : > "$results"
for round in $(seq 1 "$REPS"); do
  for procs in 1 2; do
    for side in mount local; do
      dir="$mnt/dcp"; [ "$side" = local ] && dir="$local_dir"
      if [ "$side" = mount ] && [ "$COLD" = 1 ]; then "$PTCFS" umount "$mnt" && mount_dcp; fi
      sync; sleep "$SETTLE"
      read -r seconds got < <("$PY" "$ROOT/bench/dcp_load.py" time "$dir" "$procs" 2>/dev/null)
      echo "$procs $side $seconds $got" >> "$results"
      echo "round $round, $procs process(es), $side: $seconds s, $got bytes"
    done
  done
done
pid=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pid'])" "$mnt/.ptcfs/status")
hwm=$(awk '/VmHWM/ {print $2 " " $3}' "/proc/$pid/status")
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$results" "$hwm" <<'PYEOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
print("| processes | local dcp.save dir: s (GB/s) | mount dcp/: s (GB/s) | mount / local |")
print("|---|---|---|---|")
for procs in ("1", "2"):
    t = {side: statistics.median(float(r[2]) for r in rows if r[0] == procs and r[1] == side) for side in ("local", "mount")}
    b = next(int(r[3]) for r in rows if r[0] == procs)
    print(f"| {procs} | {t['local']:.2f} ({b / t['local'] / 1e9:.2f}) | {t['mount']:.2f} ({b / t['mount'] / 1e9:.2f}) | {t['local'] / t['mount']:.2f}x |")
print(f"daemon peak RSS: {sys.argv[2]}")
PYEOF

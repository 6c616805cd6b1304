#!/usr/bin/env bash
# bench/hf_export.sh: a job's model to Hugging Face (issue 29): `ptcfs export
# --format hf STORE OUT` against the conversion a user runs today,
# bench/hf_convert.py (torch: load every rank file, assemble each global tensor,
# cut HF's tensors, write HF's shards with safetensors), side by side: wall
# time and peak RSS (GNU time's %M), each writing OUT on the same disk and
# `sync`ed inside the timing. Per round the two sides are interleaved, each after
# `sync` and SETTLE seconds, page cache warm (the store and the rank files were
# read before). Medians of REPS rounds. The two outputs are checked to hold the
# same tensors, bit for bit (tests/clients/hf_clients.py same).
#
# Model: a synthetic llama (DIMS, bf16) saved in CONFIG as rank files (the
# converter's input) and imported into a store in CONFIG (ptcfs's input).
# Environment: PTCFS (build/tools/ptcfs), PY (.venv/bin/python), REPS (3),
# WORK (/tmp/ptcfs-hf-bench), DIMS, CONFIG (tp=2,pp=2), SHARD (2GB), SETTLE (5).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PTCFS=${PTCFS:-$ROOT/build/tools/ptcfs}
PY=${PY:-$ROOT/.venv/bin/python}
REPS=${REPS:-3}
WORK=${WORK:-/tmp/ptcfs-hf-bench}
DIMS=${DIMS:-layers=10,hidden=2048,heads=16,kv_heads=8,vocab=32000,seq=2048,ffn=5632}
CONFIG=${CONFIG:-tp=2,pp=2}
SHARD=${SHARD:-2GB}
SETTLE=${SETTLE:-5}
MODEL="--schema llama --dims $DIMS"
tp=$(sed -n 's/.*tp=\([0-9]*\).*/\1/p' <<<"$CONFIG"); tp=${tp:-1}
pp=$(sed -n 's/.*pp=\([0-9]*\).*/\1/p' <<<"$CONFIG"); pp=${pp:-1}
mkdir -p "$WORK"
if [ ! -f "$WORK/store/manifest.json" ]; then
  rm -rf "$WORK/src" "$WORK/store"
  "$PTCFS" synth $MODEL --dtype bf16 --config "$CONFIG" "$WORK/src" >/dev/null
  "$PTCFS" import $MODEL --config "$CONFIG" "$WORK/src" "$WORK/store" >/dev/null
fi
bytes=$(du -sb "$WORK/src" | cut -f1)
echo "model: llama $DIMS, bf16, $CONFIG rank files $bytes bytes; shards of at most $SHARD"
find "$WORK/store" "$WORK/src" -type f -exec cat {} + >/dev/null  # page cache warm
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
results="$WORK/results.txt"; : > "$results"
for round in $(seq 1 "$REPS"); do
  for side in ptcfs torch; do
    out="$WORK/out-$side"
    rm -rf "$out"; sync; sleep "$SETTLE"
    if [ "$side" = ptcfs ]; then
      cmd=("$PTCFS" export --format hf --shard-size "$SHARD" "$WORK/store" "$out")
    else
      cmd=("$PY" "$ROOT/bench/hf_convert.py" --dims "$DIMS" --tp "$tp" --pp "$pp" --shard-size "$SHARD" "$WORK/src" "$out")
    fi
    read -r seconds kib < <(PTCFS_PROGRESS=0 /usr/bin/time -f "%e %M" sh -c '"$@" >/dev/null && sync' sh "${cmd[@]}" 2>&1 | tail -1)
    echo "$side $seconds $kib" >> "$results"
    echo "round $round, $side: $seconds s, peak RSS $((kib / 1024)) MiB"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" "$ROOT/tests/clients/hf_clients.py" same "$WORK/out-ptcfs" "$WORK/out-torch" 2>/dev/null | tail -1
python3 - "$results" "$bytes" <<'PYEOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
b = int(sys.argv[2])
t = {s: statistics.median(float(r[1]) for r in rows if r[0] == s) for s in ("ptcfs", "torch")}
m = {s: max(int(r[2]) for r in rows if r[0] == s) / 1024 for s in ("ptcfs", "torch")}
print("| | wall s (GB/s) | peak RSS MiB |")
print("|---|---|---|")
print(f"| torch script (bench/hf_convert.py) | {t['torch']:.2f} ({b / t['torch'] / 1e9:.2f}) | {m['torch']:.0f} |")
print(f"| `ptcfs export --format hf` | {t['ptcfs']:.2f} ({b / t['ptcfs'] / 1e9:.2f}) | {m['ptcfs']:.0f} |")
print(f"| ptcfs / torch | {t['ptcfs'] / t['torch']:.2f}x | {m['ptcfs'] / m['torch']:.2f}x |")
PYEOF

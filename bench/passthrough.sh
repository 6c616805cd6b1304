#!/usr/bin/env bash
# bench/passthrough.sh: reads through the mount with FUSE passthrough (the
# kernel reads the rank files itself, issue 30) vs the daemon path
# (--passthrough off) vs a direct read of the very same bytes (the rank files
# on disk), page cache warm. Per round, for each method: a fresh mount, the
# first read of every rank file, then a re-read (same mount); and a
# safetensors safe_open + every tensor through its mmap (torch) of the mount's files
# vs the local files. Medians of REPS rounds, ratios to direct / local.
#
# Store: a synthetic GPT (DIMS, bf16, no optimizer) at CONFIG, imported and
# compacted with --rank-files (--rank-file-copies COPIES: with several ranks
# per worker, the files of ranks sharing a piece hold copies of it). Reader: bench/mount_read.py 1 (1 MiB reads into
# one reused buffer). Optional: PASSTHROUGH_HP (libfuse's example, built from
# the system libfuse's release) as one more method, reading the rank files.
# Environment: PTCFS (build/tools/ptcfs), PY (.venv/bin/python), REPS (5),
# WORK (/tmp/ptcfs-passthrough-bench), DIMS, CONFIG, COPIES (stored), SETTLE (8:
# seconds after a sync before each timed method). Prints the load average
# before and after.
# Needs root and /dev/fuse.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PTCFS=${PTCFS:-$ROOT/build/tools/ptcfs}
PY=${PY:-$ROOT/.venv/bin/python}
REPS=${REPS:-5}
WORK=${WORK:-/tmp/ptcfs-passthrough-bench}
DIMS=${DIMS:-layers=8,hidden=1024,heads=16,vocab=32000,seq=128}
CONFIG=${CONFIG:-tp=2,pp=1,dp=1,per_worker=1}
COPIES=${COPIES:-stored}
SETTLE=${SETTLE:-8}
mkdir -p "$WORK"
if [ ! -f "$WORK/store/manifest.json" ]; then
  rm -rf "$WORK/src" "$WORK/store"
  "$PTCFS" synth --schema megatron-gpt --dims "$DIMS" --dtype bf16 --config "$CONFIG" "$WORK/src" >/dev/null
  "$PTCFS" import --schema megatron-gpt --dims "$DIMS" --config "$CONFIG" "$WORK/src" "$WORK/store" >/dev/null
  "$PTCFS" compact --rank-files --rank-file-copies "$COPIES" "$WORK/store" >/dev/null
fi
mapfile -t direct < <(find "$WORK/store" -name 'rank-*.safetensors' | sort)
bytes=$(cat "${direct[@]}" | wc -c)
echo "store: $WORK/store, ${#direct[@]} rank files, $bytes bytes, $DIMS, $CONFIG, copies $COPIES"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
cat "${direct[@]}" >/dev/null  # page cache warm

cat > "$WORK/st_mmap.py" <<'PYEOF'
import sys, time
from safetensors import safe_open
start = time.perf_counter(); n = 0
for path in sys.argv[1:]:
    with safe_open(path, framework="pt") as f:  # mmap; get_tensor copies each tensor out of it
        for k in f.keys():
            t = f.get_tensor(k)
            n += t.numel() * t.element_size()
print(f"{n / (time.perf_counter() - start) / 1e9:.3f}")
PYEOF

read_gbs() { python3 "$ROOT/bench/mount_read.py" 1 "$@"; }
results="$WORK/results.txt"; : > "$results"
for round in $(seq 1 "$REPS"); do
  for method in kernel daemon direct hp; do
    case $method in
      direct)
        sync; sleep "$SETTLE"
        echo "$round direct first $(read_gbs "${direct[@]}")" >> "$results"
        echo "$round direct reread $(read_gbs "${direct[@]}")" >> "$results"
        echo "$round direct st_mmap $("$PY" "$WORK/st_mmap.py" "${direct[@]}")" >> "$results"
        continue ;;
      hp)
        [ -n "${PASSTHROUGH_HP:-}" ] || continue
        mkdir -p "$WORK/mnt-hp"; "$PASSTHROUGH_HP" "$WORK/store" "$WORK/mnt-hp" & sleep 1
        files=("${direct[@]/#$WORK\/store/$WORK/mnt-hp}") ;;
      *)
        mode=auto; [ $method = daemon ] && mode=off
        mkdir -p "$WORK/mnt-$method"
        "$PTCFS" mount --format safetensors --passthrough $mode "$WORK/store" "$WORK/mnt-$method"
        mapfile -t files < <(ls "$WORK/mnt-$method"/model/rank-*/*.safetensors) ;;
    esac
    sync; sleep "$SETTLE"
    echo "$round $method first $(read_gbs "${files[@]}")" >> "$results"
    echo "$round $method reread $(read_gbs "${files[@]}")" >> "$results"
    echo "$round $method st_mmap $("$PY" "$WORK/st_mmap.py" "${files[@]}")" >> "$results"
    if [ $method = kernel ]; then
      python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print('  passthrough:', s['passthrough']['state'], s['passthrough']['kernel'], 'files by the kernel,', s['passthrough']['daemon'], 'by the daemon')" "$WORK/mnt-$method/.ptcfs/status"
    fi
    fusermount3 -u "$WORK/mnt-$method" 2>/dev/null || fusermount3 -u "$WORK/mnt-hp"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$results" <<'PYEOF'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
med = {}
for m in sorted({r[1] for r in rows}):
    for k in ("first", "reread", "st_mmap"):
        v = [float(r[3]) for r in rows if r[1] == m and r[2] == k]
        if v: med[m, k] = (statistics.median(v), min(v), max(v))
print(f"{'method':8} {'first GB/s':>12} {'x direct':>9} {'re-read GB/s':>13} {'x direct':>9} {'safe_open+mmap GB/s':>20} {'x local':>8}")
for m in ("direct", "kernel", "daemon", "hp"):
    if (m, "first") not in med: continue
    f, r, s = med[m, "first"][0], med[m, "reread"][0], med[m, "st_mmap"][0]
    print(f"{m:8} {f:12.2f} {f / med['direct', 'first'][0]:9.2f} {r:13.2f} {r / med['direct', 'reread'][0]:9.2f} "
          f"{s:20.2f} {s / med['direct', 'st_mmap'][0]:8.2f}")
PYEOF

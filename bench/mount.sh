#!/usr/bin/env bash
# Mount benchmark (issue 4): read throughput through the mount vs reading the
# backing shard files directly, reconfigure-to-first-byte latency, and the
# background rewrite vs an offline `ptcfs transform`. Medians of RUNS runs;
# ratios measured side by side in one run. Writes its section of bench/RESULTS.md.
#   bash bench/mount.sh            (needs root and /dev/fuse; ~1.3 GB of disk per store copy)
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-5}"
ptcfs="${PTCFS:-$PWD/build/tools/ptcfs}"  # PTCFS=...: another binary
work="${PTCFS_BENCH_DIR:-/tmp/ptcfs-bench-mount}"
dims=layers=24,hidden=1024,heads=16,vocab=32768,seq=2048
mnt="$work/mnt"
trap 'fusermount3 -u "$mnt" 2>/dev/null || true' EXIT
mkdir -p "$work" "$mnt"
if [ ! -f "$work/store/manifest.json" ]; then
  rm -rf "$work/src" "$work/store"
  PTCFS_PROGRESS=0 $ptcfs synth --schema megatron-gpt --dims $dims --config tp=2,pp=2 "$work/src"
  PTCFS_PROGRESS=0 $ptcfs import --schema megatron-gpt --dims $dims --config tp=2,pp=2 "$work/src" "$work/store" >/dev/null
  rm -rf "$work/src"
fi
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a/b}'; }
shards=$(find "$work/store" -name '*.h5' | sort)
bytes=$(du -sb --apparent-size "$work/store" | cut -f1)
cat $shards > /dev/null  # page cache warm for the direct side

declare -A direct first again
for readers in 1 2; do
  d=(); f=(); a=()
  for run in $(seq "$RUNS"); do
    sync; sleep 8
    d+=("$(/usr/bin/python3 bench/mount_read.py "$readers" $shards)")
    $ptcfs mount "$work/store" "$mnt"
    files=$(find "$mnt/model" -name '*.safetensors' | sort)
    sync; sleep 8
    f+=("$(/usr/bin/python3 bench/mount_read.py "$readers" $files)")
    a+=("$(/usr/bin/python3 bench/mount_read.py "$readers" $files)")
    fusermount3 -u "$mnt"
  done
  direct[$readers]=$(printf '%s\n' "${d[@]}" | median)
  first[$readers]=$(printf '%s\n' "${f[@]}" | median)
  again[$readers]=$(printf '%s\n' "${a[@]}" | median)
done

# Reconfigure to first byte, and the background rewrite vs offline transform.
lat=(); bg=(); off=()
for run in $(seq "$RUNS"); do
  rm -rf "$work/copy" "$work/copy2"
  cp -r "$work/store" "$work/copy"
  cp -r "$work/store" "$work/copy2"
  $ptcfs mount "$work/copy" "$mnt"
  cat "$mnt/.ptcfs/status" > /dev/null
  sync; sleep 8
  start=$(date +%s.%N)
  lat+=("$(/usr/bin/python3 bench/reconfigure_latency.py "$mnt" tp=4,pp=1 model/rank-00003/model.safetensors)")
  while ! grep -q '"serving"' "$mnt/.ptcfs/status"; do sleep 0.05; done
  bg+=("$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {print e-s}')")
  fusermount3 -u "$mnt"
  sync; sleep 8
  start=$(date +%s.%N)
  # Without --keep-old: the daemon's commit removes the replaced generation too.
  PTCFS_PROGRESS=0 $ptcfs transform "$work/copy2" --to tp=4,pp=1 > /dev/null
  off+=("$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {print e-s}')")
done
rm -rf "$work/copy" "$work/copy2"
latency=$(printf '%s\n' "${lat[@]}" | median)
background=$(printf '%s\n' "${bg[@]}" | median)
offline=$(printf '%s\n' "${off[@]}" | median)

table=$(cat <<TABLE
<!-- mount:begin -->
## Mount (issue 4)

\`bash bench/mount.sh\` (RUNS=$RUNS) on $(date -u +%F), $(nproc) cores, $(free -g | awk '/Mem/ {print $2}') GiB;
GPT layers=24 hidden=1024 heads=16 vocab=32768 seq=2048 fp32 at tp=2,pp=2: $bytes bytes of store.
Reads of 1 MiB; "direct" reads the store's shard files with their page cache warm; "first" is
the first pass through a fresh mount, "again" the second pass on the same mount. Medians.

| readers | direct GB/s | first GB/s | first / direct (goal ≥ 0.5) | again GB/s | again / direct (goal ≥ 0.75) |
|---|---|---|---|---|---|
| 1 | ${direct[1]} | ${first[1]} | $(ratio "${first[1]}" "${direct[1]}") | ${again[1]} | $(ratio "${again[1]}" "${direct[1]}") |
| 2 | ${direct[2]} | ${first[2]} | $(ratio "${first[2]}" "${direct[2]}") | ${again[2]} | $(ratio "${again[2]}" "${direct[2]}") |

| measure | median |
|---|---|
| reconfigure tp=2,pp=2 → tp=4,pp=1: write of .ptcfs/config to first byte of a new-layout file (goal ≤ 50 ms) | ${latency} ms |
| same reconfigure: until status says serving (the rewrite committed; removing the old generation follows) | ${background} s |
| offline \`ptcfs transform --to tp=4,pp=1\` of the same store (removing the old generation included) | ${offline} s |
| background / offline | $(ratio "$background" "$offline") |
<!-- mount:end -->
TABLE
)
echo "$table"
results=bench/RESULTS.md
[ -f "$results" ] || printf '# Benchmark results\n\nEach section is written by the script it names.\n' > "$results"
/usr/bin/python3 - "$results" "$table" <<'PY'
import re, sys
path, table = sys.argv[1], sys.argv[2]
text = open(path).read()
pattern = re.compile(r"<!-- mount:begin -->.*?<!-- mount:end -->", re.S)
text = pattern.sub(lambda m: table, text) if pattern.search(text) else text.rstrip() + "\n\n" + table + "\n"
open(path, "w").write(text)
PY

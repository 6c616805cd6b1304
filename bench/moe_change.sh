#!/usr/bin/env bash
# An expert-parallel change of a mixture-of-experts store under a live mount
# (issue 40): ep=8 -> ep=4 on one worker, against copying the store
# (`cp -r && sync`: what rewriting the checkpoint costs at the least), and the
# first read of every rank file through the mount before and after it.
#
#   bash bench/moe_change.sh        (root and /dev/fuse; ~2 GB of store, ~4 GB of disk)
#
# The model: llama, 4 MoE layers of 8 experts (moe_ffn 1408), hidden 1024,
# vocab 8192, bf16 with Adam (f32 state): 2.4 GB stored; 8 ranks (tp=1, dp=8, one expert per rank at
# ep=8, two at ep=4; the dense part replicated). Each round: a fresh copy
# of the store, `sync; sleep 8`, then in turn (the order alternating): the
# change (from writing .ptcfs/config until the status says serving the new
# generation: committed, the daemon's own fsyncs included) and
# `cp -r STORE COPY && sync`. Then the first read of all of
# model/ through a fresh mount of the changed store (daemon path, page cache
# dropped) against the same read of the store before the change. Medians of
# RUNS rounds; writes its section of bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-3}"
ptcfs="${PTCFS:-$PWD/build/tools/ptcfs}"
work="${PTCFS_BENCH_DIR:-/tmp/ptcfs-bench-moe}"
dims=layers=4,hidden=1024,heads=16,vocab=8192,seq=1024,experts=8,moe_ffn=1408
from=tp=1,pp=1,dp=8,ep=8,per_worker=8
to=tp=1,pp=1,dp=8,ep=4,per_worker=8
mnt="$work/mnt"
trap 'fusermount3 -u "$mnt" 2>/dev/null || true' EXIT
mkdir -p "$work" "$mnt"
if [ ! -f "$work/store/manifest.json" ]; then
  rm -rf "$work/src" "$work/store"
  PTCFS_PROGRESS=0 $ptcfs synth --schema llama --dims $dims --config $from --optimizer adam --dtype bf16 "$work/src"
  PTCFS_PROGRESS=0 $ptcfs import --schema llama --dims $dims --config $from "$work/src" "$work/store" >/dev/null
  rm -rf "$work/src"
fi
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
now() { date +%s.%N; }
since() { awk -v s="$1" -v e="$(now)" 'BEGIN {printf "%.3f", e-s}'; }
bytes=$(du -sb --apparent-size "$work/store" | cut -f1)
plan=$($ptcfs plan "$work/store" --to $to --json)
field() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$plan" "$1"; }

serving() {  # MNT CONFIG: whether the mount serves CONFIG, its change done
  /usr/bin/python3 -c "import json,sys; s=json.load(open(sys.argv[1])); \
sys.exit(0 if s['state'] == 'serving' and s['config'].startswith(sys.argv[2]) else 1)" "$1/.ptcfs/status" "$2"
}

change() {  # MNT CONFIG -> seconds from writing CONFIG to .ptcfs/config until the mount serves it, committed
  /usr/bin/python3 - "$1" "$2" <<'PY'
import json, os, sys, time
mnt, config = sys.argv[1:3]
start = time.perf_counter()
with open(os.path.join(mnt, ".ptcfs/config"), "w") as f:
    f.write(config + "\n")
while True:
    with open(os.path.join(mnt, ".ptcfs/status")) as f:
        s = json.load(f)
    if s["state"] == "serving" and s["config"].startswith(config):
        break
    time.sleep(0.002)
print("%.3f" % (time.perf_counter() - start))
PY
}

read_model() {  # MNT -> GB/s of the first read of every file of model/, page cache dropped
  sync; echo 3 > /proc/sys/vm/drop_caches
  /usr/bin/python3 bench/mount_read.py 1 $(find "$1/model" -type f | sort)
}

change=(); copy=(); cached=(); before=(); after=()
for run in $(seq "$RUNS"); do
  rm -rf "$work/copy" "$work/changed"
  cp -r "$work/store" "$work/changed"
  sync; sleep 8
  for side in $( [ $((run % 2)) = 1 ] && echo "change copy" || echo "copy change"); do
    if [ "$side" = change ]; then
      $ptcfs mount "$work/changed" "$mnt" --passthrough off
      change+=("$(change "$mnt" $to)")
      fusermount3 -u "$mnt"
    else
      start=$(now)
      cp -r "$work/store" "$work/copy" && sync
      copy+=("$(since "$start")")
      rm -rf "$work/copy"
    fi
    sync; sleep 8
  done
  # The first read of every rank file before (the store) and after the change.
  $ptcfs mount "$work/store" "$mnt" --passthrough off
  before+=("$(read_model "$mnt")")
  fusermount3 -u "$mnt"
  $ptcfs mount "$work/changed" "$mnt" --passthrough off
  serving "$mnt" $to
  after+=("$(read_model "$mnt")")
  # The change back, with every file's pages in the kernel's cache from that read.
  sync; sleep 8
  cached+=("$(change "$mnt" $from)")
  fusermount3 -u "$mnt"
done
rm -rf "$work/copy" "$work/changed"
c=$(printf '%s\n' "${change[@]}" | median)
k=$(printf '%s\n' "${cached[@]}" | median)
p=$(printf '%s\n' "${copy[@]}" | median)
b=$(printf '%s\n' "${before[@]}" | median)
a=$(printf '%s\n' "${after[@]}" | median)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", a/b}'; }

table=$(cat <<TABLE
<!-- moe_change:begin -->
## An expert-parallel change of a MoE store (issue 40)

\`bash bench/moe_change.sh\` (RUNS=$RUNS) on $(date -u +%F) at $(git rev-parse --short HEAD), $(nproc) cores,
load average $(cut -d' ' -f1 /proc/loadavg) at the end (other builds shared the machine). llama \`$dims\`,
bf16 with Adam: $bytes bytes of store. \`$from\` -> \`$to\` under a live mount (one worker): the plan
moves $(field bytes_moved) bytes between workers: it keeps $(field bytes_kept) of $(field bytes_total)
bytes as they are stored (each expert's pieces, now another rank's) and copies $(field bytes_local).
Each round: the change (writing .ptcfs/config until the status serves the new config, committed:
the manifest written and synced by the daemon) and \`cp -r STORE COPY && sync\` of the same store, in alternating order after
\`sync; sleep 8\`, each on a fresh mount; the first read of all of model/ (daemon path, page cache
dropped) through a mount of the store before the change and of the changed one; then, on that
mount, the change back (ep=4 -> ep=8) with the 2.4 GB of the files it read in the kernel's page
cache: the write of .ptcfs/config returns once the kernel has dropped the replaced files (the
daemon's entry invalidations evict their inodes, \`truncate_inode_pages\` of every cached page:
perf of the daemon), which costs time in proportion to what is cached. Medians.

| measure | median | rounds |
|---|---|---|
| the change (s) | $c | ${change[*]} |
| \`cp -r && sync\` of the store (s) | $p | ${copy[*]} |
| change / copy (goal ≤ 0.05) | **$(ratio "$c" "$p")** | |
| the change back, every rank file read through the mount just before (s) | $k | ${cached[*]} |
| that / copy | $(ratio "$k" "$p") | |
| first read before the change (GB/s) | $b | ${before[*]} |
| first read after the change (GB/s) | $a | ${after[*]} |
| after / before (goal ≥ 1, within noise) | **$(ratio "$a" "$b")** | |
<!-- moe_change:end -->
TABLE
)
echo "$table"
/usr/bin/python3 - bench/RESULTS.md "$table" <<'PY'
import re, sys
path, table = sys.argv[1], sys.argv[2]
text = open(path).read()
pattern = re.compile(r"<!-- moe_change:begin -->.*?<!-- moe_change:end -->", re.S)
text = pattern.sub(lambda m: table, text) if pattern.search(text) else text.rstrip() + "\n\n" + table + "\n"
open(path, "w").write(text)
PY

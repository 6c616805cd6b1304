#!/usr/bin/env bash
# Under load (issue 12): READERS threads loop over every rank file of a mount
# while RECONFIGURES reconfigurations run back to back (each waits for the
# previous rewrite to commit and serve). Checks that no read is torn (each
# file read whole equals that path in the export of one of the configs), that
# the daemon's memory stays bounded (VmHWM), and that at the end the store
# holds only the current generation. Writes its section of bench/RESULTS.md.
#   bash bench/load.sh        (root and /dev/fuse)
set -euo pipefail
cd "$(dirname "$0")/.."
ptcfs="${PTCFS:-$PWD/build/tools/ptcfs}"
readers="${READERS:-16}"
reconfigures="${RECONFIGURES:-20}"
work="${PTCFS_BENCH_DIR:-/tmp/ptcfs-bench-load}"
dims=layers=4,hidden=256,heads=8,vocab=8192,seq=256
configs=(tp=4,pp=1 tp=1,pp=4 tp=2,pp=2,dp=2 tp=2,pp=1 tp=2,pp=2)
mnt="$work/mnt"
export PTCFS_PROGRESS=0
cleanup() { fusermount3 -u "$mnt" 2>/dev/null || true; }
trap cleanup EXIT
rm -rf "$work" && mkdir -p "$work" "$mnt"
$ptcfs synth --schema megatron-gpt --dims $dims --config tp=2,pp=2 --optimizer adam "$work/src"
$ptcfs import --schema megatron-gpt --dims $dims --config tp=2,pp=2 "$work/src" "$work/store" >/dev/null
rm -rf "$work/src"

# The expected bytes: every config's export, hashed per path.
for c in "${configs[@]}"; do
  $ptcfs export --config "$c" "$work/store" "$work/export/$c" >/dev/null
done
/usr/bin/python3 - "$work/export" "$work/expected.json" <<'PY'
import hashlib, json, os, sys
root, out = sys.argv[1], sys.argv[2]
expected = {}
for config in os.listdir(root):
    base = os.path.join(root, config)
    for d, _, names in os.walk(base):
        for n in names:
            p = os.path.join(d, n)
            with open(p, "rb") as f:
                h = hashlib.blake2b(f.read(), digest_size=16).hexdigest()
            expected.setdefault(os.path.join("model", os.path.relpath(p, base)), []).append(h)
json.dump(expected, open(out, "w"))
PY
rm -rf "$work/export"
store_bytes=$(du -sb --apparent-size "$work/store" | cut -f1)

$ptcfs mount "$work/store" "$mnt"
pid=$(pgrep -n -f "ptcfs mount $work/store") || { echo "no daemon" >&2; exit 1; }
rss() { awk '/VmRSS/ {print $2}' "/proc/$pid/status"; }
rss_start=$(rss)
/usr/bin/python3 bench/load_readers.py "$mnt" "$work/expected.json" "$work/stop" "$readers" >"$work/readers.json" &
readers_pid=$!
sleep 2
start=$(date +%s.%N)
rss_max=$rss_start
for i in $(seq "$reconfigures"); do
  c=${configs[$(( (i - 1) % ${#configs[@]} ))]}
  until $ptcfs reconfigure "$mnt" --to "$c" >/dev/null 2>"$work/reconfigure.err"; do
    grep -q "still running" "$work/reconfigure.err" || { cat "$work/reconfigure.err" >&2; exit 1; }
    sleep 0.1
  done
  until grep -q '"serving"' "$mnt/.ptcfs/status"; do sleep 0.05; done
  r=$(rss); [ "$r" -gt "$rss_max" ] && rss_max=$r
done
elapsed=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e-s}')
touch "$work/stop"
wait "$readers_pid"
sleep 1
gens_open=$(ls "$work/store"/gen-*/manifest.json | wc -l)
hwm=$(awk '/VmHWM/ {print $2}' "/proc/$pid/status")
fusermount3 -u "$mnt"
sleep 1
gens_after=$(ls "$work/store"/gen-*/manifest.json | wc -l)
result=$(cat "$work/readers.json")
echo "readers: $result"
torn=$(/usr/bin/python3 -c "import json,sys; print(json.loads(sys.argv[1])['torn'])" "$result")
read -r reads bytes vanished errors < <(/usr/bin/python3 -c \
  "import json,sys; r=json.loads(sys.argv[1]); print(r['reads'], r['bytes'], r['vanished'], r['errors'])" "$result")
echo "reconfigures=$reconfigures in ${elapsed}s; reads=$reads torn=$torn vanished=$vanished errors=$errors"
echo "daemon RSS start=${rss_start} KiB max=${rss_max} KiB VmHWM=${hwm} KiB; generation manifests on disk: $gens_open at the end, $gens_after after unmount"

table=$(cat <<TABLE
<!-- load:begin -->
## Under load (issue 12)

\`bash bench/load.sh\` (READERS=$readers RECONFIGURES=$reconfigures) on $(date -u +%F), $(nproc) cores;
GPT $dims with Adam, $store_bytes bytes of store, configs cycling ${configs[*]}.

| reconfigures | seconds | whole-file reads | GB read | torn reads | vanished (listed, then switched away) | read errors | daemon RSS start / max / VmHWM (MiB) | generation manifests on disk at end / after unmount (older directories keep only the shard files the current one references) |
|---|---|---|---|---|---|---|---|---|
| $reconfigures | $elapsed | $reads | $(awk -v b="$bytes" 'BEGIN {printf "%.1f", b/1e9}') | $torn | $vanished | $errors | $((rss_start / 1024)) / $((rss_max / 1024)) / $((hwm / 1024)) | $gens_open / $gens_after |
<!-- load:end -->
TABLE
)
/usr/bin/python3 - "$table" <<'PY'
import re, sys
path, table = "bench/RESULTS.md", sys.argv[1]
text = open(path).read()
if "<!-- load:begin -->" in text:
    text = re.sub(r"<!-- load:begin -->.*?<!-- load:end -->", lambda m: table, text, flags=re.S)
else:
    text = text.rstrip("\n") + "\n\n" + table + "\n"
open(path, "w").write(text)
PY
[ "$torn" -eq 0 ] && [ "$errors" -eq 0 ]

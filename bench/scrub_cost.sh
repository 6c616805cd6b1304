#!/usr/bin/env bash
# bench/scrub_cost.sh: what the background scrub (fs/scrub.h, issue 41 item 10) costs a reader.
# A store compacted into rank files is mounted twice per round: with the scrub off
# (--scrub-rate 0) and with it reading all the time (--scrub-interval 1, --scrub-rate RATE
# MiB/s: a pass, one second's pause, the next); each time every rank file is read through the
# mount (the kernel reads it: passthrough) with 1 MiB reads into one reused buffer
# (bench/mount_read.py 1), first read and re-read, page cache warm (the scrub reads the same
# files). The direct read of the rank files on disk is the floor. Methods in a rotating order,
# medians of REPS rounds; writes its table into bench/RESULTS.md between
# <!-- scrub_cost:begin --> and <!-- scrub_cost:end -->.
# Environment: PTCFS (build/tools/ptcfs), PY (.venv/bin/python), REPS (5), RATE (256),
# WORK (/tmp/ptcfs-scrub-bench), DIMS, CONFIG. Needs root and /dev/fuse.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PTCFS=${PTCFS:-$ROOT/build/tools/ptcfs}
PY=${PY:-$ROOT/.venv/bin/python}
REPS=${REPS:-5}
RATE=${RATE:-256}
WORK=$(realpath -m "${WORK:-/tmp/ptcfs-scrub-bench}")
DIMS=${DIMS:-layers=8,hidden=1024,heads=16,vocab=32000,seq=128}
CONFIG=${CONFIG:-tp=2,pp=1,dp=1,per_worker=1}
CMDLINE="bench/scrub_cost.sh"
for v in REPS RATE DIMS CONFIG; do [ -n "${!v+x}" ] && [ "${!v}" != "" ] && CMDLINE="$v=${!v} $CMDLINE"; done
mkdir -p "$WORK"
MNT="$WORK/mnt"
cleanup() { findmnt -rn -M "$MNT" > /dev/null 2>&1 && { "$PTCFS" umount "$MNT" || fusermount3 -uz "$MNT"; }; true; }
trap cleanup EXIT

if [ ! -f "$WORK/store/manifest.json" ]; then
  rm -rf "$WORK/src" "$WORK/store"
  "$PTCFS" synth --schema megatron-gpt --dims "$DIMS" --dtype bf16 --optimizer adam --config "$CONFIG" "$WORK/src" > /dev/null
  "$PTCFS" import --schema megatron-gpt --dims "$DIMS" --config "$CONFIG" "$WORK/src" "$WORK/store" > /dev/null
  "$PTCFS" compact --rank-files "$WORK/store" > /dev/null
  rm -rf "$WORK/src"
fi
mapfile -t DISK < <(find "$WORK/store" -name 'rank-*.safetensors' | sort)
BYTES=$(cat "${DISK[@]}" | wc -c)

read_twice() {  # FILES...: "first re-read" GB/s
  echo "$("$PY" "$ROOT/bench/mount_read.py" 1 "$@") $("$PY" "$ROOT/bench/mount_read.py" 1 "$@")"
}
mounted() {  # OPTIONS: mount, wait for the scrub's first pass when on, read, unmount
  mkdir -p "$MNT"
  "$PTCFS" mount "$WORK/store" "$MNT" $1 > /dev/null
  if [ "$1" != "--scrub-rate 0" ]; then
    for _ in $(seq 600); do
      grep -q '"passes": [1-9]' "$MNT/.ptcfs/status" && break
      sleep 0.1
    done
  fi
  mapfile -t FILES < <(cd "$MNT" && find model -name '*.safetensors' | sort | sed "s|^|$MNT/|")
  local out
  out=$(read_twice "${FILES[@]}")
  local kernel
  kernel=$(grep -o '"kernel": [0-9]*' "$MNT/.ptcfs/status" | head -1 | grep -o '[0-9]*$')
  "$PTCFS" umount "$MNT"
  [ "$kernel" -gt 0 ] || { echo "scrub_cost.sh: no file through the kernel (passthrough off?)" >&2; exit 1; }
  echo "$out"
}

declare -A FIRST REREAD
methods=(direct off on)
LOAD0=$(cut -d' ' -f1 /proc/loadavg)
for r in $(seq "$REPS"); do
  for i in 0 1 2; do
    m=${methods[$(((i + r) % 3))]}
    case $m in
      direct) res=$(read_twice "${DISK[@]}") ;;
      off) res=$(mounted "--scrub-rate 0") ;;
      on) res=$(mounted "--scrub-interval 1 --scrub-rate $RATE") ;;
    esac
    FIRST[$m]+="${res% *} "
    REREAD[$m]+="${res#* } "
    echo "round $r $m: $res GB/s" >&2
  done
done
LOAD1=$(cut -d' ' -f1 /proc/loadavg)
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
row() {  # NAME METHOD
  local f r
  f=$(echo "${FIRST[$2]}" | median)
  r=$(echo "${REREAD[$2]}" | median)
  awk -v n="$1" -v f="$f" -v r="$r" -v df="$(echo "${FIRST[direct]}" | median)" \
    -v dr="$(echo "${REREAD[direct]}" | median)" \
    'BEGIN {printf "| %s | %.2f GB/s (%.2fx) | %.2f GB/s (%.2fx) |\n", n, f, f / df, r, r / dr}'
}
TABLE=$(
  echo "| read of every rank file | first read (vs direct) | re-read (vs direct) |"
  echo "|---|---|---|"
  row "direct, the files on disk" direct
  row "through the mount, scrub off (--scrub-rate 0)" off
  row "through the mount, scrub reading all the time (--scrub-interval 1 --scrub-rate $RATE)" on
)
SECTION=$(cat <<MD
## The scrub's cost to a reader (issue 41)

Produced by \`$CMDLINE\` on $(date -u +%Y-%m-%d) ($(nproc) cores, $(uname -m), load average $LOAD0
before, $LOAD1 after). Store: \`$DIMS\` bf16 with Adam at \`$CONFIG\`, compacted into rank files
($(awk -v b="$BYTES" 'BEGIN {printf "%.2f GB", b / 1e9}') in ${#DISK[@]} files), every file read by the
kernel (passthrough). One reader, 1 MiB reads into one reused buffer (\`bench/mount_read.py 1\`),
page cache warm; medians of $REPS rounds, methods in a rotating order, a fresh mount per method.
With the scrub on, the mount's scrub reads and checks every stored block at up to $RATE MiB/s,
pauses one second after each pass, and reads again, for the whole of the measurement.

$TABLE
MD
)
python3 - "$ROOT/bench/RESULTS.md" "$SECTION" <<'PY'
import sys
sys.path.insert(0, sys.argv[1].rsplit("/", 1)[0])
from results_section import write_section
print(write_section(sys.argv[1], "scrub_cost", sys.argv[2]))
PY

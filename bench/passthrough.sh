#!/usr/bin/env bash
# bench/passthrough.sh: reads through the mount with FUSE passthrough (the
# kernel reads the rank files itself, issue 30) vs the daemon path
# (--passthrough off) vs a direct read of the very same bytes (the rank files
# on disk), page cache warm. Per round, for each method (in an order that rotates each round): a fresh mount, the
# first read of every rank file, then a re-read (same mount); and a
# safetensors safe_open + every tensor through its mmap (torch) of the mount's files
# vs the local files. Medians of REPS rounds, ratios to direct / local.
#
# Store: a synthetic GPT (DIMS, bf16, no optimizer) at CONFIG, imported and
# compacted with --rank-files (--rank-file-copies COPIES: with several ranks
# per worker, the files of ranks sharing a piece hold copies of it). Reader: bench/mount_read.py 1 (1 MiB reads into
# one reused buffer).
#
# FORMAT=megatron: the rank files are the Megatron tree's model_optim_rng.pt
# (--rank-file-format megatron, mounts with --format megatron), and the third
# column is torch.load(mmap=True) of every file with every tensor copied out
# of its mapping into one reused buffer, vs the same of the local files.
#
# One more method, "hp": libfuse's example/passthrough_hp.cc (splice, its
# defaults; the release of the system's libfuse3, which Debian does not ship
# built), mounted over the directory holding the store's rank files, read
# through it: the same bytes as direct, through a fresh mount per round as the
# others. By default bench/build_passthrough_hp.sh builds it (once, cached in
# build/passthrough_hp/); when that fails, why is printed and the row left out.
# PASSTHROUGH_HP=PATH: that binary instead; PASSTHROUGH_HP=off: no row;
# PASSTHROUGH_HP_OPTS: its options (e.g. --nosplice).
# Environment: PTCFS (build/tools/ptcfs), PY (.venv/bin/python), REPS (5),
# WORK (/tmp/ptcfs-passthrough-bench), DIMS, CONFIG, COPIES (stored), SETTLE (8:
# seconds after a sync before each timed method), PASSTHROUGH_HP,
# PASSTHROUGH_HP_OPTS. Prints the load average before and after. Every mount
# is unmounted on exit, failures included.
# Needs root and /dev/fuse.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PTCFS=${PTCFS:-$ROOT/build/tools/ptcfs}
PY=${PY:-$ROOT/.venv/bin/python}
REPS=${REPS:-5}
WORK=${WORK:-/tmp/ptcfs-passthrough-bench}
WORK=$(realpath -m "$WORK")  # absolute: passthrough_hp (fuse_daemonize: chdir /) mounts a relative path under /
DIMS=${DIMS:-layers=8,hidden=1024,heads=16,vocab=32000,seq=128}
CONFIG=${CONFIG:-tp=2,pp=1,dp=1,per_worker=1}
COPIES=${COPIES:-stored}
FORMAT=${FORMAT:-safetensors}
SETTLE=${SETTLE:-8}
PASSTHROUGH_HP=${PASSTHROUGH_HP:-}
PASSTHROUGH_HP_OPTS=${PASSTHROUGH_HP_OPTS:-}
die() { echo "passthrough.sh: $*" >&2; exit 1; }
mkdir -p "$WORK"

hp_pid=
is_mounted() { findmnt -rn -M "$1" > /dev/null 2>&1; }  # also a FUSE mount whose daemon died
unmount() {  # MNT
  is_mounted "$1" || return 0
  fusermount3 -u "$1" 2> /dev/null || fusermount3 -uz "$1" || true
}
hp_stop() {  # unmount passthrough_hp and wait for its process (it exits on the unmount)
  unmount "$WORK/mnt-hp"
  [ -n "$hp_pid" ] || return 0
  for _ in $(seq 50); do kill -0 "$hp_pid" 2> /dev/null || break; sleep 0.1; done
  kill "$hp_pid" 2> /dev/null || true
  wait "$hp_pid" 2> /dev/null || true
  hp_pid=
}
cleanup() { unmount "$WORK/mnt-kernel"; unmount "$WORK/mnt-daemon"; hp_stop; }
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM HUP
cleanup  # mounts a killed run left
if [ ! -f "$WORK/store/manifest.json" ]; then
  rm -rf "$WORK/src" "$WORK/store"
  "$PTCFS" synth --schema megatron-gpt --dims "$DIMS" --dtype bf16 --config "$CONFIG" "$WORK/src" >/dev/null
  "$PTCFS" import --schema megatron-gpt --dims "$DIMS" --config "$CONFIG" "$WORK/src" "$WORK/store" >/dev/null
  "$PTCFS" compact --rank-files --rank-file-copies "$COPIES" --rank-file-format "$FORMAT" "$WORK/store" >/dev/null
fi
case $FORMAT in
  safetensors) pattern='rank-*.safetensors'; mounted='model/rank-*/*.safetensors'; third=st_mmap.py ;;
  megatron) pattern='rank-*.model_optim_rng.pt'; mounted='megatron/iter_*/mp_rank_*/model_optim_rng.pt'; third=tl_mmap ;;
  *) die "FORMAT=$FORMAT: expected safetensors or megatron" ;;
esac
mapfile -t direct < <(find "$WORK/store" -name "$pattern" | sort)
bytes=$(cat "${direct[@]}" | wc -c)
echo "store: $WORK/store, ${#direct[@]} rank files ($FORMAT), $bytes bytes, $DIMS, $CONFIG, copies $COPIES"
[ ${#direct[@]} -gt 0 ] || die "no rank files in $WORK/store"

# passthrough_hp: the binary, its row's label, and the directory it serves (the
# deepest one holding every rank file)
hp_label=
if [ "$PASSTHROUGH_HP" = off ]; then
  PASSTHROUGH_HP=
elif [ -z "$PASSTHROUGH_HP" ]; then
  if ! PASSTHROUGH_HP=$(bash "$ROOT/bench/build_passthrough_hp.sh"); then
    echo "passthrough_hp: no row (bench/build_passthrough_hp.sh failed, above)" >&2
    PASSTHROUGH_HP=
  fi
else
  [ -x "$PASSTHROUGH_HP" ] || die "PASSTHROUGH_HP=$PASSTHROUGH_HP is not an executable"
  PASSTHROUGH_HP=$(realpath "$PASSTHROUGH_HP")
fi
if [ -n "$PASSTHROUGH_HP" ]; then
  hp_version=$(cat "$(dirname "$PASSTHROUGH_HP")/VERSION" 2> /dev/null || true)
  hp_mode=splice; [[ " $PASSTHROUGH_HP_OPTS " == *" --nosplice "* ]] && hp_mode="no splice"
  hp_label="libfuse passthrough_hp (${hp_version:+$hp_version }example, $hp_mode)"
  hp_src=$(dirname "${direct[0]}")
  for f in "${direct[@]}"; do
    while [[ $hp_src != / && $f != "$hp_src"/* ]]; do hp_src=$(dirname "$hp_src"); done
  done
  echo "passthrough_hp: $PASSTHROUGH_HP ${PASSTHROUGH_HP_OPTS:+$PASSTHROUGH_HP_OPTS }over $hp_src"
fi
hp_mount() {  # passthrough_hp over $hp_src at $WORK/mnt-hp, in the foreground of a background job: returns once it serves
  mkdir -p "$WORK/mnt-hp"
  # shellcheck disable=SC2086
  "$PASSTHROUGH_HP" --foreground $PASSTHROUGH_HP_OPTS "$hp_src" "$WORK/mnt-hp" > "$WORK/hp.log" 2>&1 &
  hp_pid=$!
  for _ in $(seq 100); do
    is_mounted "$WORK/mnt-hp" && return 0
    kill -0 "$hp_pid" 2> /dev/null || break
    sleep 0.1
  done
  cat "$WORK/hp.log" >&2
  die "passthrough_hp did not mount $hp_src at $WORK/mnt-hp (log: $WORK/hp.log)"
}
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
third() {  # the third column's GB/s of the files given
  if [ "$third" = tl_mmap ]; then "$PY" "$ROOT/bench/torch_load_mmap.py" "$@"; else "$PY" "$WORK/$third" "$@"; fi
}
results="$WORK/results.txt"; : > "$results"
methods=(kernel daemon direct hp)
for round in $(seq 1 "$REPS"); do
  # The order rotates each round: no method always follows the same one.
  shift_by=$(( (round - 1) % ${#methods[@]} ))
  order=("${methods[@]:shift_by}" "${methods[@]:0:shift_by}")
  for method in "${order[@]}"; do
    case $method in
      direct)
        sync; sleep "$SETTLE"
        echo "$round direct first $(read_gbs "${direct[@]}")" >> "$results"
        echo "$round direct reread $(read_gbs "${direct[@]}")" >> "$results"
        echo "$round direct st_mmap $(third "${direct[@]}")" >> "$results"
        continue ;;
      hp)
        [ -n "$PASSTHROUGH_HP" ] || continue
        hp_mount
        files=()
        for f in "${direct[@]}"; do files+=("$WORK/mnt-hp/${f#"$hp_src"/}"); done ;;
      *)
        mode=auto; [ $method = daemon ] && mode=off
        mkdir -p "$WORK/mnt-$method"
        "$PTCFS" mount --format "$FORMAT" --passthrough $mode "$WORK/store" "$WORK/mnt-$method"
        # shellcheck disable=SC2086
        mapfile -t files < <(ls "$WORK/mnt-$method"/$mounted) ;;
    esac
    sync; sleep "$SETTLE"
    echo "$round $method first $(read_gbs "${files[@]}")" >> "$results"
    echo "$round $method reread $(read_gbs "${files[@]}")" >> "$results"
    echo "$round $method st_mmap $(third "${files[@]}")" >> "$results"
    if [ $method = kernel ]; then
      python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print('  passthrough:', s['passthrough']['state'], s['passthrough']['kernel'], 'files by the kernel,', s['passthrough']['daemon'], 'by the daemon')" "$WORK/mnt-$method/.ptcfs/status"
    fi
    if [ $method = hp ]; then hp_stop; else unmount "$WORK/mnt-$method"; fi
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$results" "$hp_label" "$FORMAT" <<'PYEOF'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1])]
label = {"hp": sys.argv[2]}
third = "safe_open+mmap GB/s" if sys.argv[3] == "safetensors" else "torch.load(mmap) GB/s"
med = {}
for m in sorted({r[1] for r in rows}):
    for k in ("first", "reread", "st_mmap"):
        v = [float(r[3]) for r in rows if r[1] == m and r[2] == k]
        if v: med[m, k] = (statistics.median(v), min(v), max(v))
w = max([8] + [len(label.get(m, m)) for m in {r[1] for r in rows}])
print(f"{'method':{w}} {'first GB/s':>12} {'x direct':>9} {'re-read GB/s':>13} {'x direct':>9} {third:>21} {'x local':>8}")
for m in ("direct", "kernel", "daemon", "hp"):
    if (m, "first") not in med: continue
    f, r, s = med[m, "first"][0], med[m, "reread"][0], med[m, "st_mmap"][0]
    print(f"{label.get(m, m):{w}} {f:12.2f} {f / med['direct', 'first'][0]:9.2f} {r:13.2f} {r / med['direct', 'reread'][0]:9.2f} "
          f"{s:21.2f} {s / med['direct', 'st_mmap'][0]:8.2f}")
PYEOF

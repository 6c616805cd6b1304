#!/usr/bin/env bash
# bench/before_after.sh: the read, save and repartition paths of two ptcfs
# binaries side by side (a refactor must not slow them: issue 39), in one run,
# rounds interleaved (the order of the two rotates each round), `sync; sleep
# SETTLE` before every timed step. Per round and binary, on a fresh copy of one
# store (a synthetic megatron-gpt, bf16 with Adam, tp=2,pp=2):
#   repartition  ptcfs transform COPY --to tp=4,pp=1 --keep-old (one worker: a covering)
#   read         a fresh mount (--format all --passthrough off: the daemon path), the
#                first read of every file of model/, megatron/ and dcp/ (bench/mount_read.py 1)
#   save         torch.save of every megatron/ rank file into megatron/iter_N+1/ and the
#                latest file's close (the commit), Debian's python3-torch
# Prints every run, then medians and the ratio new / old of each (time: lower is better).
#   OLD=path/to/old/ptcfs [NEW=build/tools/ptcfs] [ROUNDS=3] [DIMS=...] bash bench/before_after.sh
# Root and /dev/fuse. WORK (default /tmp/ptcfs-before-after) is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
old="${OLD:?OLD=path to the baseline ptcfs binary}"
new="${NEW:-$PWD/build/tools/ptcfs}"
rounds="${ROUNDS:-3}"
settle="${SETTLE:-8}"
dims="${DIMS:-layers=8,hidden=1024,heads=16,vocab=32768,seq=1024}"
work="${WORK:-/tmp/ptcfs-before-after}"
mnt="$work/mnt"
export PTCFS_PROGRESS=0
cleanup() {
  fusermount3 -u "$mnt" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
rm -rf "$work"
mkdir -p "$work" "$mnt"
"$new" synth --schema megatron-gpt --dims "$dims" --config tp=2,pp=2 --dtype bf16 --optimizer adam "$work/saved" >/dev/null
"$new" import --schema megatron-gpt --dims "$dims" --config tp=2,pp=2 "$work/saved" "$work/store" >/dev/null
echo "model megatron-gpt $dims bf16 + Adam, tp=2,pp=2: $(du -sh "$work/store" | cut -f1) stored; $rounds rounds"

now() { date +%s.%N; }
results="$work/results.tsv"
: >"$results"
record() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$results"; }  # which step value

one_round() {  # one_round NAME BINARY
  local name="$1" bin="$2" copy="$work/copy" t0 t1
  rm -rf "$copy"
  cp -r "$work/store" "$copy"
  sync
  sleep "$settle"
  t0=$(now)
  "$bin" transform "$copy" --to tp=4,pp=1 --keep-old >/dev/null
  t1=$(now)
  record "$name" repartition_s "$(echo "$t1 - $t0" | bc)"
  rm -rf "$copy"
  cp -r "$work/store" "$copy"
  "$bin" mount --format all --passthrough off "$copy" "$mnt"
  mapfile -t files < <(find "$mnt/model" "$mnt/megatron" "$mnt/dcp" -type f \( -name '*.safetensors' -o -name '*.pt' -o -name '*.distcp' \))
  sync
  sleep "$settle"
  local line
  line=$(/usr/bin/python3 bench/mount_read.py 1 "${files[@]}")
  record "$name" read_gbps "$line"
  sync
  sleep "$settle"
  t0=$(now)
  /usr/bin/python3 - "$mnt/megatron" <<'PY'
import os, sys, torch
root = sys.argv[1]
it = int(open(os.path.join(root, "latest_checkpointed_iteration.txt")).read())
src = os.path.join(root, f"iter_{it:07d}")
dst = os.path.join(root, f"iter_{it + 1:07d}")
os.mkdir(dst)
for rank in sorted(os.listdir(src)):
    sd = torch.load(os.path.join(src, rank, "model_optim_rng.pt"), weights_only=False)
    sd["iteration"] = it + 1
    if "args" in sd and hasattr(sd["args"], "iteration"):
        sd["args"].iteration = it + 1
    os.mkdir(os.path.join(dst, rank))
    torch.save(sd, os.path.join(dst, rank, "model_optim_rng.pt"))
with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
    f.write(str(it + 1))
PY
  t1=$(now)
  record "$name" save_s "$(echo "$t1 - $t0" | bc)"
  "$bin" umount "$mnt"
  rm -rf "$copy"
}

for ((r = 0; r < rounds; r++)); do
  if ((r % 2 == 0)); then
    one_round old "$old"
    one_round new "$new"
  else
    one_round new "$new"
    one_round old "$old"
  fi
  echo "round $r done"
done
echo "runs (binary, step, value):"
cat "$results"
python3 - "$results" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    who, step, value = line.split()
    runs.setdefault(step, {}).setdefault(who, []).append(float(value))
print("| step | old (median) | new (median) | new / old |  (read in GB/s: higher is better; the others seconds)")
print("|---|---|---|---|")
for step, by in runs.items():
    o, n = statistics.median(by["old"]), statistics.median(by["new"])
    print(f"| {step} | {o:.3f} | {n:.3f} | {n / o:.2f} |")
PY

#!/usr/bin/env bash
# bench/covering.sh: issue 13's measurements of generations as coverings, on
# the GPT of bench/transform.sh (megatron-gpt layers=24, hidden=1024,
# heads=16, vocab=32768, seq=2048: 338 M parameters, f32, ~1.35 GB store, no
# optimizer state) imported at tp=2,pp=2 (4 ranks, one worker).
#
#   1. commit by reference: `ptcfs transform COPY --to T` (whole command,
#      garbage collection included, on a fresh untimed `cp -r` of the store)
#      vs `cp -r STORE OUT`, for T in CHANGES and for the CHAIN of changes
#      (timed as the sum of its commands); bytes written (du -sb of each new
#      generation directory) and, after the chain, du -sb of the store over
#      du -sb of the original store.
#   2. compact: `ptcfs compact --keep-old COPY` of a fresh copy transformed
#      (untimed) to COMPACT_TO (a covering of the tp=2,pp=2 pieces) vs
#      `cp -r STORE OUT && sync` (both durable; neither removes anything: the
#      removal of the replaced pieces, ~1 s per GB of page-cached files, is
#      left out of both, as bench/transform.sh does); peak RSS of compact.
#   3. reads: the first read of every rank file (MNT/model/rank-*/*.safetensors,
#      `ptcfs mount --format safetensors`) through a fresh mount of
#      (a) the uncompacted covering at COMPACT_TO and (b) the same store after
#      compact, and (c) a direct read of the .h5 shard files the store's
#      current generation references (c-a for a's store, c-b for b's). One
#      reader, 1 MiB readv into one reused buffer (bench/mount_read.py 1).
#      Shard files warm in the page cache (cat > /dev/null of the read store's
#      shard files before each timed read); a fresh mount for every timed read.
#   4. correctness (untimed, once): for every target, after the chain and after
#      compact, `ptcfs verify` and `ptcfs export --config T` compared bit for
#      bit (diff -r) with `ptcfs synth --config T` (same seed as the source).
#
# Protocol (machines are shared and noisy): REPS rounds; in each round every
# method of a measurement runs once, in an order that rotates from round to
# round; before each timed write the same preparation for every method
# (previous outputs removed, a fresh copy of the store made), then
# `sync; sleep SETTLE`; before each timed read `sync; sleep SETTLE` too.
# Reported: medians, ratios of medians with the range of the per-round
# (paired) ratios, every run's raw numbers.
#
# The section goes into bench/RESULTS.md between <!-- covering:begin --> and
# <!-- covering:end --> (other sections are left alone; written at the end).
#
# Environment: PTCFS (default build/tools/ptcfs), WORK (scratch, ~7 GB,
# default /tmp/ptcfs-covering-bench, removed at the end unless KEEP=1),
# REPS (3), SETTLE (8 s), CHANGES ("tp=4,pp=1 tp=1,pp=4 tp=2,pp=2,dp=2"),
# CHAIN ("tp=4,pp=1 tp=1,pp=4 tp=2,pp=2,dp=2 tp=1,pp=2"), COMPACT_TO
# (tp=4,pp=1), RESULTS (bench/RESULTS.md). Needs root (or fuse access),
# /dev/fuse and fusermount3.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PTCFS=${PTCFS:-$ROOT/build/tools/ptcfs}
WORK=${WORK:-/tmp/ptcfs-covering-bench}
REPS=${REPS:-3}
SETTLE=${SETTLE:-8}
CHANGES=${CHANGES:-"tp=4,pp=1 tp=1,pp=4 tp=2,pp=2,dp=2"}
CHAIN=${CHAIN:-"tp=4,pp=1 tp=1,pp=4 tp=2,pp=2,dp=2 tp=1,pp=2"}
COMPACT_TO=${COMPACT_TO:-tp=4,pp=1}
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}
READER=$ROOT/bench/mount_read.py
SCHEMA=megatron-gpt
DIMS=layers=24,hidden=1024,heads=16,vocab=32768,seq=2048
FROM=tp=2,pp=2
COMMAND="bench/covering.sh${*:+ $*}"
ENVDESC="REPS=$REPS SETTLE=$SETTLE"
export PTCFS_PROGRESS=0

die() { echo "covering.sh: $*" >&2; exit 1; }
for tool in "$PTCFS" /usr/bin/time /usr/bin/python3; do
  [[ -x $tool ]] || die "$tool not found (build: ninja -C build ptcfs)"
done
command -v fusermount3 > /dev/null || die "fusermount3 not found (apt-get install -y fuse3)"
[[ -c /dev/fuse ]] || die "/dev/fuse is missing: the read measurements need FUSE"
[[ -f $READER ]] || die "$READER not found"
[[ $REPS -ge 1 ]] || die "REPS must be at least 1"

MNT=$WORK/mnt
unmount() {
  if mountpoint -q "$MNT" 2> /dev/null; then fusermount3 -u "$MNT" 2> /dev/null || fusermount3 -uz "$MNT" 2> /dev/null || true; fi
}
trap unmount EXIT

unmount
rm -rf "$WORK"
mkdir -p "$WORK/bin" "$MNT"
# Snapshot the binary: a rebuild during the run must not swap it under us.
cp "$PTCFS" "$WORK/bin/ptcfs"
PTCFS=$WORK/bin/ptcfs
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
LOG=$WORK/runs.tsv      # part case method round seconds max_rss_kib bytes cpu_s extra
STEPS=$WORK/steps.tsv   # chain round step target seconds max_rss_kib bytes
NOTES=$WORK/notes.txt
: > "$LOG"
: > "$STEPS"
: > "$NOTES"
busiest() {  # the four busiest processes now (top's %CPU over its sample), with their nice
  top -bn1 -w 512 -o %CPU | awk '$1 ~ /^[0-9]+$/ && n < 4 {printf "%s%s (nice %s, %s%% CPU)", (n++ ? ", " : ""), $12, $4, $9}'
}
echo "busiest processes at the start: $(busiest)" >> "$NOTES"
START=$(date +%s)
say() { echo "[$(( $(date +%s) - START ))s] $*" >&2; }
gen_dir() {  # STORE -> the current generation's directory
  local g
  g=$(/usr/bin/python3 -c 'import json,sys; print(json.load(open(sys.argv[1] + "/manifest.json"))["generation"])' "$1") ||
    die "cannot read $1/manifest.json"
  printf '%s/gen-%06d' "$1" "$g"
}
shard_files() {  # STORE -> the .h5 files its current generation references, one a line
  /usr/bin/python3 - "$1" <<'EOF'
import json, os, sys
store = sys.argv[1]
g = json.load(open(os.path.join(store, "manifest.json")))["generation"]
m = json.load(open(os.path.join(store, f"gen-{g:06d}", "manifest.json")))
for f in sorted({s["file"] for s in m["shards"]}):
    print(os.path.join(store, f))
EOF
}
settle() { sync; sleep "$SETTLE"; }

# --- the source checkpoint and store (not timed) ---
say "synth + import $SCHEMA $DIMS $FROM (no optimizer state)"
"$PTCFS" synth --schema $SCHEMA --dims $DIMS --config $FROM "$WORK/src" > /dev/null || die "synth failed"
"$PTCFS" import --schema $SCHEMA --dims $DIMS --config $FROM "$WORK/src" "$WORK/store" > /dev/null || die "import failed"
rm -rf "$WORK/src"
STORE_BYTES=$(du -sb "$WORK/store" | cut -f1)
echo "store $STORE_BYTES bytes (du -sb), $(find "$WORK/store" -name '*.h5' | wc -l) shard files" >> "$NOTES"
cat $(find "$WORK/store" -name '*.h5') > /dev/null

# prepare: the same for every method, so that each timed command starts from
# the same memory state: every previous output removed, a fresh copy made.
prepare() {
  rm -rf "$WORK/s" "$WORK/cp.out"
  cp -r "$WORK/store" "$WORK/s"
}

# timed OUTVAR CMD...: run under /usr/bin/time (after settle); sets
# T_SECS T_RSS T_CPU.
timed() {
  local what=$1
  shift
  settle
  if ! /usr/bin/time -f "%e %M %U %S" -o "$WORK/time.txt" "$@" > "$WORK/last.log" 2>&1; then
    cat "$WORK/last.log" >&2
    die "$what failed: $*"
  fi
  local user sys
  read -r T_SECS T_RSS user sys < <(tail -n 1 "$WORK/time.txt")
  T_CPU=$(awk -v u="$user" -v s="$sys" 'BEGIN {printf "%.2f", u + s}')
}
log() {  # part case method round seconds rss bytes cpu extra
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >> "$LOG"
}

# --- 1. commit by reference ---
run_change() {  # CASE METHOD ROUND
  local c=$1 m=$2 r=$3
  prepare
  if [[ $m == cp ]]; then
    timed "cp -r" cp -r "$WORK/store" "$WORK/cp.out"
    log change "$c" cp "$r" "$T_SECS" "$T_RSS" "$(du -sb "$WORK/cp.out" | cut -f1)" "$T_CPU" -
    say "change $c round $r cp: $T_SECS s"
    return
  fi
  local targets=$c secs=0 rss=0 bytes=0 cpu=0 step=0 t before b
  [[ $c == chain ]] && targets=$CHAIN
  for t in $targets; do
    before=$(gen_dir "$WORK/s")
    timed "ptcfs transform --to $t" "$PTCFS" transform "$WORK/s" --to "$t"
    [[ $(gen_dir "$WORK/s") != "$before" ]] || die "transform --to $t committed no new generation"
    b=$(du -sb "$(gen_dir "$WORK/s")" | cut -f1)
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$r" "$step" "$t" "$T_SECS" "$T_RSS" "$b" >> "$STEPS"
    [[ $r == 0 ]] && echo "$c round 0 step $step: $(grep -h 'committed' "$WORK/last.log")" >> "$NOTES"
    secs=$(awk -v a="$secs" -v b="$T_SECS" 'BEGIN {print a + b}')
    cpu=$(awk -v a="$cpu" -v b="$T_CPU" 'BEGIN {print a + b}')
    ((T_RSS > rss)) && rss=$T_RSS
    bytes=$((bytes + b))
    step=$((step + 1))
  done
  local size
  size=$(du -sb "$WORK/s" | cut -f1)
  log change "$c" ptcfs "$r" "$secs" "$rss" "$bytes" "$cpu" "$size"
  say "change $c round $r ptcfs: $secs s, $bytes bytes written, store $size bytes"
}

CASES="$CHANGES chain"
for c in $CASES; do
  for ((r = 0; r < REPS; r++)); do
    if ((r % 2 == 0)); then order="ptcfs cp"; else order="cp ptcfs"; fi
    for m in $order; do run_change "$c" "$m" "$r"; done
  done
done

# --- 2. compact ---
run_compact() {  # METHOD ROUND
  local m=$1 r=$2
  prepare
  rm -rf "$WORK/cps.out"
  "$PTCFS" transform "$WORK/s" --to "$COMPACT_TO" > /dev/null || die "transform --to $COMPACT_TO failed"
  if [[ $m == cp+sync ]]; then
    timed "cp -r && sync" sh -c "cp -r '$WORK/store' '$WORK/cps.out' && sync"
    log compact "$COMPACT_TO" cp+sync "$r" "$T_SECS" "$T_RSS" "$(du -sb "$WORK/cps.out" | cut -f1)" "$T_CPU" -
    rm -rf "$WORK/cps.out"
  else
    local before
    before=$(gen_dir "$WORK/s")
    timed "ptcfs compact" "$PTCFS" compact --keep-old "$WORK/s"
    [[ $(gen_dir "$WORK/s") != "$before" ]] || die "compact committed no new generation"
    log compact "$COMPACT_TO" compact "$r" "$T_SECS" "$T_RSS" "$(du -sb "$(gen_dir "$WORK/s")" | cut -f1)" "$T_CPU" "$(du -sb "$WORK/s" | cut -f1)"
    [[ $r == 0 ]] && echo "compact round 0: $(grep -h 'compacted' "$WORK/last.log")" >> "$NOTES"
  fi
  say "compact round $r $m: $T_SECS s, max RSS $T_RSS KiB"
}
for ((r = 0; r < REPS; r++)); do
  if ((r % 2 == 0)); then order="compact cp+sync"; else order="cp+sync compact"; fi
  for m in $order; do run_compact "$m" "$r"; done
done
rm -rf "$WORK/s" "$WORK/cp.out"

# --- 3. reads ---
say "reads: covering store at $COMPACT_TO and its compacted copy"
cp -r "$WORK/store" "$WORK/cov"
"$PTCFS" plan "$WORK/cov" --to "$COMPACT_TO" --json > "$WORK/plan.json"
echo "plan $FROM -> $COMPACT_TO: $(/usr/bin/python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); print(", ".join(f"{k} {p[k]}" for k in ("bytes_to_write", "pieces_referenced", "bytes_referenced", "compact_bytes")))' "$WORK/plan.json")" >> "$NOTES"
"$PTCFS" transform "$WORK/cov" --to "$COMPACT_TO" > /dev/null || die "transform of the read store failed"
cp -r "$WORK/cov" "$WORK/cmp"
"$PTCFS" compact "$WORK/cmp" > /dev/null || die "compact of the read store failed"
mapfile -t COV_FILES < <(shard_files "$WORK/cov")
mapfile -t CMP_FILES < <(shard_files "$WORK/cmp")
echo "read stores: covering $(du -sb "$WORK/cov" | cut -f1) bytes, its generation references ${#COV_FILES[@]} shard files; compacted $(du -sb "$WORK/cmp" | cut -f1) bytes, ${#CMP_FILES[@]} shard files" >> "$NOTES"

read_once() {  # CASE ROUND
  local c=$1 r=$2 store files gbps bytes
  case $c in
    a | c-a) store=$WORK/cov; files=("${COV_FILES[@]}") ;;
    b | c-b) store=$WORK/cmp; files=("${CMP_FILES[@]}") ;;
  esac
  cat "${files[@]}" > /dev/null  # shard files warm in the page cache
  if [[ $c == c-* ]]; then
    bytes=$(stat -c %s "${files[@]}" | awk '{s += $1} END {print s}')
    settle
    gbps=$(/usr/bin/python3 "$READER" 1 "${files[@]}") || die "direct read of $store's shard files failed"
  else
    "$PTCFS" mount --wait --format safetensors "$store" "$MNT" || die "mount of $store failed"
    local rank_files
    mapfile -t rank_files < <(find "$MNT/model" -name '*.safetensors' | sort)
    [[ ${#rank_files[@]} -gt 0 ]] || { unmount; die "no rank files under $MNT/model"; }
    bytes=$(stat -c %s "${rank_files[@]}" | awk '{s += $1} END {print s}')
    cat "${files[@]}" > /dev/null
    settle
    gbps=$(/usr/bin/python3 "$READER" 1 "${rank_files[@]}") || { unmount; die "read through the mount of $store failed"; }
    fusermount3 -u "$MNT" || die "fusermount3 -u $MNT failed"
  fi
  local secs
  secs=$(awk -v b="$bytes" -v g="$gbps" 'BEGIN {printf "%.3f", b / g / 1e9}')
  log read "$c" read "$r" "$secs" 0 "$bytes" 0 "$gbps"
  say "read $c round $r: $gbps GB/s ($bytes bytes, $secs s)"
}
READS=(a b c-a c-b)
for ((r = 0; r < REPS; r++)); do
  for ((i = 0; i < ${#READS[@]}; i++)); do read_once "${READS[$(((i + r) % ${#READS[@]}))]}" "$r"; done
done

# --- 4. correctness (untimed) ---
declare -A REF
reference() {  # CONFIG -> path of synth --config CONFIG (made once)
  local t=$1 dir
  dir=$WORK/ref-${t//[,=]/_}
  if [[ ! -d $dir ]]; then
    "$PTCFS" synth --schema $SCHEMA --dims $DIMS --config "$t" "$dir" > /dev/null || die "synth --config $t failed"
  fi
  REF[$t]=$dir
}
check() {  # STORE CONFIG WHAT
  local s=$1 t=$2 what=$3
  "$PTCFS" verify "$s" > "$WORK/verify.log" 2>&1 || { cat "$WORK/verify.log" >&2; die "verify failed: $what"; }
  rm -rf "$WORK/exp"
  "$PTCFS" export --config "$t" "$s" "$WORK/exp" > /dev/null || die "export --config $t failed: $what"
  reference "$t"
  diff -r "$WORK/exp" "${REF[$t]}" > /dev/null || die "export --config $t differs from synth --config $t: $what"
  echo "check $what: verify clean ($(tr -d '\n' < "$WORK/verify.log")); export --config $t equals synth --config $t, $(find "$WORK/exp" -type f | wc -l) files, $(du -sb "$WORK/exp" | cut -f1) bytes (diff -r)" >> "$NOTES"
  rm -rf "$WORK/exp"
  say "checked $what"
}
plan_note() {  # STORE CONFIG WHAT
  "$PTCFS" plan "$1" --to "$2" --json > "$WORK/plan.json" || die "plan --to $2 failed"
  echo "plan $3: $(/usr/bin/python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); print(", ".join(f"{k} {p[k]}" for k in ("bytes_to_write", "pieces_referenced", "bytes_referenced", "compact_bytes")))' "$WORK/plan.json")" >> "$NOTES"
}
check "$WORK/cov" "$COMPACT_TO" "transform $FROM -> $COMPACT_TO (the read store a)"
check "$WORK/cmp" "$COMPACT_TO" "$FROM -> $COMPACT_TO, then compact (the read store b)"
rm -rf "$WORK/cov" "$WORK/cmp"
for t in $CHANGES; do
  if [[ $t == "$COMPACT_TO" ]]; then
    echo "check transform $FROM -> $t: the read store (a) above is that transform" >> "$NOTES"
    continue
  fi
  rm -rf "$WORK/s"
  cp -r "$WORK/store" "$WORK/s"
  plan_note "$WORK/s" "$t" "$FROM -> $t"
  "$PTCFS" transform "$WORK/s" --to "$t" > /dev/null || die "transform --to $t failed"
  check "$WORK/s" "$t" "transform $FROM -> $t"
done
rm -rf "$WORK/s"
cp -r "$WORK/store" "$WORK/s"
prev=$FROM
for t in $CHAIN; do
  plan_note "$WORK/s" "$t" "chain $prev -> $t"
  "$PTCFS" transform "$WORK/s" --to "$t" > /dev/null || die "chain: transform --to $t failed"
  "$PTCFS" verify "$WORK/s" > /dev/null || die "chain: verify after --to $t failed"
  prev=$t
done
echo "chain: verify clean after every step; generations left: $(cd "$WORK/s" && echo gen-*)" >> "$NOTES"
check "$WORK/s" "$prev" "the chain $FROM -> ${CHAIN// / -> }"
"$PTCFS" compact "$WORK/s" > /dev/null || die "compact after the chain failed"
check "$WORK/s" "$prev" "the chain, then compact"
rm -rf "$WORK/s"

echo "busiest processes at the end: $(busiest)" >> "$NOTES"

# --- the section ---
MACHINE="$(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(free -g | awk '/^Mem:/ {print $2 " GiB RAM, " $7 " GiB available"}'), $(df -hT "$WORK" | awk 'NR==2 {print $2 " on " $1 ", " $3 " (" $5 " free)"}'), Linux $(uname -r); load average $LOAD_START at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end (shared machine)"
/usr/bin/python3 - "$LOG" "$STEPS" "$NOTES" "$RESULTS" "$COMMAND" "$ENVDESC" "$MACHINE" "$(date -u '+%Y-%m-%d %H:%M UTC')" \
  "$(( $(date +%s) - START ))" "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" "$STORE_BYTES" \
  "$CHANGES" "$CHAIN" "$COMPACT_TO" "$FROM" "$SETTLE" <<'EOF'
import collections, os, re, statistics, sys
(log, steps, notes, results, command, envdesc, machine, date, elapsed, rev, store_bytes,
 changes, chain, compact_to, src, settle) = sys.argv[1:]
store_bytes = int(store_bytes)
runs = collections.defaultdict(dict)   # (part, case, method) -> {round: dict}
cases = collections.defaultdict(list)
for line in open(log):
    p, c, m, r, s, rss, b, cpu, extra = line.rstrip("\n").split("\t")
    if c not in cases[p]: cases[p].append(c)
    runs[(p, c, m)][int(r)] = dict(secs=float(s), rss=int(rss), bytes=int(b), cpu=float(cpu), extra=extra)

def med(key, f):
    v = [f(x) for x in runs[key].values()]
    return statistics.median(v) if v else None

def ratio(a, b, f, goal=None, le=True):
    """ratio of medians of f over runs a and b, with the range of the per-round ratios"""
    ma, mb = med(a, f), med(b, f)
    if ma is None or not mb: return "–", None
    ra, rb = runs[a], runs[b]
    p = [f(ra[r]) / f(rb[r]) for r in sorted(ra) if r in rb and f(rb[r])]
    rng = f" ({min(p):.3f}–{max(p):.3f})" if len(p) > 1 else ""
    v = ma / mb
    return f"**{v:.3f}**{rng}", v

def met(v, goal, le=True):
    if v is None: return "–"
    return "met" if (v <= goal if le else v >= goal) else "**not met**"

secs = lambda x: x["secs"]
gbps = lambda x: float(x["extra"])
out = ["<!-- covering:begin -->", "## Coverings (issue 13): commit by reference, compact, reads\n"]
out.append(f"Produced by `{envdesc} bash {command}` at {rev} (working tree), {date}, in {int(elapsed) // 60} min {int(elapsed) % 60} s.  ")
out.append(f"Machine: {machine}.  ")
out.append("Model: megatron-gpt layers=24,hidden=1024,heads=16,vocab=32768,seq=2048 (338 M parameters, f32, "
           f"no optimizer state), imported at {src} (4 ranks, one worker): store {store_bytes} bytes (du -sb).\n")
out.append("Protocol: REPS rounds; in each round every method of a row runs once, the order alternating from round to "
           "round. Before every timed write the same preparation for every method (previous outputs removed, a fresh "
           f"`cp -r` of the store made, not timed), then `sync; sleep {settle}`; before every timed read "
           f"`sync; sleep {settle}` too. Wall-clock medians; ratios are ratios of medians, with the range of the "
           "per-round (paired) ratios in parentheses. ptcfs commands run with their defaults (2 threads) and "
           "the whole command is timed; transform without `--keep-old` (its garbage collection included), compact with it "
           "(see part 2).\n")

# 1
out.append(f"### 1. Commit by reference: `ptcfs transform COPY --to T` vs `cp -r STORE OUT`\n")
out.append(f"`chain` is {src} → " + " → ".join(chain.split()) + f" on one copy, timed as the sum of its {len(chain.split())} commands "
           "(a settle before each). Written = du -sb of each new generation's directory right after its commit "
           "(summed over the chain); goal ≤ 1% of the store.\n")
out.append("| change | cp -r (s) | ptcfs transform (s) | ptcfs / cp (goal ≤ 0.05) | | written (bytes) | written / store (goal ≤ 1%) | | peak RSS (MiB) | n |")
out.append("|---|---|---|---|---|---|---|---|---|---|")
for c in cases["change"]:
    a, b = ("change", c, "ptcfs"), ("change", c, "cp")
    txt, v = ratio(a, b, secs)
    w = max(x["bytes"] for x in runs[a].values())
    wr = w / store_bytes
    name = f"{src} → {c}" if c != "chain" else f"chain ({len(chain.split())} changes, summed)"
    out.append(f"| {name} | {med(b, secs):.2f} | {med(a, secs):.3f} | {txt} | {met(v, 0.05)} | {w} (max) | "
               f"{100 * wr:.3f}% | {met(wr, 0.01)} | {max(x['rss'] for x in runs[a].values()) / 1024:.0f} | {len(runs[a])} |")
ch = runs[("change", "chain", "ptcfs")]
if ch:
    n = len(chain.split())
    per = lambda x: x["secs"] / n
    pr = [ch[r]["secs"] / n / runs[("change", "chain", "cp")][r]["secs"] for r in sorted(ch) if r in runs[("change", "chain", "cp")]]
    v = med(("change", "chain", "ptcfs"), per) / med(("change", "chain", "cp"), secs)
    rng = f" ({min(pr):.3f}–{max(pr):.3f})" if len(pr) > 1 else ""
    out.append("")
    out.append(f"The chain per change (its sum / {n}) over one `cp -r`: **{v:.3f}**{rng} (the goal ≤ 0.05 read per change): {met(v, 0.05)}.")
    sizes = [int(x["extra"]) for _, x in sorted(ch.items())]
    r = statistics.median(sizes) / store_bytes
    out.append("")
    out.append(f"After the chain the store is {statistics.median(sizes):.0f} bytes (du -sb, median; per round "
               f"{', '.join(map(str, sizes))}) = **{r:.4f}x** the original store (goal ≤ 1.05x): {met(r, 1.05)}.\n")

# 2
out.append(f"### 2. `ptcfs compact --keep-old COPY` (a covering at {compact_to} of the {src} pieces) vs `cp -r STORE OUT && sync`\n")
out.append("Both durable (compact syncs the file system before its commit). The copy's transform to "
           f"{compact_to} is part of the untimed preparation of both methods. Neither removes anything: "
           "`--keep-old` leaves the replaced pieces to a later collection (without it, compact then deletes "
           "1.3 GB of page-cached files: ~1.4 s measured on this machine, which `cp` does not do).\n")
out.append("| compact (s) | cp -r && sync (s) | compact / (cp+sync) (goal ≤ 1.0) | | CPU s: compact / cp+sync | written by compact (bytes) | peak RSS of compact (MiB; goal ≤ 256) | | n |")
out.append("|---|---|---|---|---|---|---|---|---|")
a, b = ("compact", compact_to, "compact"), ("compact", compact_to, "cp+sync")
if runs[a]:
    txt, v = ratio(a, b, secs)
    rss = max(x["rss"] for x in runs[a].values()) / 1024
    out.append(f"| {med(a, secs):.2f} | {med(b, secs):.2f} | {txt} | {met(v, 1.0)} | "
               f"{med(a, lambda x: x['cpu']):.2f} / {med(b, lambda x: x['cpu']):.2f} | {int(med(a, lambda x: x['bytes']))} | "
               f"{rss:.0f} | {met(rss, 256)} | {len(runs[a])} |")
out.append("")

# 3
out.append(f"### 3. First read of every rank file: mount of the covering vs the compacted store vs the shard files\n")
out.append(f"(a) `ptcfs mount --format safetensors` of the uncompacted covering at {compact_to}; (b) the same store "
           "after `ptcfs compact`; (c-a), (c-b) a direct read of the .h5 shard files the current generation of "
           "(a)'s / (b)'s store references. A fresh mount for every timed read, which reads every "
           "MNT/model/rank-*/*.safetensors once (`bench/mount_read.py 1`: one reader, 1 MiB `os.readv` into one "
           "reused bytearray). The store's shard files are warm in the page cache (`cat FILES > /dev/null` right "
           "before each timed read). GB/s = bytes of the files read / seconds.\n")
out.append("| read | GB/s (median) | s (median) | bytes | n |")
out.append("|---|---|---|---|---|")
label = {"a": "(a) mount, covering", "b": "(b) mount, compacted", "c-a": "(c-a) direct, covering's shard files",
         "c-b": "(c-b) direct, compacted store's shard files"}
for c in cases["read"]:
    k = ("read", c, "read")
    out.append(f"| {label.get(c, c)} | {med(k, gbps):.3f} | {med(k, secs):.3f} | {runs[k][0]['bytes']} | {len(runs[k])} |")
out.append("")
out.append("| ratio (of GB/s) | value (paired range) | goal | |")
out.append("|---|---|---|---|")
for x, y, g in (("a", "b", 0.8), ("a", "c-a", 0.33), ("b", "c-b", 0.33), ("a", "c-b", 0.33)):
    txt, v = ratio(("read", x, "read"), ("read", y, "read"), gbps)
    out.append(f"| ({x}) / ({y}) | {txt} | ≥ {g} | {met(v, g, le=False)} |")
out.append("")

# raw
out.append("Each run, as measured:\n")
out.append("| part | case | method | round | seconds | CPU s | max RSS (MiB) | bytes | extra |")
out.append("|---|---|---|---|---|---|---|---|---|")
for p in ("change", "compact", "read"):
    for c in cases[p]:
        for (pp, cc, m), rr in sorted(runs.items()):
            if (pp, cc) != (p, c): continue
            for r, x in sorted(rr.items()):
                extra = {"change": "store after (bytes)", "compact": "store after (bytes)", "read": "GB/s"}[p]
                ex = "" if x["extra"] == "-" else f"{extra}: {x['extra']}"
                out.append(f"| {p} | {c} | {m} | {r} | {x['secs']:.3f} | {x['cpu']:.2f} | {x['rss'] / 1024:.0f} | {x['bytes']} | {ex} |")
out.append("")
out.append("ptcfs transform, command by command (chain steps 0–3):\n")
out.append("| round | step | to | seconds | max RSS (MiB) | written (bytes) |")
out.append("|---|---|---|---|---|---|")
for line in open(steps):
    r, s, t, sec, rss, b = line.rstrip("\n").split("\t")
    out.append(f"| {r} | {s} | {t} | {float(sec):.2f} | {int(rss) / 1024:.0f} | {b} |")
out.append("")
out.append("Notes: plans, each command's own summary (round 0), what was checked (correctness, untimed, once):\n")
out.append("```")
out.extend(l.rstrip("\n") for l in open(notes))
out.append("```")
out.append("<!-- covering:end -->")
section = "\n".join(out) + "\n"

old = open(results).read() if os.path.exists(results) else "# Benchmark results\n\n"
m = re.search(r"<!-- covering:begin -->.*?<!-- covering:end -->\n?", old, re.S)
new = old[:m.start()] + section + old[m.end():] if m else old.rstrip("\n") + "\n\n" + section
tmp = results + ".covering.tmp"
open(tmp, "w").write(new)
os.replace(tmp, results)
print(section)
EOF

if [[ ${KEEP:-0} != 1 ]]; then rm -rf "$WORK"; fi
say "done; section written to $RESULTS"

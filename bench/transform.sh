#!/usr/bin/env bash
# bench/transform.sh: `ptcfs transform` against the physical floor (`cp -r` of
# the store) and against the way users reshard today (bench/naive_reshard.py:
# load every rank file with torch, concatenate, re-split, torch.save), on the
# GPT of issue 3 (layers=24, hidden=1024, heads=16, vocab=32768, seq=2048:
# 338 M parameters, 1.3 GB f32) from tp=2,pp=2 to each target; then the
# planner on a 70B Llama (bench/plan_70b.cc, one core).
#
# Protocol (machines are shared and noisy): for every target, REPS rounds;
# in each round every method runs once, in an order that rotates from round
# to round; before each timed command the same preparation for every method
# (previous outputs removed, a fresh copy of the store made), then
# `sync; sleep SETTLE`. Reported: medians, the ratio of medians, the range of
# the per-round (paired) ratios, CPU seconds (user + sys), bytes written, peak
# RSS (/usr/bin/time's max RSS). Every input is in the page cache.
#
#   cp        cp -r STORE OUT                       the floor (page cache warm, not durable)
#   cp+sync   cp -r STORE OUT && sync               the floor for a durable write
#   ptcfs     ptcfs transform COPY --to T --keep-old on the fresh copy of the store
#             (copy not timed; whole command timed: plan, write, fsync, commit;
#             --keep-old: the old generation is not garbage-collected, which a
#             benchmark repeating on fresh copies does not need)
#   naive     /usr/bin/python3 bench/naive_reshard.py (torch.save of model.pt per target rank)
#
# Correctness, once per target and not timed: `ptcfs transform` (without
# --keep-old), `ptcfs verify`, `ptcfs export` of the new generation and
# `ptcfs diff` against the source checkpoint; the naive script's output
# (written as safetensors) `ptcfs diff`ed likewise, and for the first target
# its torch.save output compared with that, tensor for tensor.
#
# The table goes into bench/RESULTS.md between <!-- transform:begin --> and
# <!-- transform:end --> (other sections are left alone).
#
# Environment: PTCFS (default build/tools/ptcfs), PLAN_BENCH (default
# build/bench/plan_bench, else build-bench/bench/plan_bench), WORK (scratch,
# ~8 GB, default /tmp/ptcfs-transform-bench, removed at the end unless KEEP=1),
# REPS (3), NAIVE_REPS (REPS), SETTLE (8 s), TARGETS ("tp=4,pp=1 tp=1,pp=4
# tp=2,pp=1 tp=2,pp=4"), PLAN_REPS (5), RESULTS (bench/RESULTS.md).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PTCFS=${PTCFS:-$ROOT/build/tools/ptcfs}
if [[ -z ${PLAN_BENCH:-} ]]; then
  PLAN_BENCH=$ROOT/build/bench/plan_bench
  [[ -x $PLAN_BENCH ]] || PLAN_BENCH=$ROOT/build-bench/bench/plan_bench
fi
NAIVE="/usr/bin/python3 $ROOT/bench/naive_reshard.py"
WORK=${WORK:-/tmp/ptcfs-transform-bench}
REPS=${REPS:-3}
NAIVE_REPS=${NAIVE_REPS:-$REPS}
SETTLE=${SETTLE:-8}
TARGETS=${TARGETS:-"tp=4,pp=1 tp=1,pp=4 tp=2,pp=1 tp=2,pp=4"}
PLAN_REPS=${PLAN_REPS:-5}
RESULTS=${RESULTS:-$ROOT/bench/RESULTS.md}
SCHEMA=megatron-gpt
DIMS=layers=24,hidden=1024,heads=16,vocab=32768,seq=2048
FROM=tp=2,pp=2
COMMAND="bench/transform.sh${*:+ $*}"
ENVDESC="REPS=$REPS NAIVE_REPS=$NAIVE_REPS SETTLE=$SETTLE TARGETS=\"$TARGETS\" PLAN_REPS=$PLAN_REPS"

for tool in "$PTCFS" "$PLAN_BENCH" /usr/bin/time /usr/bin/python3; do
  [[ -x $tool ]] || { echo "transform.sh: $tool not found (build: ninja -C build ptcfs plan_bench)" >&2; exit 1; }
done
/usr/bin/python3 -c 'import torch' || { echo "transform.sh: needs python3-torch (apt-get install -y python3-torch)" >&2; exit 1; }

rm -rf "$WORK"
mkdir -p "$WORK/bin"
# Snapshot the binaries: a rebuild during the run must not swap them under us.
cp "$PTCFS" "$WORK/bin/ptcfs"
cp "$PLAN_BENCH" "$WORK/bin/plan_bench"
PTCFS=$WORK/bin/ptcfs
PLAN_BENCH=$WORK/bin/plan_bench
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
LOG=$WORK/runs.tsv   # target method round seconds max_rss_kib bytes_written
: > "$LOG"
NOTES=$WORK/notes.txt
: > "$NOTES"
START=$(date +%s)
say() { echo "[$(( $(date +%s) - START ))s] $*" >&2; }

# --- the source checkpoint and store (not timed) ---
say "synth + import $SCHEMA $DIMS $FROM"
"$PTCFS" synth --schema $SCHEMA --dims $DIMS --config $FROM "$WORK/src" > /dev/null
"$PTCFS" import --schema $SCHEMA --dims $DIMS --config $FROM "$WORK/src" "$WORK/store" > /dev/null
echo "source checkpoint $(du -sb "$WORK/src" | cut -f1) bytes; store $(du -sb "$WORK/store" | cut -f1) bytes" >> "$NOTES"

# prepare: the same for every method, so that each timed command starts from
# the same memory state (writes are much cheaper into memory freed moments
# ago): every previous output is removed, then a fresh copy of the store is
# made (ptcfs transforms it; the others ignore it).
prepare() {
  rm -rf "$WORK/s" "$WORK/cp.out" "$WORK/cps.out" "$WORK/nv"
  cp -r "$WORK/store" "$WORK/s"
}

# timed TARGET METHOD ROUND OUT CMD...: settle, run under /usr/bin/time, log.
timed() {
  local target=$1 method=$2 round=$3 out=$4
  shift 4
  sync
  sleep "$SETTLE"
  if ! /usr/bin/time -f "%e %M %U %S" -o "$WORK/time.txt" "$@" > "$WORK/last.log" 2>&1; then
    cat "$WORK/last.log" >&2
    echo "transform.sh: $method to $target failed" >&2
    exit 1
  fi
  local secs rss user sys bytes
  read -r secs rss user sys < <(tail -n 1 "$WORK/time.txt")
  bytes=$(du -sb "$out" | cut -f1)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$target" "$method" "$round" "$secs" "$rss" "$bytes" "$user" "$sys" >> "$LOG"
  say "$target round $round $method: ${secs} s (user $user, sys $sys), ${rss} KiB, $bytes bytes"
}

run_method() {  # TARGET METHOD ROUND
  local t=$1 m=$2 r=$3
  prepare
  case $m in
    cp)
      timed "$t" cp "$r" "$WORK/cp.out" cp -r "$WORK/store" "$WORK/cp.out" ;;
    cp+sync)
      timed "$t" cp+sync "$r" "$WORK/cps.out" sh -c "cp -r '$WORK/store' '$WORK/cps.out' && sync" ;;
    ptcfs)
      timed "$t" ptcfs "$r" "$WORK/s/gen-000002" "$PTCFS" transform "$WORK/s" --to "$t" --keep-old
      echo "$t round $r ptcfs: $(grep -h 'committed' "$WORK/last.log")" >> "$NOTES" ;;
    naive)
      timed "$t" naive "$r" "$WORK/nv" $NAIVE --dims $DIMS --from $FROM --to "$t" "$WORK/src" "$WORK/nv" ;;
  esac
}

verify_target() {  # TARGET FIRST(0/1)
  local t=$1 first=$2
  prepare
  "$PTCFS" transform "$WORK/s" --to "$t" > /dev/null
  "$PTCFS" verify "$WORK/s" > /dev/null
  rm -rf "$WORK/exp"
  "$PTCFS" export --config "$t" "$WORK/s" "$WORK/exp" > /dev/null
  "$PTCFS" diff --schema $SCHEMA --dims $DIMS --config-a $FROM --config-b "$t" "$WORK/src" "$WORK/exp" > /dev/null
  echo "verify $t ptcfs: transform (old generation collected), verify clean, export --config $t equals the source (ptcfs diff)" >> "$NOTES"
  rm -rf "$WORK/exp" "$WORK/s" "$WORK/nvst"
  $NAIVE --dims $DIMS --from $FROM --to "$t" --format safetensors "$WORK/src" "$WORK/nvst"
  "$PTCFS" diff --schema $SCHEMA --dims $DIMS --config-a $FROM --config-b "$t" "$WORK/src" "$WORK/nvst" > /dev/null
  local extra=""
  if [[ $first == 1 ]]; then
    $NAIVE --dims $DIMS --from $FROM --to "$t" "$WORK/src" "$WORK/nv"
    $NAIVE --compare-pt "$WORK/nv" "$WORK/nvst" > /dev/null
    extra="; its torch.save output (the timed one) equals that tensor for tensor"
  fi
  echo "verify $t naive: safetensors output equals the source (ptcfs diff)$extra" >> "$NOTES"
  rm -rf "$WORK/nvst" "$WORK/nv"
  say "verified $t"
}

# --- transform benchmark ---
METHODS=(cp cp+sync ptcfs naive)
first=1
for t in $TARGETS; do
  say "plan $FROM -> $t"
  "$PTCFS" plan "$WORK/store" --to "$t" | sed "s/^/plan $t: /" >> "$NOTES"
  for ((r = 0; r < REPS; r++)); do
    n=${#METHODS[@]}
    for ((i = 0; i < n; i++)); do
      m=${METHODS[$(((i + r) % n))]}
      [[ $m == naive && $r -ge $NAIVE_REPS ]] && continue
      run_method "$t" "$m" "$r"
    done
  done
  verify_target "$t" $first
  first=0
done

# --- planner benchmark: 70B Llama, one core ---
PLANLOG=$WORK/plan.txt
: > "$PLANLOG"
for opt in "" --optimizer; do
  say "plan_bench $opt"
  sync
  sleep 2
  taskset -c 0 /usr/bin/time -f "TIME %e %M" "$PLAN_BENCH" --reps "$PLAN_REPS" $opt >> "$PLANLOG" 2>&1
done

# --- the table ---
MACHINE="$(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), $(free -g | awk '/^Mem:/ {print $2 " GiB RAM, " $7 " GiB available"}'), $(df -hT "$WORK" | awk 'NR==2 {print $2 " on " $1}'), Linux $(uname -r); load average $LOAD_START at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end (shared machine)"
/usr/bin/python3 - "$LOG" "$NOTES" "$PLANLOG" "$RESULTS" "$COMMAND" "$ENVDESC" "$MACHINE" "$(date -u '+%Y-%m-%d %H:%M UTC')" \
  "$(( $(date +%s) - START ))" "$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" <<'EOF'
import collections, os, re, statistics, sys
log, notes, planlog, results, command, envdesc, machine, date, elapsed, rev = sys.argv[1:]
runs = collections.defaultdict(dict)   # (target, method) -> {round: (secs, rss_kib, bytes)}
targets = []
for line in open(log):
    t, m, r, s, rss, b, u, k = line.rstrip("\n").split("\t")
    if t not in targets: targets.append(t)
    runs[(t, m)][int(r)] = (float(s), int(rss), int(b), float(u) + float(k))

def med(t, m, i):
    v = [x[i] for x in runs[(t, m)].values()]
    return statistics.median(v) if v else None

def paired(t, a, b, i=0):
    """per-round ratios a/b"""
    ra, rb = runs[(t, a)], runs[(t, b)]
    return [ra[r][i] / rb[r][i] for r in sorted(ra) if r in rb and rb[r][i] > 0]

def fmt_ratio(t, a, b, i=0):
    ma, mb = med(t, a, i), med(t, b, i)
    if ma is None or mb is None or mb == 0: return "–"
    p = paired(t, a, b, i)
    rng = f" ({min(p):.2f}–{max(p):.2f})" if len(p) > 1 else ""
    return f"**{ma / mb:.2f}**{rng}"

MB = 1e6
out = []
out.append("<!-- transform:begin -->")
out.append("## Transform: `ptcfs transform` vs `cp -r` vs a torch reshard script\n")
out.append(f"Produced by `{envdesc} {command}` at {rev} (working tree), {date}, in {int(elapsed) // 60} min.  ")
out.append(f"Machine: {machine}.  ")
out.append("Model: megatron-gpt layers=24,hidden=1024,heads=16,vocab=32768,seq=2048 (338 M parameters, f32), "
           "source tp=2,pp=2 (4 ranks, one worker). " + " ".join(l.strip() for l in open(notes) if l.startswith("source")) + ".\n")
out.append("Times are wall-clock medians of the rounds (n = rounds); ratios are ratios of medians, with the range of "
           "the per-round paired ratios in parentheses. CPU = user + sys seconds of the command (/usr/bin/time), "
           "less sensitive than wall time to the other tenants of a shared machine. Before every timed command, "
           "the same preparation for every method (all previous outputs removed, a fresh copy of the store made "
           "for ptcfs to transform), then `sync; sleep 8`. Methods in rotating order each round. Inputs warm in "
           "the page cache. ptcfs runs with its default 2 threads and `--keep-old`; the whole command is timed "
           "(plan, read with checksum verification, write, fsync, commit).\n")
out.append("| target | cp -r (s) | cp -r && sync (s) | ptcfs transform (s) | naive torch (s) | ptcfs / cp | ptcfs / (cp+sync) | naive / ptcfs | CPU s: cp / ptcfs / naive | CPU ptcfs / cp | written: cp / ptcfs / naive (MB) | peak RSS: cp / ptcfs / naive (MiB) | n |")
out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for t in targets:
    def s(m):
        v = med(t, m, 0)
        return "–" if v is None else f"{v:.2f}"
    def b(m):
        v = med(t, m, 2)
        return "–" if v is None else (f"{v / MB:.0f}" if v >= 10 * MB else f"{v / MB:.2f}")
    def rss(m):
        v = [x[1] for x in runs[(t, m)].values()]
        return "–" if not v else f"{max(v) / 1024:.0f}"
    n = f"{len(runs[(t, 'ptcfs')])}" + (f" (naive {len(runs[(t, 'naive')])})" if len(runs[(t, 'naive')]) != len(runs[(t, 'ptcfs')]) else "")
    def cpu(m):
        v = med(t, m, 3)
        return "–" if v is None else f"{v:.2f}"
    out.append(f"| {t} | {s('cp')} | {s('cp+sync')} | {s('ptcfs')} | {s('naive')} | {fmt_ratio(t, 'ptcfs', 'cp')} | "
               f"{fmt_ratio(t, 'ptcfs', 'cp+sync')} | {fmt_ratio(t, 'naive', 'ptcfs')} | {cpu('cp')} / {cpu('ptcfs')} / {cpu('naive')} | "
               f"{fmt_ratio(t, 'ptcfs', 'cp', 3)} | {b('cp')} / {b('ptcfs')} / {b('naive')} | "
               f"{rss('cp')} / {rss('ptcfs')} / {rss('naive')} | {n} |")
out.append("")
out.append("Written = `du -sb` of the output: the copy; the new generation's directory (shards written plus its "
           "manifest; unchanged shards are referenced in gen-000001, not copied); the naive script's rank files. "
           "Peak RSS is the largest max RSS of the rounds.\n")
out.append("Each run, as measured:\n")
out.append("| target | method | round | seconds | CPU s | max RSS (MiB) | bytes written |")
out.append("|---|---|---|---|---|---|---|")
for t in targets:
    for m in ("cp", "cp+sync", "ptcfs", "naive"):
        for r, (sec, rss_k, byt, c) in sorted(runs[(t, m)].items()):
            out.append(f"| {t} | {m} | {r} | {sec:.2f} | {c:.2f} | {rss_k / 1024:.0f} | {byt} |")
out.append("")
out.append("Plans and checks (plan output, each ptcfs run's own summary, correctness):\n")
out.append("```")
out.extend(l.rstrip("\n") for l in open(notes) if not l.startswith("source"))
out.append("```\n")
out.append("### Planner: 70B Llama, tp=8,pp=16,dp=8 (1024 ranks) -> tp=8,pp=12,dp=8, one core\n")
out.append("`taskset -c 0 plan_bench --reps 5 [--optimizer]` (bench/plan_70b.cc): a source manifest of every "
           "stored shard (bf16 parameters; with `--optimizer` also f32 exp_avg, exp_avg_sq and master copy) "
           "built from `TargetShardKeys` with made-up files, offsets and checksums, no tensor data; then "
           "`MakePlan` timed. 80 layers do not divide into 12 stages, so the target is "
           "`pp_layers=7+7+7+7+7+7+7+7+6+6+6+6`. 8 ranks per worker: 128 source workers, 96 target workers.\n")
rows = []
text = open(planlog).read()
for block in re.finditer(r"RESULT (.*)\n(?:.*\n)*?TIME ([\d.]+) (\d+)", text):
    kv = dict(x.split("=") for x in block.group(1).split())
    kv["wall"], kv["maxrss"] = block.group(2), block.group(3)
    rows.append(kv)
GiB = 1 << 30
out.append("| optimizer | source shards | target shards (kept) | copies | messages | plan median (min–max) s | plan CPU median s | total | moved | lower bound | bottleneck | peak RSS (MiB) |")
out.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
for kv in rows:
    g = lambda k: f"{int(kv[k]) / GiB:.1f} GiB"
    out.append(f"| {'adam' if kv['optimizer'] == '1' else 'none'} | {kv['source_shards']} | {kv['targets']} ({kv['kept']}) | "
               f"{kv['copies']} | {kv['messages']} | **{float(kv['median_s']):.3f}** ({float(kv['min_s']):.3f}–{float(kv['max_s']):.3f}) | "
               f"{float(kv['cpu_median_s']):.3f} | "
               f"{g('bytes_total')} | {g('bytes_moved')} | {g('lower_bound')} | {g('bottleneck')} | {int(kv['maxrss']) / 1024:.0f} |")
out.append("")
out.append("```")
out.extend(l for l in text.splitlines() if not l.startswith(("RESULT", "TIME")))
out.append("```")
out.append("<!-- transform:end -->")
section = "\n".join(out) + "\n"

old = open(results).read() if os.path.exists(results) else "# Benchmark results\n\n"
m = re.search(r"<!-- transform:begin -->.*?<!-- transform:end -->\n?", old, re.S)
new = old[:m.start()] + section + old[m.end():] if m else old.rstrip("\n") + "\n\n" + section
tmp = results + ".tmp"
open(tmp, "w").write(new)
os.replace(tmp, results)
print(section)
EOF

if [[ ${KEEP:-0} != 1 ]]; then rm -rf "$WORK"; fi
say "done; section written to $RESULTS"

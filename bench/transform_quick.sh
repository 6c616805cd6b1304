#!/usr/bin/env bash
# Quick check of `ptcfs transform` against `cp -r` of the same store, the targets of issue 3:
#   tp    tp=2,pp=2 -> tp=4,pp=1  every split tensor rewritten   (target: at most cp -r)
#   pp    tp=2,pp=2 -> tp=2,pp=1  pipeline only, shards referenced (target: at most cp -r / 10)
# against `cp -r STORE COPY` (page cache warm, not durable) and `cp -r ... && sync`.
# ROUNDS (3) rounds; in each, every command once, in an order that rotates from round to
# round, each after the same preparation (a fresh copy of the store, which ptcfs transforms)
# and `sync; sleep SETTLE` (8 s). ptcfs runs with --keep-old (the whole command timed: plan,
# read with checksum verification, write, syncfs, commit).
# Outputs are deleted only between rounds, followed by `sync; sleep PURGE_SETTLE` (60 s):
# ext4 skips inodes freed in the last minute (6 minutes while their inode table block is
# dirty) when it allocates new ones, so right after thousands of deletions every file
# creation scans (perf: recently_deleted, find_inode_bit), and cp and ptcfs (each creating
# ~500 files) measured up to 5x their usual CPU. Keeping every output instead fills the page
# cache, and the runs of later rounds were as noisy. Leave a few minutes between two runs.
# Prints every run (wall s, CPU s = user + sys, max RSS), then medians and ratios of medians.
# The full comparison (and the table in RESULTS.md) is bench/transform.sh.
#
# Environment: PTCFS (default build/tools/ptcfs), WORK (scratch, default /tmp/qb: 7 GB, 11 GB
# with BASELINE), ROUNDS (3), SETTLE (8), PURGE_SETTLE (60), BASELINE (another ptcfs binary,
# e.g. a build of the previous commit: its runs, "tp0" and "pp0", join every round, for a
# before/after under the same conditions).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${PTCFS:-$PWD/build/tools/ptcfs}
T=${WORK:-/tmp/qb}
ROUNDS=${ROUNDS:-3}
SETTLE=${SETTLE:-8}
D=layers=24,hidden=1024,heads=16,vocab=32768,seq=2048
rm -rf "$T"; mkdir -p "$T"
cp "$B" "$T/ptcfs"; B=$T/ptcfs  # a rebuild during the run must not swap the binary
methods=(cp cp+sync tp pp)
if [[ -n ${BASELINE:-} ]]; then
  cp "$BASELINE" "$T/ptcfs0"
  methods+=(tp0 pp0)
fi
PTCFS_PROGRESS=0 "$B" synth --schema megatron-gpt --dims $D --config tp=2,pp=2 "$T/a"
PTCFS_PROGRESS=0 "$B" import --schema megatron-gpt --dims $D --config tp=2,pp=2 "$T/a" "$T/s" >/dev/null
rm -rf "$T/a"
: > "$T/times"

run() {  # run NAME COMMAND...: prepare $R/x, settle, time
  local name=$1; shift
  cp -r "$T/s" "$R/x"; sync; sleep "$SETTLE"
  /usr/bin/time -f "$name %e %U %S %M" -a -o "$T/times" "$@" >/dev/null
}
for ((i = 0; i < ROUNDS; i++)); do
  if ((i > 0)); then
    rm -rf "$T"/run-*; sync; sleep "${PURGE_SETTLE:-60}"
  fi
  for ((k = 0; k < ${#methods[@]}; k++)); do
    m=${methods[$(((i + k) % ${#methods[@]}))]}
    R=$T/run-$i-$m; mkdir -p "$R"
    case $m in
      cp) run cp cp -r "$T/s" "$R/c" ;;
      cp+sync) run cp+sync sh -c "cp -r '$T/s' '$R/c' && sync" ;;
      tp) run tp "$B" transform "$R/x" --to tp=4,pp=1 --keep-old ;;
      pp) run pp "$B" transform "$R/x" --to tp=2,pp=1 --keep-old ;;
      tp0) run tp0 "$T/ptcfs0" transform "$R/x" --to tp=4,pp=1 --keep-old ;;
      pp0) run pp0 "$T/ptcfs0" transform "$R/x" --to tp=2,pp=1 --keep-old ;;
    esac
  done
done
python3 - "$T/times" <<'EOF'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, wall, user, system, rss = line.split()
    runs[name].append((float(wall), float(user) + float(system), int(rss) / 1024))
med = {}
print("%-8s %-24s %-24s %s" % ("", "wall s", "CPU s", "max RSS MiB"))
names = [n for n in ("cp", "cp+sync", "tp", "pp", "tp0", "pp0") if n in runs]
for name in names:
    r = runs[name]
    med[name] = statistics.median(w for w, _, _ in r)
    print("%-8s %-24s %-24s %.0f" % (name, " ".join("%.2f" % w for w, _, _ in r),
                                      " ".join("%.2f" % c for _, c, _ in r), max(m for _, _, m in r)))
print("medians: " + ", ".join("%s %.2f s" % (n, med[n]) for n in names))
for v in ("", "0"):
    if "tp" + v in med:
        print("tp%s / cp %.2f   tp%s / (cp+sync) %.2f   pp%s / cp %.3f" %
              (v, med["tp" + v] / med["cp"], v, med["tp" + v] / med["cp+sync"], v, med["pp" + v] / med["cp"]))
EOF
rm -rf "$T"/s "$T"/run-*

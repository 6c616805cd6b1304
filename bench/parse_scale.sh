#!/usr/bin/env bash
# Parsing against the number of keys and tensors (issue 24 item 5); writes its
# tables into bench/RESULTS.md between <!-- parse_scale:begin --> and
# <!-- parse_scale:end --> (nothing else in the file changes).
#
#   bench/parse_scale.sh [BUILD_DIR]        default BUILD_DIR: build
#
# 1. parse_scale_bench: ParseSafetensorsHeader, EncodeSafetensorsHeader and a
#    schema's expansion (ParseSchema, GlobalTensors, ModelLayout::View) at 10^3, 10^4
#    and 10^5 keys / tensors; median of 5 runs each.
# 2. `ptcfs synth` of a schema file with ten rules over 10^2..10^4 layers (one
#    rank, one-element tensors: the time is the expansion and the header, not
#    data); median of 5.
# PTCFS_BENCH_SIZES replaces the sizes (comma-separated, for a quick try);
# PARSE_SCALE_BENCH and PTCFS name prebuilt binaries (no ninja run).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
SIZES=${PTCFS_BENCH_SIZES:-1000,10000,100000}
RESULTS=$ROOT/bench/RESULTS.md
CMDLINE="bench/parse_scale.sh${*:+ $*}"
for v in PARSE_SCALE_BENCH PTCFS PTCFS_BENCH_SIZES; do
  [ -n "${!v:-}" ] && CMDLINE="$v='${!v}' $CMDLINE"
done

if [ -z "${PARSE_SCALE_BENCH:-}" ] || [ -z "${PTCFS:-}" ]; then
  ninja -C "$BUILD" ptcfs parse_scale_bench >/dev/null
fi
PARSE_SCALE_BENCH=${PARSE_SCALE_BENCH:-$BUILD/bench/parse_scale_bench}
PTCFS=${PTCFS:-$BUILD/tools/ptcfs}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

now() { date +%s.%N; }
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "parse_scale_bench --sizes $SIZES..." >&2
LOAD=$(cut -d' ' -f1 /proc/loadavg)  # a shared machine: the figures scale with it
BENCH_TABLE=$("$PARSE_SCALE_BENCH" --runs 5 --sizes "$SIZES")

# Ten rules over n/10 layers: n tensors, the layer count under its limit (ptc/model/limits.h).
rules=$(sep=""; for r in 0 1 2 3 4 5 6 7 8 9; do
  printf '%s{"name": "layers.{i}.w%d", "shape": [1], "pp": "layer"}' "$sep" "$r"; sep=", "; done)
echo "{\"name\": \"wide\", \"tensors\": [$rules]}" >"$TMP/schema.json"
CLI_TABLE=$(
  echo '| tensors (10 rules) | `ptcfs synth` |'
  echo '|---|---|'
  for n in ${SIZES//,/ }; do
    echo "ptcfs synth, $n layers..." >&2
    MODEL="--schema $TMP/schema.json --dims layers=$((n / 10)),hidden=8,heads=1,vocab=8,seq=8 --config tp=1,pp=1,dp=1"
    synth=()
    for _ in 1 2 3 4 5; do
      rm -rf "$TMP/ckpt"
      t0=$(now)
      # shellcheck disable=SC2086
      "$PTCFS" synth $MODEL "$TMP/ckpt" >/dev/null 2>&1
      synth+=("$(awk -v a="$t0" -v b="$(now)" 'BEGIN {print b - a}')")
    done
    s=$(printf '%s\n' "${synth[@]}" | median)
    awk -v n="$n" -v s="$s" 'BEGIN {printf "| %d | %.2f s |\n", n, s}'
  done
)

SECTION=$(cat <<MD
## Parsing at scale (issue 24)

Produced by \`$CMDLINE\` on $(date -u +%Y-%m-%d) ($(nproc) cores, $(uname -m), load average $LOAD
at the start: other builds shared the cores, so the times are upper bounds).

Header parse, header encode and schema expansion, in process (\`bench/parse_scale.cc\`), one
core, median of 5 runs. The header holds n tensors of one F32 element each
(\`"model.layers.i.w": {"dtype", "shape", "data_offsets"}\`); the schema is ten rules
\`layers.{i}.w0\` ... \`layers.{i}.w9\` over n/10 layers, expanded for the one rank of tp=1,pp=1,dp=1.

$BENCH_TABLE

The same schema through the tool: \`ptcfs synth\` (schema parse and expansion, header encode, the
writer's own parse of its header, 4 bytes of data per tensor), the whole process, median of 5.

$CLI_TABLE

Before (ptcfs at 78610e7): nlohmann's parser callback, which made the duplicate-key check, scans
the enclosing object for a discarded value at the end of every object, so a header's parse was
quadratic in its tensors; the callback alone, copied into a standalone program, took 0.65 s for
5,000 keys, 4.4 s for 10,000 and 60 s for 20,000 (issue 24: 67 s to refuse 50,000). The encoder
(an \`ordered_json\` object, a linear search per key) and \`Schema::Find\`, \`StoredShards\`,
\`SafetensorsHeader::Find\`, \`pickle::Value::Find\` and \`FindTensor\` in loops were quadratic too.
MD
)

python3 - "$RESULTS" "$SECTION" <<'PY'
import sys
sys.path.insert(0, sys.argv[1].rsplit("/", 1)[0])
from results_section import write_section
print(write_section(sys.argv[1], "parse_scale", sys.argv[2]))
PY

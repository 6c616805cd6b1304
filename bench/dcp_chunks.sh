#!/usr/bin/env bash
# The DCP chunk check at 10^3..10^5 chunks of one tensor (issue 41 item 6), beside the pairwise
# check it replaced; writes its table into bench/RESULTS.md between <!-- dcp_chunks:begin --> and
# <!-- dcp_chunks:end --> (nothing else in the file changes).
#
#   bench/dcp_chunks.sh [BUILD_DIR]        default BUILD_DIR: build
#
# PTCFS_BENCH_SIZES replaces the sizes (comma-separated); DCP_CHUNKS_BENCH names a prebuilt binary.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
SIZES=${PTCFS_BENCH_SIZES:-1000,10000,32768,100000}
RESULTS=$ROOT/bench/RESULTS.md
CMDLINE="bench/dcp_chunks.sh${*:+ $*}"
[ -n "${PTCFS_BENCH_SIZES:-}" ] && CMDLINE="PTCFS_BENCH_SIZES='$PTCFS_BENCH_SIZES' $CMDLINE"
if [ -z "${DCP_CHUNKS_BENCH:-}" ]; then
  ninja -C "$BUILD" dcp_chunks_bench >/dev/null
fi
BENCH=${DCP_CHUNKS_BENCH:-$BUILD/bench/dcp_chunks_bench}
LOAD=$(cut -d' ' -f1 /proc/loadavg)
echo "dcp_chunks_bench --sizes $SIZES..." >&2
TABLE=$("$BENCH" --runs 5 --sizes "$SIZES" --pairwise-max 32768)

SECTION=$(cat <<MD
## DCP chunk check (issue 41)

Produced by \`$CMDLINE\` on $(date -u +%Y-%m-%d) ($(nproc) cores, $(uname -m), load average $LOAD
at the start).

\`ptc::dcp::CheckChunksDisjoint\` (every import and every save through \`dcp/\` runs it on each key)
in process (\`bench/dcp_chunks.cc\`), one core, median of 5 runs, against the pairwise check it
replaced (every chunk against every earlier one, one run; "-": not run, quadratic). Layouts of one
tensor: n row blocks, n column blocks, a square grid, and one whole chunk beside n - 1 empty ones
(empty chunks store nothing since issue 41). The check sweeps the dimensions, the one where the
chunks' starts differ most first: sorted there, a band of chunks with one interval is checked
along the next dimension, and chunks of other intervals are compared only where they meet.

$TABLE
MD
)

python3 - "$RESULTS" "$SECTION" <<'PY'
import sys
sys.path.insert(0, sys.argv[1].rsplit("/", 1)[0])
from results_section import write_section
print(write_section(sys.argv[1], "dcp_chunks", sys.argv[2]))
PY

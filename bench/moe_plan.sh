#!/usr/bin/env bash
# Plans of mixture-of-experts jobs at the size of the real ones (issue 40 item 4),
# from their dims alone (`ptcfs plan --from`: no store, no tensor data); writes its
# table into bench/RESULTS.md between <!-- moe_plan:begin --> and <!-- moe_plan:end -->.
#
#   bench/moe_plan.sh [BUILD_DIR]        default BUILD_DIR: build
#
# For each model (DeepSeek-V3-sized, Kimi-K2-sized; bf16 parameters, Adam state in
# f32, ZeRO-1) one plan between two layouts, whole process under /usr/bin/time -v
# (wall time, peak RSS), median of 3 runs; then once with --manifest-size for the
# size of the source generation's manifest (not timed: encoding it is not planning).
# PTCFS names a prebuilt binary (no ninja run).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${1:-$ROOT/build}
RESULTS=$ROOT/bench/RESULTS.md
CMDLINE="bench/moe_plan.sh${*:+ $*}"
[ -n "${PTCFS:-}" ] && CMDLINE="PTCFS='$PTCFS' $CMDLINE"
[ -n "${PTCFS:-}" ] || ninja -C "$BUILD" ptcfs >/dev/null
PTCFS=${PTCFS:-$BUILD/tools/ptcfs}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# Both models' attention is multi-head latent attention (MLA), as their configs give it:
# q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128.
DSV3="layers=61,hidden=7168,heads=128,vocab=129280,seq=4096,ffn=18432,q_lora=1536,kv_lora=512,qk_nope=128,qk_rope=64,v_head=128,experts=256,moe_ffn=2048,shared_ffn=2048,dense_first=3"
KIMI="layers=61,hidden=7168,heads=64,vocab=163840,seq=4096,ffn=18432,q_lora=1536,kv_lora=512,qk_nope=128,qk_rope=64,v_head=128,experts=384,moe_ffn=2048,shared_ffn=2048,dense_first=1"
# DeepSeek-V3's training layout (2048 ranks: pp=16, ep=64, ZeRO-1 over dp=128), shrunk to
# half the nodes (1024 ranks: pp=8, ep=32); Kimi-K2 likewise from ep=64 (edp 2) to ep=32.
DSV3_FROM="tp=1,pp=16,dp=128,ep=64,zero=1,pp_layers=3+4+4+4+4+4+4+4+4+4+4+4+4+4+3+3,per_worker=8"
DSV3_TO="tp=1,pp=8,dp=128,ep=32,zero=1,pp_layers=7+8+8+8+8+8+7+7,per_worker=8"
KIMI_FROM="tp=1,pp=16,dp=128,ep=64,zero=1,pp_layers=3+4+4+4+4+4+4+4+4+4+4+4+4+4+3+3,per_worker=8"
KIMI_TO="tp=1,pp=8,dp=128,ep=32,zero=1,pp_layers=7+8+8+8+8+8+7+7,per_worker=8"

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
LOAD=$(cut -d' ' -f1 /proc/loadavg)

run() {  # name dims from to -> a table row
  local name=$1 dims=$2 from=$3 to=$4 times=() cpu=() rss=() i
  local args=(plan --from "$from" --to "$to" --schema llama --dims "$dims" --optimizer adam --dtype bf16 --json)
  for i in 1 2 3; do
    /usr/bin/time -v "$PTCFS" "${args[@]}" >"$TMP/plan.json" 2>"$TMP/time.txt"
    times+=("$(awk -F': ' '/Elapsed \(wall clock\)/ {n = split($2, p, ":"); s = 0; for (k = 1; k <= n; k++) s = s * 60 + p[k]; print s}' "$TMP/time.txt")")
    cpu+=("$(awk -F': ' '/User time|System time/ {s += $2} END {print s}' "$TMP/time.txt")")
    rss+=("$(awk -F': ' '/Maximum resident set size/ {print $2}' "$TMP/time.txt")")
  done
  "$PTCFS" "${args[@]}" --manifest-size >"$TMP/size.json"
  python3 - "$name" "$TMP/plan.json" "$TMP/size.json" "$(printf '%s\n' "${times[@]}" | median)" \
    "$(printf '%s\n' "${rss[@]}" | sort -g | tail -1)" "$(printf '%s\n' "${cpu[@]}" | median)" <<'PY'
import json, sys
name, plan, size, secs, rss, cpu = (sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3])), sys.argv[4],
                                    int(sys.argv[5]), float(sys.argv[6]))
gib = lambda n: "%.1f GiB" % (n / 2**30)
src = size["source"]
etcd = src["etcd"]
print("| %s | %d | %d | %d | %s | %s | %s | %s | **%.2f s** | %.2f s | **%d MiB** | %.1f MiB | %.1f MiB | %.2f MiB (%d workers) | **%.2f MiB** (%d chunks) |" % (
    name, plan["source"]["tensors"], plan["source"]["shards"], plan["target_shards"], gib(plan["bytes_total"]),
    gib(plan["bytes_moved"]), gib(plan["lower_bound"]), gib(plan["bottleneck"]), float(secs), cpu, rss // 1024,
    src["manifest_bytes"] / 2**20, src["dcp_metadata_bytes"] / 2**20, etcd["largest_part_bytes"] / 2**20,
    etcd["parts"], etcd["largest_value_bytes"] / 2**20, etcd["part_chunks"]))
PY
}

echo "DeepSeek-V3-sized..." >&2
ROW_DSV3=$(run "DeepSeek-V3 (671B)" "$DSV3" "$DSV3_FROM" "$DSV3_TO")
echo "Kimi-K2-sized..." >&2
ROW_KIMI=$(run "Kimi-K2 (1.04T)" "$KIMI" "$KIMI_FROM" "$KIMI_TO")

SECTION=$(cat <<MD
## Plans of mixture-of-experts jobs (issue 40)

Produced by \`$CMDLINE\` on $(date -u +%Y-%m-%d) at $(git -C "$ROOT" rev-parse --short HEAD) ($(nproc) cores,
$(uname -m), load average $LOAD at the start: other builds shared the cores, so the times are upper
bounds). Each plan is the whole \`ptcfs plan --from FROM --to TO --schema llama --dims DIMS --optimizer adam
--dtype bf16 --json\` process (\`/usr/bin/time -v\`: wall time and CPU time, medians of 3, and the largest peak RSS): the
source generation built from the dims (every worker's stored shards, made-up files and checksums, no
tensor data; \`transform/layout_manifest.h\`), then the plan and its covering. Manifest, DCP
.metadata and etcd values (\`--manifest-size\`, a run of its own): the source generation manifest
encoded, the size a real store of that layout would write per generation; the \`.metadata\` of its
\`dcp/\` (torch's keys); a change's values in etcd (docs/cluster.md): the largest worker's part (its
records) before it is cut, and the largest value written after (parts over 1 MiB go in chunks of
1 MiB; the change and committed records are a few hundred bytes).

Models (bf16 parameters; Adam: f32 exp_avg, exp_avg_sq and master copy; ZeRO-1):

- DeepSeek-V3-sized: \`$DSV3\`: 61 layers, the first 3 dense (ffn 18432), 58 MoE layers of 256 routed
  experts (moe_ffn 2048) + 1 shared, vocab 129280: 671.0 B parameters (DeepSeek-V3's 671 B without its MTP module).
- Kimi-K2-sized: \`$KIMI\`: 61 layers, the first dense, 60 MoE layers of 384 experts + 1 shared,
  vocab 163840: 1.03 T parameters.

Both models' attention is multi-head latent attention, the llama schema's MLA rules (dims \`q_lora\`,
\`kv_lora\`, \`qk_nope\`, \`qk_rope\`, \`v_head\`; Megatron-Core's names): per layer \`input_layernorm\`,
\`linear_proj\` \`[7168, heads*128]\`, \`linear_q_down_proj\` \`[1536, 7168]\`, \`linear_q_up_proj\`
\`[heads*192, 1536]\` and its norm, \`linear_kv_down_proj\` \`[576, 7168]\`, \`linear_kv_up_proj\` \`[heads*256, 512]\`
and its norm: 8 tensors where llama's attention has 3. The point is still the expert count: 29,696
(DeepSeek-V3) and 46,080 (Kimi-K2) expert matrices, each with its Adam state.

Layouts: from DeepSeek-V3's training layout, 2048 ranks \`$DSV3_FROM\` (expert grid: ep=64, edp=2),
to half the nodes, 1024 ranks \`$DSV3_TO\` (ep=32, edp=4); Kimi-K2 the same pair.

| model | tensors | source shards | target shards | bytes total | moved | lower bound | bottleneck | wall | CPU (user+sys) | peak RSS | manifest | DCP .metadata | largest worker part | largest etcd value |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
$ROW_DSV3
$ROW_KIMI

Moved equals the lower bound (every byte moved has no replica on its new worker): with pp 16 -> 8
and ep 64 -> 32 nearly every expert changes worker. The issue's goal is <= 2 s and <= 1 GiB RSS,
and every etcd value <= 1 MiB. On a shared machine wall time waits for the other tenants; the CPU
column is the time the plan itself takes (a quiet machine's wall time: the plan reads no file).
Before (at 1f380b3): 3.01 s / 4.60 s CPU, 445 / 670 MiB. What changed (perf): glibc's malloc, free
and malloc_consolidate took 40% of the CPU (the ptcfs executable now links jemalloc), the planner's
ordered maps of tensor names (now one hash lookup per target, tensors numbered once), the per-worker
dedupe of stored-shard keys (now an open-addressing set) and the views of every rank kept (a ZeRO-1
layout's each rank's own: no longer kept). The plan's JSON is byte-identical.
MD
)

python3 - "$RESULTS" "$SECTION" <<'PY'
import sys
sys.path.insert(0, sys.argv[1].rsplit("/", 1)[0])
from results_section import write_section
print(write_section(sys.argv[1], "moe_plan", sys.argv[2]))
PY

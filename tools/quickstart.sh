#!/usr/bin/env bash
# The main job, end to end, on a small synthetic model:
#   synthesise a Llama checkpoint saved by tp=2,pp=2 ranks (bf16, Adam state),
#   import it into a store, mount it, reconfigure the running mount to
#   tp=4,pp=1 and time it against rewriting the checkpoint in the new layout
#   (`ptcfs export` + sync), read the new files back with numpy and compare
#   them bit for bit with a reference, load Megatron-LM's view of the new
#   layout with torch 2 (weights_only, Adam) and a rank file with
#   safetensors.safe_open (the venv tools/setup-deps.sh makes), verify, unmount.
# Prints one line per step; every command and its output go to the log it names.
# The Python clients download (network) while ptcfs builds (CPU), and the
# quickstart's venv holds only what its job imports (torch, safetensors, numpy).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
work="${PTCFS_QUICKSTART_DIR:-$(mktemp -d /tmp/ptcfs-quickstart.XXXXXX)}"
mkdir -p "$work"
log="$work/quickstart.log"
: >"$log"
mnt="$work/mnt"
trap 'fusermount3 -u "$mnt" 2>/dev/null || true' EXIT

# run WHAT CMD...: CMD's output into the log; on failure the log's end and exit.
run() {
  local what="$1"
  shift
  printf '+ %s\n' "$*" >>"$log"
  if ! "$@" >>"$log" 2>&1; then
    echo "quickstart FAILED at: $what (the end of $log:)" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
}
say() { printf '%-34s %s\n' "$1" "$2"; }
elapsed() { printf '%d:%02d' $(((SECONDS - $1) / 60)) $(((SECONDS - $1) % 60)); }

t=$SECONDS
run "Debian packages" env PTCFS_NO_VENV=1 PTCFS_PACKAGES=build bash tools/setup-deps.sh  # no test servers
say "Debian packages" "ready ($(elapsed $t))"
t=$SECONDS
PTCFS_VENV_ONLY=1 PTCFS_VENV_SET=quickstart bash tools/setup-deps.sh >"$work/venv.log" 2>&1 &
venv_pid=$!
run "build" bash tools/build.sh release ptcfs # the job needs the tool alone, not the test suites
say "build of ptcfs" "done ($(elapsed $t))"
if ! wait "$venv_pid"; then
  echo "quickstart FAILED at: the Python clients (the end of $work/venv.log:)" >&2
  tail -n 30 "$work/venv.log" >&2
  exit 1
fi
cat "$work/venv.log" >>"$log"
say "Python clients (.venv)" "ready ($(elapsed $t) with the build)"

ptcfs=build/tools/ptcfs
dims=layers=4,hidden=512,heads=8,kv_heads=4,vocab=32000,seq=512
mkdir -p "$mnt"
run "synth" $ptcfs synth --schema llama --dims $dims --config tp=2,pp=2 --dtype bf16 --optimizer adam "$work/saved-tp2pp2"
run "import" $ptcfs import --schema llama --dims $dims --config tp=2,pp=2 "$work/saved-tp2pp2" "$work/store"
say "checkpoint" "Llama $dims, bf16 + Adam, saved by tp=2,pp=2: $(du -sh "$work/saved-tp2pp2" | cut -f1), imported"
run "mount" $ptcfs mount --format all "$work/store" "$mnt"
run "list" ls -l "$mnt" "$mnt/model" "$mnt/model/rank-00003" "$mnt/megatron/iter_0000000"
run "status" cat "$mnt/.ptcfs/status"
run "a rendered file equals the saved one" \
  cmp "$mnt/model/rank-00003/model.safetensors" "$work/saved-tp2pp2/rank-00003/model.safetensors"
say "mounted" "$mnt: model/ (4 ranks), megatron/, dcp/, hf/, .ptcfs/"

# The point: a running job's layout changes without rewriting its checkpoint.
run "plan" $ptcfs plan "$work/store" --to tp=4,pp=1 --json
written=$(sed -n 's/.*"bytes_to_write": \([0-9]*\).*/\1/p' "$log" | tail -1)
total=$(sed -n 's/.*"bytes_total": \([0-9]*\).*/\1/p' "$log" | tail -1)
sync
t0=$(date +%s.%N)
run "reconfigure" env PTCFS_PROGRESS=0 $ptcfs reconfigure "$mnt" --to tp=4,pp=1
t1=$(date +%s.%N)
run "rewrite the checkpoint" $ptcfs export --config tp=4,pp=1 "$work/store" "$work/rewritten-tp4"
sync
t2=$(date +%s.%N)
say "reconfigure tp=2,pp=2 -> tp=4,pp=1" "$(awk -v a="$t0" -v b="$t1" -v c="$t2" -v w="$written" -v n="$total" 'BEGIN {
  printf "%.2f s, %d of %d tensor bytes written (the new layout references the stored pieces); rewriting the checkpoint in it (ptcfs export + sync): %.2f s",
         b - a, w, n, c - b }')"

run "list the new layout" ls "$mnt/model"
run "reference" $ptcfs synth --schema llama --dims $dims --config tp=4,pp=1 --dtype bf16 --optimizer adam "$work/reference-tp4"
run "numpy: bit for bit" .venv/bin/python tests/clients/compare_tensors.py "$mnt/model" "$work/reference-tp4"
say "numpy" "every tensor of the 4 new ranks equals a tp=4 reference, bit for bit"
run "numpy: a shard" .venv/bin/python - "$mnt/model" <<'PY'
import json, pathlib, sys
import numpy as np
t = pathlib.Path(sys.argv[1]) / "rank-00003" / "tensors"
dtypes = json.loads((t / "dtypes.json").read_text())
fc1 = np.load(t / "decoder.layers.0.mlp.linear_fc1.weight.npy")
print(f"rank 3 of tp=4 holds {len(dtypes)} tensors; its [gate; up] fc1 shard is {fc1.shape}, "
      f"{dtypes['decoder.layers.0.mlp.linear_fc1.weight.npy']} stored as numpy {fc1.dtype}")
PY
run "torch and safetensors" .venv/bin/python - "$mnt" "$work/clients.txt" <<'PY'
import sys, torch
from safetensors import safe_open
lines = []
# torch 2 (tools/requirements-quickstart.txt): torch.load's default is weights_only=True.
sd = torch.load(f"{sys.argv[1]}/megatron/iter_0000000/mp_rank_03/model_optim_rng.pt")
w = sd["model"]["decoder.layers.0.mlp.linear_fc1.weight"]
opt = sd["optimizer"]["optimizer"]
lines.append(f"torch {torch.__version__} weights_only load of Megatron's tp rank 3 file: {len(sd['model'])} tensors, "
             f"Adam state of {len(opt['state'])} parameters in Megatron's {len(opt['param_groups'])} groups")
# Megatron's optimizer over the rank's parameters (fp32 masters, biases and 1-D ones without weight decay).
params = [torch.nn.Parameter(t.float()) for t in sd["model"].values()]
no_wd = [len(p.shape) == 1 or n.endswith(".bias") for n, p in zip(sd["model"], params)]
adam = torch.optim.Adam([{"params": [p for p, n in zip(params, no_wd) if not n]},
                         {"params": [p for p, n in zip(params, no_wd) if n]}])
adam.load_state_dict(opt)
lines.append(f"torch.optim.Adam.load_state_dict: step {adam.state[params[0]]['step'].item()}, "
             f"lr {adam.param_groups[0]['lr']}")
with safe_open(f"{sys.argv[1]}/model/rank-00003/model.safetensors", framework="pt") as f:
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    t = f.get_tensor(name)
    assert torch.equal(t, w), "safetensors and Megatron files differ"
    lines.append(f"safetensors.safe_open of rank 3's model.safetensors: {len(list(f.keys()))} tensors, "
                 f"{name} {tuple(t.shape)} {t.dtype}, equal to the Megatron file's")
print("\n".join(lines))
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
PY
while IFS= read -r line; do say "frameworks" "$line"; done <"$work/clients.txt"
run "verify" $ptcfs verify "$work/store"
say "verify" "every stored block's checksum holds"
run "umount" $ptcfs umount "$mnt"
trap - EXIT
echo "quickstart OK in $(elapsed $start): files in $work, the full log in $log"

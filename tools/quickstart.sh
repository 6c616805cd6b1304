#!/usr/bin/env bash
# The main job, end to end, on a small synthetic model:
#   synthesise a Llama checkpoint saved by tp=2,pp=2 ranks (bf16, Adam state),
#   import it into a store, verify it, re-partition it for tp=4,dp=2 with ZeRO-1,
#   read it back with numpy, and prove it equals the reference bit for bit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-deps.sh
bash tools/build.sh release >/dev/null
ptcfs=build/tools/ptcfs
work="${PTCFS_QUICKSTART_DIR:-$(mktemp -d /tmp/ptcfs-quickstart.XXXXXX)}"
dims=layers=4,hidden=128,heads=8,kv_heads=4,vocab=1024,seq=256
set -x
$ptcfs synth --schema llama --dims $dims --config tp=2,pp=2 --dtype bf16 --optimizer adam "$work/saved-tp2pp2"
$ptcfs import --schema llama --dims $dims --config tp=2,pp=2 "$work/saved-tp2pp2" "$work/store"
$ptcfs inspect "$work/store"
$ptcfs verify "$work/store"
$ptcfs export --config tp=4,pp=1,dp=2,zero=1 "$work/store" "$work/load-tp4dp2"
$ptcfs export --config tp=4,pp=1,dp=2,zero=1 --format npy "$work/store" "$work/load-npy"
$ptcfs diff --schema llama --dims $dims --config-a tp=2,pp=2 --config-b tp=4,pp=1,dp=2,zero=1 \
  "$work/saved-tp2pp2" "$work/load-tp4dp2"
/usr/bin/python3 - "$work/load-npy" <<'PY'
import json, pathlib, sys
import numpy as np
root = pathlib.Path(sys.argv[1])
t = root / "rank-00003" / "tensors"
dtypes = json.loads((t / "dtypes.json").read_text())
fc1 = np.load(t / "decoder.layers.0.mlp.linear_fc1.weight.npy")
opt = np.load(t / "optimizer.exp_avg.npy")
print(f"rank 3 holds {len(dtypes)} tensors; fc1 {fc1.shape} stored as {dtypes['decoder.layers.0.mlp.linear_fc1.weight.npy']};"
      f" ZeRO-1 exp_avg piece {opt.shape} {opt.dtype}")
PY
set +x
echo "quickstart OK: files in $work"

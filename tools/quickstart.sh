#!/usr/bin/env bash
# The main job, end to end, on a small synthetic model:
#   synthesise a Llama checkpoint saved by tp=2,pp=2 ranks (bf16, Adam state),
#   import it into a store, mount it, list a rank's files, reconfigure the
#   running mount to tp=4,pp=1 (progress shown), read the new files back with
#   numpy and compare them bit for bit with a reference, load Megatron-LM's
#   view of the new layout with torch 2 (weights_only, Adam) and a rank file
#   with safetensors.safe_open (the venv tools/setup-deps.sh makes), verify, unmount.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup-deps.sh
bash tools/build.sh release ptcfs >/dev/null  # the job needs the tool alone, not the test suites
ptcfs=build/tools/ptcfs
work="${PTCFS_QUICKSTART_DIR:-$(mktemp -d /tmp/ptcfs-quickstart.XXXXXX)}"
mnt="$work/mnt"
dims=layers=4,hidden=128,heads=8,kv_heads=4,vocab=1024,seq=256
mkdir -p "$mnt"
trap 'fusermount3 -u "$mnt" 2>/dev/null || true' EXIT
set -x
$ptcfs synth --schema llama --dims $dims --config tp=2,pp=2 --dtype bf16 --optimizer adam "$work/saved-tp2pp2"
$ptcfs import --schema llama --dims $dims --config tp=2,pp=2 "$work/saved-tp2pp2" "$work/store"
$ptcfs mount --format all "$work/store" "$mnt"
ls -l "$mnt/model" "$mnt/model/rank-00003"
cat "$mnt/.ptcfs/status"
cmp "$mnt/model/rank-00003/model.safetensors" "$work/saved-tp2pp2/rank-00003/model.safetensors"
PTCFS_PROGRESS=1 $ptcfs reconfigure "$mnt" --to tp=4,pp=1
ls "$mnt/model"
$ptcfs synth --schema llama --dims $dims --config tp=4,pp=1 --dtype bf16 --optimizer adam "$work/reference-tp4"
/usr/bin/python3 tests/clients/compare_tensors.py "$mnt/model" "$work/reference-tp4"
/usr/bin/python3 - "$mnt/model" <<'PY'
import json, pathlib, sys
import numpy as np
t = pathlib.Path(sys.argv[1]) / "rank-00003" / "tensors"
dtypes = json.loads((t / "dtypes.json").read_text())
fc1 = np.load(t / "decoder.layers.0.mlp.linear_fc1.weight.npy")
print(f"rank 3 of tp=4 holds {len(dtypes)} tensors; its [gate; up] fc1 shard is {fc1.shape}, "
      f"{dtypes['decoder.layers.0.mlp.linear_fc1.weight.npy']} stored as numpy {fc1.dtype}")
PY
.venv/bin/python - "$mnt" <<'PY'
import sys, torch
from safetensors import safe_open
# torch 2 (tools/requirements-clients.txt): torch.load's default is weights_only=True.
sd = torch.load(f"{sys.argv[1]}/megatron/iter_0000000/mp_rank_03/model_optim_rng.pt")
w = sd["model"]["decoder.layers.0.mlp.linear_fc1.weight"]
opt = sd["optimizer"]["optimizer"]
print(f"torch {torch.__version__}, weights_only load of Megatron's tp rank 3 file: {len(sd['model'])} tensors, "
      f"fc1 {tuple(w.shape)} {w.dtype}; Adam state of {len(opt['state'])} parameters in Megatron's "
      f"{len(opt['param_groups'])} groups ({[len(g['params']) for g in opt['param_groups']]} parameters)")
# Megatron's optimizer over the rank's parameters (fp32 masters, biases and 1-D ones without weight decay).
params = [torch.nn.Parameter(t.float()) for t in sd["model"].values()]
no_wd = [len(p.shape) == 1 or n.endswith(".bias") for n, p in zip(sd["model"], params)]
adam = torch.optim.Adam([{"params": [p for p, n in zip(params, no_wd) if not n]},
                         {"params": [p for p, n in zip(params, no_wd) if n]}])
adam.load_state_dict(opt)
print(f"torch.optim.Adam.load_state_dict: step {adam.state[params[0]]['step'].item()}, lr {adam.param_groups[0]['lr']}")
with safe_open(f"{sys.argv[1]}/model/rank-00003/model.safetensors", framework="pt") as f:
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    t = f.get_tensor(name)
    print(f"safetensors.safe_open of rank 3's model.safetensors: {len(list(f.keys()))} tensors, {name} "
          f"{tuple(t.shape)} {t.dtype}, equal to the Megatron file's: {torch.equal(t, w)}")
PY
$ptcfs verify "$work/store"
$ptcfs umount "$mnt"
set +x
trap - EXIT
echo "quickstart OK: files in $work"

#!/usr/bin/env python3
"""Megatron-LM (legacy GPTModel) checkpoints made and checked with real torch,
independently of ptcfs: the test suite's reference for `--format megatron`.

  make DIR --tp T --pp P [--iteration N] [--args] [--optimizer] [--dtype bf16|f16|f32] [--seed S]
      torch.save random tensors in Megatron's layout: DIR/latest_checkpointed_iteration.txt,
      DIR/iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt. With --args, an argparse
      Namespace in 'args' and numpy/torch rng state in 'rng_state' (each rank's own).
  save MOUNT/megatron MIRROR --iteration N [--skip mp_rank_TT_PPP] [--consumed SAMPLES] [--state-iteration M]
      A framework's checkpoint through the mount (see save()); --consumed sets
      args.consumed_train_samples, --state-iteration the state dict's 'iteration'.
  check SRC TP PP OUT TP2 PP2 [--weights-only]
      The reference reshard: every tensor of the SRC tree (tp=TP, pp=PP) is concatenated
      along its split dim (and its layers renumbered), re-split for TP2/PP2, and compared bit
      for bit with the files of the OUT tree, which torch.load reads (weights_only when
      asked). Non-tensor entries must be kept, args' parallel sizes rewritten.

Model: megatron-gpt layers=4, hidden=32, heads=4, vocab=128, seq=16 (ffn 128).
Exit 0 and "CHECK OK <files>" when everything matches; 3 when torch is missing.
"""
import argparse
import os
import random
import sys

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"{e}: install python3-torch and python3-numpy")
    sys.exit(3)

LAYERS, HIDDEN, HEADS, VOCAB, SEQ = 4, 32, 4, 128, 16
FFN = 4 * HIDDEN
# Per layer: local name -> (shape, split dim or None). qkv rows hold each head's
# q, k, v together, so the split by heads is a split of dim 0 into tp blocks.
LAYER = {
    "input_layernorm.weight": ((HIDDEN,), None),
    "input_layernorm.bias": ((HIDDEN,), None),
    "self_attention.query_key_value.weight": ((3 * HIDDEN, HIDDEN), 0),
    "self_attention.query_key_value.bias": ((3 * HIDDEN,), 0),
    "self_attention.dense.weight": ((HIDDEN, HIDDEN), 1),
    "self_attention.dense.bias": ((HIDDEN,), None),
    "post_attention_layernorm.weight": ((HIDDEN,), None),
    "post_attention_layernorm.bias": ((HIDDEN,), None),
    "mlp.dense_h_to_4h.weight": ((FFN, HIDDEN), 0),
    "mlp.dense_h_to_4h.bias": ((FFN,), 0),
    "mlp.dense_4h_to_h.weight": ((HIDDEN, FFN), 1),
    "mlp.dense_4h_to_h.bias": ((HIDDEN,), None),
}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def rank_dir(tp_rank, pp_rank, pp):
    return f"mp_rank_{tp_rank:02d}" if pp == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"


def global_model(dtype, seed):
    """Global tensors by global key: ('emb'|'pos'|'final.X'|'layer', i, name)."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=g).to(dtype)
    t = {("emb",): rand(VOCAB, HIDDEN), ("pos",): rand(SEQ, HIDDEN)}
    for i in range(LAYERS):
        for name, (shape, _) in LAYER.items():
            t[("layer", i, name)] = rand(*shape)
    t[("final", "weight")] = rand(HIDDEN)
    t[("final", "bias")] = rand(HIDDEN)
    return t


def split(x, dim, tp, r):
    return x if dim is None else torch.chunk(x, tp, dim=dim)[r].contiguous()


def rank_model(glob, tp, pp, tp_rank, pp_rank):
    """The 'model' state dict of one rank, nested as Megatron nests it."""
    per = LAYERS // pp
    lm = {}
    if pp_rank == 0:
        lm["embedding"] = {"word_embeddings": {"weight": split(glob[("emb",)], 0, tp, tp_rank)},
                           "position_embeddings": {"weight": glob[("pos",)].clone()}}
    enc = {}
    for local in range(per):
        for name, (_, dim) in LAYER.items():
            enc[f"layers.{local}.{name}"] = split(glob[("layer", pp_rank * per + local, name)], dim, tp, tp_rank)
    if pp_rank == pp - 1:
        enc["final_layernorm.weight"] = glob[("final", "weight")].clone()
        enc["final_layernorm.bias"] = glob[("final", "bias")].clone()
    lm["encoder"] = enc
    model = {"language_model": lm}
    if pp > 1 and pp_rank == pp - 1:
        model["word_embeddings_for_head"] = {"weight": split(glob[("emb",)], 0, tp, tp_rank)}
    return model


def tensors_depth_first(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from tensors_depth_first(v, prefix + k + "/")
        else:
            yield prefix + k, v


def with_values(model, values):
    """`model`'s nesting with its tensors replaced, in depth-first order, by `values`."""
    values = iter(values)
    def walk(d):
        return {k: walk(v) if isinstance(v, dict) else next(values) for k, v in d.items()}
    return walk(model)


KINDS = ("exp_avg", "exp_avg_sq", "fp32")


def global_optimizer(glob, seed):
    """Adam state per global tensor: the reference splits it like the tensor."""
    g = torch.Generator().manual_seed(seed)
    return {"exp_avg": {k: torch.randn(v.shape, generator=g) for k, v in glob.items()},
            "exp_avg_sq": {k: torch.rand(v.shape, generator=g) for k, v in glob.items()},
            "fp32": {k: v.float() for k, v in glob.items()}}


def rank_optimizer(gopt, tp, pp, tp_rank, pp_rank):
    """Adam state in the layout ptcfs renders: state[i] and fp32 masters by the
    parameter's position in the depth-first order of the model's tensors."""
    parts = {k: [v for _, v in tensors_depth_first(rank_model(gopt[k], tp, pp, tp_rank, pp_rank))] for k in KINDS}
    n = len(parts["fp32"])
    return {"optimizer": {"state": {i: {"exp_avg": parts["exp_avg"][i], "exp_avg_sq": parts["exp_avg_sq"][i]}
                                    for i in range(n)},
                          "param_groups": [{"params": list(range(n))}]},
            "fp32_from_fp16_params": [parts["fp32"]]}


def optimizer_as_models(files):
    """Each rank's optimizer state as model-shaped dicts per kind (to gather like parameters)."""
    out = {k: {} for k in KINDS}
    for key, f in files.items():
        n = len(list(tensors_depth_first(f["model"])))
        state = f["optimizer"]["optimizer"]["state"]
        out["exp_avg"][key] = {"model": with_values(f["model"], [state[i]["exp_avg"] for i in range(n)])}
        out["exp_avg_sq"][key] = {"model": with_values(f["model"], [state[i]["exp_avg_sq"] for i in range(n)])}
        out["fp32"][key] = {"model": with_values(f["model"], f["optimizer"]["fp32_from_fp16_params"][0])}
    return out


def make(a):
    dtype = DTYPES[a.dtype]
    glob = global_model(dtype, a.seed)
    gopt = global_optimizer(glob, 1000 + a.seed)
    it_dir = os.path.join(a.dir, f"iter_{a.iteration:07d}")
    for pp_rank in range(a.pp):
        for tp_rank in range(a.tp):
            model = rank_model(glob, a.tp, a.pp, tp_rank, pp_rank)
            sd = {"iteration": a.iteration, "checkpoint_version": 3.0, "model": model}
            if a.args:
                sd["args"] = argparse.Namespace(tensor_model_parallel_size=a.tp, pipeline_model_parallel_size=a.pp,
                                                num_layers=LAYERS, hidden_size=HIDDEN, lr=3e-4, seed=a.seed,
                                                params_dtype=dtype)
                # Each rank's own streams, seeded like Megatron's (by pp and tp rank).
                rank_seed = a.seed + 100 * pp_rank + 2718 + tp_rank
                random.seed(rank_seed)
                np.random.seed(rank_seed)
                torch.manual_seed(rank_seed)
                sd["rng_state"] = [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                                    "torch_rng_state": torch.get_rng_state()}]
            if a.optimizer:
                sd["optimizer"] = rank_optimizer(gopt, a.tp, a.pp, tp_rank, pp_rank)
            d = os.path.join(it_dir, rank_dir(tp_rank, pp_rank, a.pp))
            os.makedirs(d, exist_ok=True)
            torch.save(sd, os.path.join(d, "model_optim_rng.pt"))
    with open(os.path.join(a.dir, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(a.iteration))


def load_tree(root, weights_only=False):
    it = open(os.path.join(root, "latest_checkpointed_iteration.txt")).read().strip()
    it_dir = os.path.join(root, f"iter_{int(it):07d}")
    files = {}
    for name in sorted(os.listdir(it_dir)):
        parts = name.split("_")  # mp, rank, TT[, PPP]
        tp_rank, pp_rank = int(parts[2]), int(parts[3]) if len(parts) > 3 else 0
        files[(tp_rank, pp_rank)] = torch.load(os.path.join(it_dir, name, "model_optim_rng.pt"),
                                               weights_only=weights_only)
    return int(it), files


def gather(files, tp, pp):
    """The global tensors back from a tree: cat along the split dim, layers renumbered."""
    per = LAYERS // pp
    glob = {}
    lm0 = files[(0, 0)]["model"]["language_model"]
    glob[("emb",)] = torch.cat([files[(r, 0)]["model"]["language_model"]["embedding"]["word_embeddings"]["weight"]
                                for r in range(tp)], 0)
    glob[("pos",)] = lm0["embedding"]["position_embeddings"]["weight"]
    for i in range(LAYERS):
        s, local = divmod(i, per)
        for name, (_, dim) in LAYER.items():
            parts = [files[(r, s)]["model"]["language_model"]["encoder"][f"layers.{local}.{name}"] for r in range(tp)]
            glob[("layer", i, name)] = parts[0] if dim is None else torch.cat(parts, dim)
    enc = files[(0, pp - 1)]["model"]["language_model"]["encoder"]
    glob[("final", "weight")] = enc["final_layernorm.weight"]
    glob[("final", "bias")] = enc["final_layernorm.bias"]
    return glob


def same(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype in (torch.bfloat16, torch.float16):
        return torch.equal(a.view(torch.int16), b.view(torch.int16))
    return torch.equal(a.view(torch.int32), b.view(torch.int32)) if a.dtype == torch.float32 else torch.equal(a, b)


def compare(path, want, got):
    if isinstance(want, dict):
        assert isinstance(got, dict), f"{path}: not a dict"
        assert set(want) == set(got), f"{path}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            compare(f"{path}/{k}", want[k], got[k])
    elif isinstance(want, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(want), f"{path}: {len(got)} items != {len(want)}"
        for i, (w, g) in enumerate(zip(want, got)):
            compare(f"{path}/{i}", w, g)
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and same(want, got), f"{path}: tensor differs"
    else:
        assert want == got, f"{path}: {got!r} != {want!r}"


def check(a):
    _, src = load_tree(a.src)
    it, out = load_tree(a.out, weights_only=a.weights_only)
    glob = gather(src, a.tp, a.pp)
    if "optimizer" in src[(0, 0)]:
        gopt = {k: gather(files, a.tp, a.pp) for k, files in optimizer_as_models(src).items()}
    ref = src[(0, 0)]
    assert sorted(out) == sorted((t, p) for t in range(a.tp2) for p in range(a.pp2)), f"rank files {sorted(out)}"
    assert it == ref["iteration"], f"iteration {it} != {ref['iteration']}"
    for (tp_rank, pp_rank), sd in sorted(out.items()):
        where = f"{a.out} mp_rank {tp_rank} {pp_rank}"
        compare(where + " model", rank_model(glob, a.tp2, a.pp2, tp_rank, pp_rank), sd["model"])
        assert sd["iteration"] == ref["iteration"], where + ": iteration"
        assert sd["checkpoint_version"] == 3.0, where + ": checkpoint_version"
        if "args" in ref:
            args = vars(sd["args"])
            want = dict(vars(ref["args"]), tensor_model_parallel_size=a.tp2, pipeline_model_parallel_size=a.pp2)
            assert args == want, f"{where}: args {args} != {want}"
            # Each rank's own rng state; a rank the source grid lacks gets the one of
            # (tp mod TP, pp mod PP) (docs/megatron_format.md).
            rng = src[(tp_rank % a.tp, pp_rank % a.pp)]["rng_state"][0]
            compare(where + " rng_state", rng["torch_rng_state"], sd["rng_state"][0]["torch_rng_state"])
            assert repr(sd["rng_state"][0]["np_rng_state"]) == repr(rng["np_rng_state"]), where + ": np_rng_state"
            assert sd["rng_state"][0]["random_rng_state"] == rng["random_rng_state"], where + ": random_rng_state"
        if "optimizer" in ref:
            compare(where + " optimizer", rank_optimizer(gopt, a.tp2, a.pp2, tp_rank, pp_rank), sd["optimizer"])
    print("CHECK OK", len(out))


def save(a):
    """What a framework does at a checkpoint: load the current iteration from the
    mount, train (here: double every float), torch.save every rank into a new
    iteration directory of the mount (and of MIRROR, the reference), then write
    the latest file. Exit 4 when closing the latest file fails (the save is refused)."""
    it, files = load_tree(a.mount)
    for (tp_rank, pp_rank), sd in sorted(files.items()):
        name = rank_dir(tp_rank, pp_rank, max(p for _, p in files) + 1)
        sd = dict(sd, iteration=a.iteration if a.state_iteration is None else a.state_iteration)
        if a.consumed is not None:
            sd["args"].consumed_train_samples = a.consumed
        sd["model"] = double(sd["model"])
        if "optimizer" in sd:
            sd["optimizer"] = double(sd["optimizer"])
        for root in (a.mirror, a.mount):
            if root == a.mount and name == a.skip:
                continue
            d = os.path.join(root, f"iter_{a.iteration:07d}", name)
            os.makedirs(d, exist_ok=True)
            torch.save(sd, os.path.join(d, "model_optim_rng.pt"))
    for root in (a.mirror, a.mount):
        try:
            with open(os.path.join(root, "latest_checkpointed_iteration.txt"), "w") as f:
                f.write(str(a.iteration))
        except OSError as e:
            print("SAVE FAILED:", e)
            sys.exit(4)
    print("SAVED", a.iteration)


def double(x):
    if isinstance(x, dict):
        return {k: double(v) for k, v in x.items()}
    if isinstance(x, list):
        return [double(v) for v in x]
    return x * 2 if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--tp", type=int, required=True)
    m.add_argument("--pp", type=int, required=True)
    m.add_argument("--iteration", type=int, default=100)
    m.add_argument("--args", action="store_true")
    m.add_argument("--optimizer", action="store_true")
    m.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    m.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("check")
    for name in ("src", "tp", "pp", "out", "tp2", "pp2"):
        c.add_argument(name, type=int if name.startswith(("tp", "pp")) else str)
    c.add_argument("--weights-only", action="store_true")
    s = sub.add_parser("save")
    s.add_argument("mount")
    s.add_argument("mirror")
    s.add_argument("--iteration", type=int, required=True)
    s.add_argument("--skip", default="", help="a rank directory not to write into the mount")
    s.add_argument("--consumed", type=int, help="args.consumed_train_samples of the save")
    s.add_argument("--state-iteration", type=int, help="the state dict's 'iteration' (default: --iteration)")
    a = p.parse_args()
    {"make": make, "check": check, "save": save}[a.cmd](a)


main()

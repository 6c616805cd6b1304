#!/usr/bin/env python3
"""Megatron-LM (legacy GPTModel) checkpoints made and checked with real torch,
independently of ptcfs: the test suite's reference for `--format megatron`.

  make DIR --tp T --pp P [--iteration N] [--args] [--optimizer [--one-group]] [--dtype bf16|f16|f32] [--seed S]
      torch.save random tensors in Megatron's layout: DIR/latest_checkpointed_iteration.txt,
      DIR/iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt. With --args, an argparse
      Namespace in 'args' and numpy/torch rng state in 'rng_state' (each rank's own). With
      --optimizer, Megatron's optimizer entry made by torch.optim.Adam.state_dict(): two
      parameter groups (1-D parameters and biases without weight decay) with Megatron's
      settings, `step` in every state, fp32 masters per group; --one-group: the layout ptcfs
      rendered before (one group, no step, no settings).
  save MOUNT/megatron MIRROR --iteration N [--skip mp_rank_TT_PPP] [--consumed SAMPLES] [--state-iteration M]
       [--no-latest]
      A framework's checkpoint through the mount (see save()); --consumed sets
      args.consumed_train_samples, --state-iteration the state dict's 'iteration';
      --no-latest leaves the latest file to another worker's mount (a cluster job).
  check SRC TP PP OUT TP2 PP2 [--weights-only]
      The reference reshard: every tensor of the SRC tree (tp=TP, pp=PP) is concatenated
      along its split dim (and its layers renumbered), re-split for TP2/PP2, and compared bit
      for bit with the files of the OUT tree, which torch.load reads (weights_only when
      asked). Non-tensor entries must be kept, args' parallel sizes rewritten. The optimizer
      state must be in Megatron's two groups with the source's settings and step, and load
      with torch.optim.Adam.load_state_dict over the rank's parameters (then take a step).

Model: megatron-gpt layers=4, hidden=32, heads=4, vocab=128, seq=16 (ffn 128).
Exit 0 and "CHECK OK <files>" when everything matches; 3 when torch is missing.
"""
import argparse
import io
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
# Megatron's parameter group settings as a run saves them (the scheduler's lr of the
# moment; wd_mult, lr_mult, ... from megatron/core/optimizer _get_param_groups), over
# torch.optim.Adam's own.
SETTINGS = {"lr": 2.5e-4, "betas": (0.9, 0.95), "eps": 1e-8, "wd_mult": 1.0, "lr_mult": 1.0,
            "is_expert_parallel": False, "default_config": True, "is_decoupled_lr": False,
            "max_lr": 3e-4, "min_lr": 3e-5}
# What ptcfs renders for a store that kept no settings (docs/megatron_format.md).
DEFAULTS = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "amsgrad": False,
            "wd_mult": 1.0, "lr_mult": 1.0, "is_expert_parallel": False, "is_decoupled_lr": False}


def global_optimizer(glob, seed):
    """Adam state per global tensor: the reference splits it like the tensor."""
    g = torch.Generator().manual_seed(seed)
    return {"exp_avg": {k: torch.randn(v.shape, generator=g) for k, v in glob.items()},
            "exp_avg_sq": {k: torch.rand(v.shape, generator=g) for k, v in glob.items()},
            "fp32": {k: v.float() for k, v in glob.items()}}


def without_weight_decay(name, shape):
    """Megatron's rule (_get_param_groups): no weight decay for biases and 1-D parameters."""
    return len(shape) == 1 or name.endswith(".bias")


def megatron_groups(model):
    """The depth-first positions of the rank's parameters in Megatron's two groups."""
    params = list(tensors_depth_first(model))
    decay = [i for i, (n, t) in enumerate(params) if not without_weight_decay(n.replace("/", "."), t.shape)]
    return [decay, [i for i in range(len(params)) if i not in decay]]


def megatron_optimizer(model, parts, steps, settings):
    """The optimizer entry Megatron's Float16OptimizerWithFloat16Params saves, made by torch
    itself: torch.optim.Adam over the fp32 masters in Megatron's two groups (settings[g] each),
    its state set (`step` = steps[i]), then Adam.state_dict()."""
    groups = megatron_groups(model)
    params = [torch.nn.Parameter(m.clone()) for m in parts["fp32"]]
    opt = torch.optim.Adam([dict(settings[g], params=[params[i] for i in groups[g]]) for g in range(2)])
    for i in groups[0] + groups[1]:
        opt.state[params[i]] = {"step": steps[i].clone(), "exp_avg": parts["exp_avg"][i].clone(),
                                "exp_avg_sq": parts["exp_avg_sq"][i].clone()}
    return {"optimizer": opt.state_dict(), "fp32_from_fp16_params": [[parts["fp32"][i] for i in g] for g in groups]}


def source_settings():
    """The two groups' settings of a made checkpoint (weight decay 0.1, none in group 1)."""
    return [dict(SETTINGS, weight_decay=0.1), dict(SETTINGS, weight_decay=0.0, wd_mult=0.0)]


def rank_optimizer(gopt, tp, pp, tp_rank, pp_rank, steps=None, settings=None, one_group=False, exact=False):
    """A rank's optimizer entry. one_group: the layout ptcfs rendered before (state[i] and
    fp32 masters by the parameter's depth-first position, one group, no step or settings).
    exact: the groups hold exactly `settings` (not torch's defaults besides)."""
    model = rank_model(gopt["fp32"], tp, pp, tp_rank, pp_rank)
    parts = {k: [v for _, v in tensors_depth_first(rank_model(gopt[k], tp, pp, tp_rank, pp_rank))] for k in KINDS}
    n = len(parts["fp32"])
    if one_group:
        return {"optimizer": {"state": {i: {"exp_avg": parts["exp_avg"][i], "exp_avg_sq": parts["exp_avg_sq"][i]}
                                        for i in range(n)},
                              "param_groups": [{"params": list(range(n))}]},
                "fp32_from_fp16_params": [parts["fp32"]]}
    out = megatron_optimizer(model, parts, [steps] * n, settings)
    if exact:
        pgs = out["optimizer"]["param_groups"]
        out["optimizer"]["param_groups"] = [dict(settings[g], params=pg["params"]) for g, pg in enumerate(pgs)]
    return out


def optimizer_by_param(sd):
    """kind -> values in the depth-first order of sd's model, read through the file's groups
    (Megatron's two, the one with wd_mult 0 without weight decay; or one)."""
    n = len(list(tensors_depth_first(sd["model"])))
    opt = sd["optimizer"]
    pgs = opt["optimizer"]["param_groups"]
    if len(pgs) == 1:
        members = [list(range(n))]
    else:
        no_decay = [g for g, pg in enumerate(pgs) if pg.get("wd_mult", 1.0) == 0.0] or [1]
        decay, nodecay = megatron_groups(sd["model"])
        members = [nodecay, decay] if no_decay[0] == 0 else [decay, nodecay]
    out = {k: [None] * n for k in KINDS + ("step",)}
    for g, pg in enumerate(pgs):
        for j, (i, key) in enumerate(zip(members[g], pg["params"])):
            state = opt["optimizer"]["state"][key]
            out["exp_avg"][i], out["exp_avg_sq"][i] = state["exp_avg"], state["exp_avg_sq"]
            out["step"][i] = state.get("step")
            out["fp32"][i] = opt["fp32_from_fp16_params"][g][j]
    return out


def optimizer_as_models(files):
    """Each rank's optimizer state as model-shaped dicts per kind (to gather like parameters)."""
    out = {k: {} for k in KINDS}
    for key, f in files.items():
        values = optimizer_by_param(f)
        for k in KINDS:
            out[k][key] = {"model": with_values(f["model"], values[k])}
    return out


def expected_settings(src):
    """The settings ptcfs renders for a store imported from `src` (a rank file)."""
    pgs = src["optimizer"]["optimizer"]["param_groups"]
    if len(pgs) == 2:
        return [{k: v for k, v in pg.items() if k != "params"} for pg in pgs]
    kept = {k: v for k, v in pgs[0].items() if k != "params"}
    return [dict(DEFAULTS, **kept),
            dict(DEFAULTS, **{k: v for k, v in kept.items() if k not in ("weight_decay", "wd_mult")}, wd_mult=0.0)]


def expected_step(src):
    """The step ptcfs renders: the source's (one for every parameter), else float32 iteration."""
    steps = [s for s in optimizer_by_param(src)["step"] if s is not None]
    return steps[0] if steps else torch.tensor(float(src["iteration"]))


def adam_loads(where, sd, want):
    """torch.optim.Adam over the rank's parameters (fp32, Megatron's groups) loads the rank's
    optimizer state, which then equals `want` (the reference entry), and takes a step."""
    params = [torch.nn.Parameter(t.float().clone()) for _, t in tensors_depth_first(sd["model"])]
    groups = megatron_groups(sd["model"])
    opt = torch.optim.Adam([{"params": [params[i] for i in g]} for g in groups])
    opt.load_state_dict(sd["optimizer"]["optimizer"])
    ref = want["optimizer"]
    for g, pg in enumerate(opt.param_groups):
        got = {k: v for k, v in pg.items() if k != "params"}
        for k, v in ref["param_groups"][g].items():
            if k != "params":
                assert got.get(k) == v, f"{where}: group {g} {k} {got.get(k)!r} != {v!r}"
    for key, i in enumerate(groups[0] + groups[1]):
        state = opt.state[params[i]]
        for kind in ("step", "exp_avg", "exp_avg_sq"):
            compare(f"{where} adam state {key} {kind}", ref["state"][key][kind], state[kind])
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()


def make(a):
    dtype = DTYPES[a.dtype]
    glob = global_model(dtype, a.seed)
    gopt = global_optimizer(glob, 1000 + a.seed)
    it_dir = os.path.join(a.dir, f"iter_{a.iteration:07d}")
    for pp_rank in range(a.pp):
        for tp_rank in range(a.tp):
            model = rank_model(glob, a.tp, a.pp, tp_rank, pp_rank)
            sd = {"iteration": a.iteration, "checkpoint_version": 3.0, "model": model}
            if a.extra_state:  # Transformer Engine's FP8 metadata, as a TE layer in legacy Megatron saves it
                key = "layers.0.self_attention.query_key_value._extra_state"
                model["language_model"]["encoder"][key] = io.BytesIO(b"fp8 meta")
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
                # A step short of the iteration, as after skipped (overflowed) fp16 steps.
                sd["optimizer"] = rank_optimizer(gopt, a.tp, a.pp, tp_rank, pp_rank,
                                                 steps=torch.tensor(float(a.iteration - 7)),
                                                 settings=source_settings(), one_group=a.one_group)
            d = os.path.join(it_dir, rank_dir(tp_rank, pp_rank, a.pp))
            os.makedirs(d, exist_ok=True)
            torch.save(sd, os.path.join(d, "model_optim_rng.pt"))
    with open(os.path.join(a.dir, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(a.iteration))


def allow_megatron_globals():
    """torch >= 2 with megatron-core: what a Megatron run allows a weights_only load (its
    safe globals: argparse.Namespace, numpy arrays of the rng state, ...)."""
    if int(torch.__version__.split(".")[0]) < 2:
        return
    import logging
    import warnings
    warnings.filterwarnings("ignore")  # megatron.core warns about Transformer Engine / Apex
    logging.disable(logging.WARNING)
    try:
        import megatron.core  # noqa: F401  (registers the safe globals on import)
    except ImportError:
        pass


def load_tree(root, weights_only=False):
    if weights_only:
        allow_megatron_globals()
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
            # Megatron's two groups whatever the source's layout; the source's settings and step.
            want = rank_optimizer(gopt, a.tp2, a.pp2, tp_rank, pp_rank, steps=expected_step(ref),
                                  settings=expected_settings(ref), exact=True)
            compare(where + " optimizer", want, sd["optimizer"])
            adam_loads(where, sd, want)
    print("CHECK OK", len(out))


def save(a):
    """What a framework does at a checkpoint: load the current iteration from the
    mount, train (here: double every float), torch.save every rank into a new
    iteration directory of the mount (and of MIRROR, the reference), then write
    the latest file. Exit 4 when closing the latest file fails (the save is refused)."""
    it, files = load_tree(a.mount)
    for (tp_rank, pp_rank), sd in sorted(files.items()):
        # A worker of a cluster job shows its own ranks only: the grid is the args' when they say.
        pp = sd["args"].pipeline_model_parallel_size if "args" in sd else max(p for _, p in files) + 1
        name = rank_dir(tp_rank, pp_rank, pp)
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
        if root == a.mount and a.no_latest:
            continue
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
    m.add_argument("--optimizer", action="store_true", help="Adam state in Megatron's layout (two groups)")
    m.add_argument("--one-group", action="store_true", help="the optimizer in ptcfs's former one-group layout")
    m.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--extra-state", action="store_true", help="an _extra_state entry in the nested model dict")
    c = sub.add_parser("check")
    for name in ("src", "tp", "pp", "out", "tp2", "pp2"):
        c.add_argument(name, type=int if name.startswith(("tp", "pp")) else str)
    c.add_argument("--weights-only", action="store_true")
    s = sub.add_parser("save")
    s.add_argument("mount")
    s.add_argument("mirror")
    s.add_argument("--iteration", type=int, required=True)
    s.add_argument("--skip", default="", help="a rank directory not to write into the mount")
    s.add_argument("--no-latest", action="store_true",
                   help="no latest file into the mount (one worker of a cluster job: another commits the save)")
    s.add_argument("--consumed", type=int, help="args.consumed_train_samples of the save")
    s.add_argument("--state-iteration", type=int, help="the state dict's 'iteration' (default: --iteration)")
    a = p.parse_args()
    {"make": make, "check": check, "save": save}[a.cmd](a)


if __name__ == "__main__":
    main()

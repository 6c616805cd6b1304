#!/usr/bin/env python3
"""Legacy Megatron-LM's GPTModel as a small torch module tree in its registration order,
loading and saving Megatron trees: the reference for the megatron-gpt schema's parameter order.

The tree registers what legacy Megatron's modules register, in their order (megatron/model/):
GPTModel builds language_model (TransformerLanguageModel: embedding on the first stage, with
word_embeddings then position_embeddings; then encoder, a ParallelTransformer of layers and,
on the last stage, final_layernorm), then word_embeddings on the last stage when pp > 1
(initialize_word_embeddings; saved as word_embeddings_for_head). ParallelTransformerLayer:
input_layernorm, self_attention (ParallelAttention: query_key_value, then dense),
post_attention_layernorm, mlp (ParallelMLP: dense_h_to_4h, dense_4h_to_h). A column-parallel
linear holds weight [out/tp, in] and bias [out/tp], a row-parallel one weight [out, in/tp] and
the whole bias; each registers its weight before its bias, as LayerNorm does.

  run TREE TP PP --dims D [--save OUT ITER]
      For each (tp, pp) rank of TREE (its latest iteration): build the rank's module, load
      its parameters from the file's model dict (each found with its shape, no tensor left
      over), check that the optimizer state is numbered in named_parameters() order split
      into Megatron's two groups (each state's moments have its parameter's shape, each fp32
      master equals its parameter bit for bit), load it into torch.optim.Adam over those
      groups and take a step (finite, every parameter moved). --save: the stepped rank as
      Megatron saves it (the module's parameters nested as state_dict_for_save_checkpoint
      nests them, Adam.state_dict(), the fp32 masters per group) into OUT/iter_ITER/.
  same A B TP PP
      The rank files of trees A and B hold the same model and optimizer state: the same
      keys in the same order, every tensor equal bit for bit, the same numbering, groups and
      settings.
Prints "<CMD> OK" and exits 0 on success.
"""
import pathlib
import sys

import torch
from torch import nn


class Linear(nn.Module):
    def __init__(self, out_features, in_features, bias_features):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(bias_features))


class LayerNorm(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(hidden))
        self.bias = nn.Parameter(torch.empty(hidden))


class ParallelAttention(nn.Module):
    def __init__(self, d, tp):
        super().__init__()
        self.query_key_value = Linear(3 * d["hidden"] // tp, d["hidden"], 3 * d["hidden"] // tp)
        self.dense = Linear(d["hidden"], d["hidden"] // tp, d["hidden"])


class ParallelMLP(nn.Module):
    def __init__(self, d, tp):
        super().__init__()
        self.dense_h_to_4h = Linear(d["ffn"] // tp, d["hidden"], d["ffn"] // tp)
        self.dense_4h_to_h = Linear(d["hidden"], d["ffn"] // tp, d["hidden"])


class ParallelTransformerLayer(nn.Module):
    def __init__(self, d, tp):
        super().__init__()
        self.input_layernorm = LayerNorm(d["hidden"])
        self.self_attention = ParallelAttention(d, tp)
        self.post_attention_layernorm = LayerNorm(d["hidden"])
        self.mlp = ParallelMLP(d, tp)


class ParallelTransformer(nn.Module):
    def __init__(self, d, tp, layers, last):
        super().__init__()
        self.layers = nn.ModuleList([ParallelTransformerLayer(d, tp) for _ in range(layers)])
        if last:
            self.final_layernorm = LayerNorm(d["hidden"])


class Embedding(nn.Module):
    def __init__(self, d, tp):
        super().__init__()
        self.word_embeddings = nn.Embedding(d["vocab"] // tp, d["hidden"])
        self.position_embeddings = nn.Embedding(d["seq"], d["hidden"])


class TransformerLanguageModel(nn.Module):
    def __init__(self, d, tp, layers, first, last):
        super().__init__()
        if first:
            self.embedding = Embedding(d, tp)
        self.encoder = ParallelTransformer(d, tp, layers, last)


class GPTModel(nn.Module):
    def __init__(self, d, tp, pp, pp_rank):
        super().__init__()
        first, last = pp_rank == 0, pp_rank == pp - 1
        self.language_model = TransformerLanguageModel(d, tp, d["layers"] // pp, first, last)
        if last and pp > 1:
            self.word_embeddings = nn.Embedding(d["vocab"] // tp, d["hidden"])


def file_path(name):
    """The keys of a parameter in the file's model dict, as legacy Megatron nests them."""
    if name.startswith("language_model.encoder."):
        return ["language_model", "encoder", name[len("language_model.encoder."):]]
    if name.startswith("word_embeddings."):
        return ["word_embeddings_for_head"] + name.split(".")[1:]
    return name.split(".")


def tensors_in_order(d, prefix=()):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from tensors_in_order(v, prefix + (k,))
        else:
            yield prefix + (k,), v


def megatron_groups(module):
    """Megatron's _get_param_groups: weight decay unless 1-D or a bias, in named_parameters() order."""
    named = list(module.named_parameters())
    without = [p.dim() == 1 or n.endswith(".bias") for n, p in named]
    return [[np for np, w in zip(named, without) if not w], [np for np, w in zip(named, without) if w]]


def rank_file(root, iteration, tp_rank, pp_rank, pp):
    d = f"mp_rank_{tp_rank:02d}" + (f"_{pp_rank:03d}" if pp > 1 else "")
    return pathlib.Path(root) / f"iter_{iteration:07d}" / d / "model_optim_rng.pt"


def latest(root):
    return int((pathlib.Path(root) / "latest_checkpointed_iteration.txt").read_text())


def run_rank(d, root, tp, pp, tp_rank, pp_rank, save):
    where = f"rank tp {tp_rank} pp {pp_rank}"
    iteration = latest(root)
    sd = torch.load(rank_file(root, iteration, tp_rank, pp_rank, pp))
    module = GPTModel(d, tp, pp, pp_rank)
    saved = dict(tensors_in_order(sd["model"]))
    with torch.no_grad():
        for name, p in module.named_parameters():
            key = tuple(file_path(name))
            assert key in saved, f"{where}: {name}: no {'/'.join(key)} in the file"
            t = saved.pop(key)
            assert t.shape == p.shape, f"{where}: {name}: {tuple(t.shape)} in the file, {tuple(p.shape)} in the module"
            p.copy_(t)
    assert not saved, f"{where}: tensors the module does not have: {sorted(saved)[:3]}"
    # The numbering: Megatron's groups over named_parameters().
    groups = megatron_groups(module)
    state = sd["optimizer"]["optimizer"]
    assert [len(g["params"]) for g in state["param_groups"]] == [len(g) for g in groups], where
    k = 0
    for g, group in enumerate(groups):
        for j, (name, p) in enumerate(group):
            assert state["param_groups"][g]["params"][j] == k, f"{where}: group {g} position {j}"
            s = state["state"][k]
            for kind in ("exp_avg", "exp_avg_sq"):
                assert s[kind].shape == p.shape, f"{where}: state {k} {kind} {tuple(s[kind].shape)}, {name} {tuple(p.shape)}"
            assert bool((s["exp_avg_sq"] >= 0).all()), f"{where}: state {k}: exp_avg_sq < 0"
            master = sd["optimizer"]["fp32_from_fp16_params"][g][j]
            assert torch.equal(master, p.detach().float()), f"{where}: state {k}: its fp32 master is not {name}"
            k += 1
    adam = torch.optim.Adam([{"params": [p for _, p in g]} for g in groups])
    adam.load_state_dict(state)
    before = [p.detach().clone() for p in module.parameters()]
    sum(p.pow(2).sum() for p in module.parameters()).backward()
    adam.step()
    for (name, p), b in zip(module.named_parameters(), before):
        assert torch.isfinite(p).all(), f"{where}: {name}: not finite after an Adam step"
        assert not torch.equal(p, b), f"{where}: {name}: the step did not move it"
    if save is None:
        return
    out, out_iteration = save
    model = {}
    for name, p in module.named_parameters():  # registration order, nested as Megatron saves
        *dirs, leaf = file_path(name)
        node = model
        for key in dirs:
            node = node.setdefault(key, {})
        node[leaf] = p.detach().clone()
    opt = adam.state_dict()
    sd.update(iteration=out_iteration, model=model,
              optimizer={"optimizer": opt,
                         "fp32_from_fp16_params": [[p.detach().float().clone() for p in g["params"]]
                                                   for g in adam.param_groups]})
    path = rank_file(out, out_iteration, tp_rank, pp_rank, pp)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(sd, path)


def same_value(a, b, where):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), f"{where}: keys {list(a)[:4]}... != {list(b)[:4]}..."
        for k in a:
            same_value(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) == type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same_value(x, y, f"{where}/{i}")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def main():
    cmd = sys.argv[1]
    if cmd == "run":
        root, tp, pp = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        flags = sys.argv[5:]
        d = dict(kv.split("=") for kv in flags[flags.index("--dims") + 1].split(","))
        d = {k: int(v) for k, v in d.items()}
        d.setdefault("ffn", 4 * d["hidden"])
        save = (flags[flags.index("--save") + 1], int(flags[flags.index("--save") + 2])) if "--save" in flags else None
        for pp_rank in range(pp):
            for tp_rank in range(tp):
                run_rank(d, root, tp, pp, tp_rank, pp_rank, save)
        if save is not None:
            (pathlib.Path(save[0]) / "latest_checkpointed_iteration.txt").write_text(str(save[1]))
    elif cmd == "same":
        a, b, tp, pp = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        for pp_rank in range(pp):
            for tp_rank in range(tp):
                fa = torch.load(rank_file(a, latest(a), tp_rank, pp_rank, pp))
                fb = torch.load(rank_file(b, latest(b), tp_rank, pp_rank, pp))
                for key in ("model", "optimizer"):
                    same_value(fa[key], fb[key], f"tp {tp_rank} pp {pp_rank}: {key}")
    print(cmd.upper(), "OK")


if __name__ == "__main__":
    main()

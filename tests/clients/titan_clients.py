"""torchtitan's Llama (torchtitan 0.3, from PyPI) against ptcfs's DCP keys in its names.

  titan_clients.py load DCP_DIR HF_DIR TORCH_DCP_DIR --procs N
      N gloo processes each build torchtitan's Llama3Model with HF_DIR's sizes
      and dcp.load its state dict as torchtitan's checkpointer flattens it
      (the model's keys at the top, the optimizer's flattened under
      "optimizer": state.<name>.exp_avg, ...) from DCP_DIR, into plain
      tensors and into DTensors sharded on dim 0 over the N ranks. The
      reference is independent of ptcfs's torchtitan names: the model is
      torchtitan's own Llama3StateDictAdapter.from_hf of HF_DIR (ptcfs's
      Hugging Face export); Adam's moments are TORCH_DCP_DIR's (the store's
      own tensors under torch keys, loaded with dcp) cut into HF's tensors
      here, permuted by the same adapter and, q/k/v, merged into the fused
      wqkv the optimizer keeps by torchtitan's FusedQKVLinear. Every tensor
      bit for bit; and so in torch's dcp_to_torch_save of DCP_DIR (one file,
      nested by the .metadata's planner_data).
      Prints "LOAD OK".

  titan_clients.py save OUT_DIR SEED HF_DIR --procs N
      N gloo processes save a torchtitan state dict of values drawn from SEED
      (torchtitan's flattening; Adam's step per parameter and every setting of
      torch AdamW's group, from torch's get_optimizer_state_dict; the
      train_state and lr_scheduler entries its checkpointer writes) into
      OUT_DIR, each rank its dim-0 shard (DTensors).
      Prints "SAVE OK".

  titan_clients.py same DCP_DIR SEED HF_DIR --procs N
      dcp.load of DCP_DIR in N processes equals those saved values, bit for bit;
      then each resumes as torchtitan does (torch's get_optimizer_state_dict,
      flattened, loaded, set_optimizer_state_dict into AdamW): the saved step,
      group settings and moments.
      Prints "SAME OK".
"""

import argparse
import json
import os
import pickle
import sys
import tempfile
import traceback
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_optimizer_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.models.common import Embedding, Linear, RMSNorm
from torchtitan.models.common.attention import FusedQKVLinear
from torchtitan.models.common.rope import ComplexRoPE
from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers
from torchtitan.models.llama3.state_dict_adapter import Llama3StateDictAdapter
import ranks  # noqa: E402 (how the gloo ranks start: forked)


def model_config(hf_dir):
    with open(os.path.join(hf_dir, "config.json")) as f:
        c = json.load(f)
    dim, heads = c["hidden_size"], c["num_attention_heads"]
    return Llama3Model.Config(
        dim=dim,
        vocab_size=c["vocab_size"],
        tok_embeddings=Embedding.Config(num_embeddings=c["vocab_size"], embedding_dim=dim),
        norm=RMSNorm.Config(normalized_shape=dim),
        lm_head=Linear.Config(in_features=dim, out_features=c["vocab_size"]),
        layers=_build_llama3_layers(
            fuse_qkv=True, n_layers=c["num_hidden_layers"], dim=dim, n_heads=heads,
            n_kv_heads=c["num_key_value_heads"], hidden_dim=c["intermediate_size"],
            rope=ComplexRoPE.Config(dim=dim // heads, max_seq_len=c["max_position_embeddings"],
                                    theta=c["rope_theta"]),
            attn_backend="flex"),
    ), c


def hf_of_megatron(name, t, c):
    """The HF tensors of one Megatron-Core tensor of the built-in llama schema (docs/hf_format.md)."""
    heads, groups = c["num_attention_heads"], c["num_key_value_heads"]
    d, per = c["head_dim"], heads // groups
    if name == "embedding.word_embeddings.weight":
        return {"model.embed_tokens.weight": t}
    if name == "decoder.final_layernorm.weight":
        return {"model.norm.weight": t}
    if name == "output_layer.weight":
        return {"lm_head.weight": t}
    _, _, i, rest = name.split(".", 3)
    p = f"model.layers.{i}."
    if rest == "self_attention.linear_qkv.weight":
        g = t.view(groups, per + 2, d, -1)
        return {p + "self_attn.q_proj.weight": g[:, :per].reshape(heads * d, -1),
                p + "self_attn.k_proj.weight": g[:, per].reshape(groups * d, -1),
                p + "self_attn.v_proj.weight": g[:, per + 1].reshape(groups * d, -1)}
    if rest == "mlp.linear_fc1.weight":
        gate, up = t.chunk(2)
        return {p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up}
    plain = {"self_attention.linear_proj.weight": "self_attn.o_proj.weight",
             "mlp.linear_fc2.weight": "mlp.down_proj.weight",
             "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
             "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight"}
    return {p + plain[rest]: t}


def reference(dcp_dir, hf_dir, torch_dcp_dir):
    """{torchtitan's flattened key: tensor}, from the HF export and the torch-keyed DCP export."""
    cfg, c = model_config(hf_dir)
    adapter = Llama3StateDictAdapter(cfg, None)
    hf = {}
    for name in sorted(os.listdir(hf_dir)):
        if name.endswith(".safetensors"):
            hf.update(load_file(os.path.join(hf_dir, name)))
    out = dict(adapter.from_hf(dict(hf)))
    # The store's own tensors, by their torch keys.
    meta = dcp.FileSystemReader(torch_dcp_dir).read_metadata()
    flat = {k: torch.empty(m.size, dtype=m.properties.dtype)
            for k, m in meta.state_dict_metadata.items() if hasattr(m, "size")}
    dcp.load(flat, checkpoint_id=torch_dcp_dir, no_dist=True)
    split = {}
    for key, t in flat.items():
        if key.startswith("model."):
            split.update(hf_of_megatron(key[len("model."):], t, c))
    for key, want in hf.items():  # this cut of the Megatron tensors is HF's
        assert torch.equal(split[key], want), key
    # The optimizer's parameters: the model's, but wq, wk, wv fused into one wqkv as torchtitan's
    # FusedQKVLinear merges them (its own _merge_qkv_on_load).
    heads, groups = c["num_attention_heads"], c["num_key_value_heads"]
    fused = SimpleNamespace(head_dim=c["head_dim"], heads_per_kv=heads // groups)
    for kind in ("exp_avg", "exp_avg_sq"):
        moments = {}
        for key, t in flat.items():
            if key.startswith("optim.state.") and key.endswith("." + kind):
                moments.update(hf_of_megatron(key[len("optim.state."):-len(kind) - 1], t, c))
        titan = adapter.from_hf(moments)
        for i in range(c["num_hidden_layers"]):
            FusedQKVLinear._merge_qkv_on_load(fused, titan, f"layers.{i}.attention.qkv_linear.")
        for name, t in titan.items():
            out[f"optimizer.state.{name}.{kind}"] = t
    return out


def nest(flat):
    """torchtitan's state dict: model keys at the top, the flattened optimizer under "optimizer"."""
    sd = {}
    for key, t in flat.items():
        if key.startswith("optimizer."):
            sd.setdefault("optimizer", {})[key[len("optimizer."):]] = t
        else:
            sd[key] = t
    return sd


def flat_of(sd):
    out = {}
    for key, v in sd.items():
        if isinstance(v, dict):
            for k, t in v.items():
                out[key + "." + k] = t
        else:
            out[key] = v
    return out


def local(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def same(got, want, what):
    bad = [k for k in want if not torch.equal(local(got[k]), want[k])]
    if bad:
        raise AssertionError(f"{what}: {len(bad)} tensors differ, first {bad[:3]}")


def values(seed, keys_like):
    """Values of the shapes of `keys_like`, drawn from `seed`."""
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(t.shape, generator=g, dtype=t.dtype) for k, t in keys_like.items()}


def titan_template(hf_dir):
    """torchtitan's model keys (its state dict's: wq, wk, wv) and Adam's (its parameters':
    one fused wqkv), tensors zero."""
    cfg, _ = model_config(hf_dir)
    with torch.device("meta"):
        model = cfg.build() if hasattr(cfg, "build") else Llama3Model(cfg)
    out = {}
    for name, p in model.state_dict().items():
        out[name] = torch.zeros(p.shape, dtype=torch.float32)
    for name, p in model.named_parameters():
        for kind in ("exp_avg", "exp_avg_sq"):
            out[f"optimizer.state.{name}.{kind}"] = torch.zeros(p.shape, dtype=torch.float32)
    return out


def shard(flat, mesh):
    return {k: distribute_tensor(t, mesh, [Shard(0)]) for k, t in flat.items()}


def run(rank, world, port, fn, errors):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        fn(rank, world)
    except Exception:
        errors.put((rank, traceback.format_exc()))
        raise
    finally:
        dist.barrier()
        dist.destroy_process_group()


def spawn(procs, fn):
    errors = ranks.queue()
    try:
        ranks.start(run, (procs, ranks.free_port(), fn, errors), procs)
    except Exception:
        while not errors.empty():
            rank, text = errors.get()
            print(f"rank {rank}:\n{text}", file=sys.stderr)
        raise


STEP = 7.0
SETTINGS = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
FLAT = StateDictOptions(flatten_optimizer_state_dict=True)  # torchtitan's OptimizersContainer's


def adamw(hf_dir, settings):
    """torchtitan's model on the CPU and torch's AdamW over it, its state made (zero grads, lr 0)."""
    cfg, _ = model_config(hf_dir)
    model = cfg.build() if hasattr(cfg, "build") else Llama3Model(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), **settings)
    return model, optimizer


class Load:
    """dcp.load of torchtitan's flattened state dict; with `resume`, as its checkpointer
    resumes: the optimizer's state dict from torch's API (flattened), loaded, then set into
    the optimizer, whose step, settings and moments must be the saved ones."""

    def __init__(self, args, want, hf_dir=None):
        self.args, self.want, self.hf_dir = args, want, hf_dir

    def __call__(self, rank, world):
        plain = {k: torch.zeros_like(t) for k, t in self.want.items()}
        dcp.load(nest(plain), checkpoint_id=self.args.dir)  # nest keeps the tensors: filled in place
        same(plain, self.want, f"rank {rank} plain")
        mesh = init_device_mesh("cpu", (world,))
        sharded = shard({k: torch.zeros_like(t) for k, t in self.want.items()}, mesh)
        dcp.load(nest(sharded), checkpoint_id=self.args.dir)
        same(sharded, self.want, f"rank {rank} DTensor Shard(0) of {world}")
        if self.hf_dir is None:
            return
        model, optimizer = adamw(self.hf_dir, {"lr": 1.0})  # settings of its own: the load replaces them
        osd = get_optimizer_state_dict(model, optimizer, options=FLAT)
        sd = dict(model.state_dict())
        sd["optimizer"] = osd
        dcp.load(sd, checkpoint_id=self.args.dir)
        set_optimizer_state_dict(model, optimizer, osd, options=FLAT)
        for group in optimizer.param_groups:
            for k, v in SETTINGS.items():
                if group[k] != v:
                    raise AssertionError(f"rank {rank}: the group's {k} is {group[k]!r}, saved {v!r}")
        names = {p: n for n, p in model.named_parameters()}
        for p, state in optimizer.state.items():
            if not torch.equal(state["step"], torch.tensor(STEP)):
                raise AssertionError(f"rank {rank}: {names[p]}'s step is {state['step']}, saved {STEP}")
            for kind in ("exp_avg", "exp_avg_sq"):
                if not torch.equal(state[kind], self.want[f"optimizer.state.{names[p]}.{kind}"]):
                    raise AssertionError(f"rank {rank}: {names[p]}'s {kind} differs")


class Save:
    """torchtitan's save: the model's keys, the optimizer's flattened state dict (torch's AdamW:
    every setting of its group, each parameter's step), train_state and lr_scheduler; the
    tensors the saved values, each rank its dim-0 shard."""

    def __init__(self, args, saved, hf_dir):
        self.args, self.saved, self.hf_dir = args, saved, hf_dir

    def __call__(self, rank, world):
        model, optimizer = adamw(self.hf_dir, SETTINGS)
        osd = get_optimizer_state_dict(model, optimizer, options=FLAT)
        mesh = init_device_mesh("cpu", (world,))
        sd = nest(shard(self.saved, mesh))
        for k, v in osd.items():
            if k.endswith(".step"):
                sd["optimizer"][k] = torch.tensor(STEP)
            elif k.startswith("param_groups."):
                sd["optimizer"][k] = v
        sd.update(extra_states(rank, world))
        dcp.save(sd, checkpoint_id=self.args.dir)


def extra_states(rank, world):
    """What torchtitan saves beside the model and the optimizer: train_state (here as
    tensors, as its earlier releases saved it), lr_scheduler, and the dataloader's state of
    this dp rank (ParallelAwareDataloader: a pickle per rank, and the dp world size)."""
    return {
        "train_state": {"step": torch.tensor(7, dtype=torch.int32), "ntokens_seen": torch.tensor(1 << 20)},
        "lr_scheduler": {"last_epoch": 7, "_step_count": 8},
        "dataloader": {f"dp_rank_{rank}": pickle.dumps({"samples_seen": 1000 + rank}), "world_size": world},
    }


class Resume:
    """A restarted torchtitan job: its checkpointer finds the latest step directory in its
    folder (CheckpointManager._find_load_step: step-N with a .metadata), and dcp.load of its
    whole state from there gives the saved model, optimizer, train_state, lr_scheduler and
    dataloader state."""

    def __init__(self, args, saved):
        self.args, self.saved = args, saved

    def __call__(self, rank, world):
        manager = SimpleNamespace(folder=self.args.dir)
        step = CheckpointManager._find_load_step(manager, self.args.dir)
        if step != 7:
            raise AssertionError(f"rank {rank}: torchtitan finds step {step} in {self.args.dir}, saved 7")
        checkpoint = CheckpointManager._create_checkpoint_id(manager, step, self.args.dir)
        plain = {k: torch.zeros_like(t) for k, t in self.saved.items()}
        sd = nest(plain)
        sd["train_state"] = {"step": torch.tensor(0, dtype=torch.int32), "ntokens_seen": torch.tensor(0)}
        sd["lr_scheduler"] = {"last_epoch": 0, "_step_count": 0}
        sd["dataloader"] = {f"dp_rank_{rank}": b"", "world_size": 0}
        dcp.load(sd, checkpoint_id=checkpoint)
        same(plain, self.saved, f"rank {rank} resumed from {checkpoint}")
        want = extra_states(rank, world)
        for name in ("step", "ntokens_seen"):
            if not torch.equal(sd["train_state"][name], want["train_state"][name]):
                raise AssertionError(f"rank {rank}: train_state.{name} is {sd['train_state'][name]}")
        for part in ("lr_scheduler", "dataloader"):
            if sd[part] != want[part]:
                raise AssertionError(f"rank {rank}: {part} is {sd[part]!r}, saved {want[part]!r}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["load", "save", "same", "resume"])
    ap.add_argument("dir")
    ap.add_argument("rest", nargs="+")
    ap.add_argument("--procs", type=int, default=1)
    args = ap.parse_args()
    if args.mode == "load":
        hf_dir, torch_dcp = args.rest
        want = reference(args.dir, hf_dir, torch_dcp)
        spawn(args.procs, Load(args, want))
        # torch's own conversion to one torch.save file nests the keys by .metadata's planner_data.
        with tempfile.TemporaryDirectory() as tmp:
            dcp_to_torch_save(args.dir, os.path.join(tmp, "all.pt"))
            whole = torch.load(os.path.join(tmp, "all.pt"), weights_only=False)
        if not isinstance(whole.get("optimizer"), dict) or any(k.startswith("optimizer.") for k in whole):
            raise AssertionError("dcp_to_torch_save did not nest the optimizer's keys under 'optimizer'")
        same(flat_of(whole), want, "dcp_to_torch_save")
        print("LOAD OK")
        return
    seed, hf_dir = int(args.rest[0]), args.rest[1]
    saved = values(seed, titan_template(hf_dir))
    if args.mode == "save":
        spawn(args.procs, Save(args, saved, hf_dir))
        print("SAVE OK")
    elif args.mode == "resume":
        spawn(args.procs, Resume(args, saved))
        print("RESUME OK")
    else:
        spawn(args.procs, Load(args, saved, hf_dir))
        print("SAME OK")


if __name__ == "__main__":
    main()

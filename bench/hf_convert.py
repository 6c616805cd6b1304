#!/usr/bin/env python3
"""The conversion users run today: a Megatron-Core GPT (llama) checkpoint to Hugging Face.

The baseline bench/hf_export.sh times against `ptcfs export --format hf`. Like the
converters people use (Megatron-LM's and Megatron-Bridge's checkpoint converters, HF's
convert_*_to_hf scripts), it is one process that loads every rank file, assembles each
global tensor (tp pieces concatenated; linear_fc1's per-rank [gate_r; up_r] halves put
back as [gate; up]; layers renumbered from stage-local to global), cuts the HF tensors
(q/k/v per query group of linear_qkv, gate/up of linear_fc1) and writes HF's shards with
safetensors, then the index and config.json, written with care: dp replica 0 only, each
source freed once assembled, one shard's tensors made contiguous at a time.

Input:  SRC/rank-RRRRR/model.safetensors of a tp x pp config (as `ptcfs export` /
        `ptcfs synth` write them, Megatron-Core names).
Output: OUT/config.json, OUT/model-0000K-of-0000N.safetensors, OUT/model.safetensors.index.json.

usage: hf_convert.py --dims layers=..,hidden=..,heads=..,kv_heads=..,vocab=..,seq=..,ffn=.. \
                     --tp 2 --pp 2 [--shard-size 5GB] SRC OUT
"""
import argparse
import json
import os
import re
import sys

import torch
from safetensors.torch import load_file, save_file

LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")
# tp split dim of each name (layer-local suffix or whole name); others are replicated.
SPLIT = {"embedding.word_embeddings.weight": 0, "output_layer.weight": 0,
         "self_attention.linear_qkv.weight": 0, "self_attention.linear_proj.weight": 1,
         "mlp.linear_fc1.weight": 0, "mlp.linear_fc2.weight": 1}


def parse_dims(text):
    d = {k: int(v) for k, v in (kv.split("=") for kv in text.split(","))}
    d.setdefault("ffn", 4 * d["hidden"])
    d.setdefault("kv_heads", d["heads"])
    d.setdefault("head_dim", d["hidden"] // d["heads"])
    return d


def size_bytes(text):
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    for u, n in units.items():
        if text.endswith(u):
            return int(text[:-len(u)]) * n
    return int(text)


def assemble(src, d, tp, pp):
    """{global name: tensor}: every rank file loaded, tp pieces concatenated."""
    per_stage = d["layers"] // pp
    parts = {}
    for p in range(pp):
        for t in range(tp):
            rank = p * tp + t
            for name, x in load_file(os.path.join(src, f"rank-{rank:05d}", "model.safetensors")).items():
                m = LAYER.match(name)
                suffix = m.group(2) if m else name
                if m:
                    name = f"decoder.layers.{int(m.group(1)) + p * per_stage}.{suffix}"
                parts.setdefault(name, (SPLIT.get(suffix), {}))[1].setdefault(t, x)
    full = {}
    for name, (dim, pieces) in parts.items():
        if dim is None:
            full[name] = pieces[0]
        elif name.endswith("mlp.linear_fc1.weight"):  # each rank holds [gate_r; up_r]
            halves = [pieces[t].chunk(2, dim=0) for t in range(tp)]
            full[name] = torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
        else:
            full[name] = torch.cat([pieces[t] for t in range(tp)], dim=dim)
        pieces.clear()
    return full


def to_hf(full, d):
    """HF Llama's state dict (views of the global tensors), in HF's order."""
    hd, kv, per = d["head_dim"], d["kv_heads"], d["heads"] // d["kv_heads"]
    out = {"model.embed_tokens.weight": full["embedding.word_embeddings.weight"]}
    for i in range(d["layers"]):
        p, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = full[p + "self_attention.linear_qkv.weight"]
        g = qkv.view(kv, (per + 2) * hd, qkv.shape[-1])
        out[h + "self_attn.q_proj.weight"] = g[:, :per * hd].reshape(-1, qkv.shape[-1])
        out[h + "self_attn.k_proj.weight"] = g[:, per * hd:(per + 1) * hd].reshape(-1, qkv.shape[-1])
        out[h + "self_attn.v_proj.weight"] = g[:, (per + 1) * hd:].reshape(-1, qkv.shape[-1])
        out[h + "self_attn.o_proj.weight"] = full[p + "self_attention.linear_proj.weight"]
        gate, up = full[p + "mlp.linear_fc1.weight"].chunk(2, dim=0)
        out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = gate, up
        out[h + "mlp.down_proj.weight"] = full[p + "mlp.linear_fc2.weight"]
        out[h + "input_layernorm.weight"] = full[p + "self_attention.linear_qkv.layer_norm_weight"]
        out[h + "post_attention_layernorm.weight"] = full[p + "mlp.linear_fc1.layer_norm_weight"]
    out["model.norm.weight"] = full["decoder.final_layernorm.weight"]
    out["lm_head.weight"] = full["output_layer.weight"]
    return out


def write(hf, d, out, max_bytes):
    os.makedirs(out, exist_ok=True)
    shards, current, size = [], [], 0
    for name, t in hf.items():
        n = t.numel() * t.element_size()
        if current and size + n > max_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(name)
        size += n
    shards.append(current)
    weight_map, total = {}, 0
    for k, names in enumerate(shards):
        file = "model.safetensors" if len(shards) == 1 else f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file({n: hf[n].contiguous() for n in names}, os.path.join(out, file), metadata={"format": "pt"})
        for n in names:
            weight_map[n] = file
            total += hf[n].numel() * hf[n].element_size()
    if len(shards) > 1:
        with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    dtype = str(next(iter(hf.values())).dtype).replace("torch.", "")
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": d["hidden"],
              "intermediate_size": d["ffn"], "num_hidden_layers": d["layers"], "num_attention_heads": d["heads"],
              "num_key_value_heads": d["kv_heads"], "head_dim": d["head_dim"], "vocab_size": d["vocab"],
              "max_position_embeddings": d["seq"], "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "torch_dtype": dtype}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    return len(shards), total


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dims", required=True)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--shard-size", default="5GB")
    parser.add_argument("src")
    parser.add_argument("out")
    args = parser.parse_args()
    d = parse_dims(args.dims)
    full = assemble(args.src, d, args.tp, args.pp)
    shards, total = write(to_hf(full, d), d, args.out, size_bytes(args.shard_size))
    print(f"converted {args.src} to {args.out}: {shards} shards, {total} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())

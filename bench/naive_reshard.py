#!/usr/bin/python3
"""The way users reshard a Megatron-LM (legacy names) GPT checkpoint today.

Loads every rank file of the source config, concatenates each tensor along its
tensor-parallel split dim into the full model (layers renumbered from
stage-local to global), re-splits it for the target config and writes every
target rank file. This is the baseline that bench/transform.sh times against
`ptcfs transform`; it is deliberately what a user script does (one process,
whole model in memory), written with care: it only reads dp replica 0 (the
other dp replicas are identical), clones each piece before saving (torch.save
of a view would write the whole underlying storage) and frees the sources
before writing.

Input:  SRC/rank-RRRRR/model.safetensors (as `ptcfs synth` / `ptcfs export` write them).
Output: OUT/rank-RRRRR/model.pt (torch.save of a flat dict, the default) or
        OUT/rank-RRRRR/model.safetensors (--format safetensors, so that
        `ptcfs diff` can check the result).
Rank order is Megatron's: rank = pp_idx*(dp*tp) + dp_idx*tp + tp_idx.

Only Debian's python3-torch is needed (the safetensors package is not in
Debian; the format is a little-endian u64 header length, a JSON header and
the raw bytes, read here with torch.frombuffer).

usage: naive_reshard.py --dims layers=24,hidden=1024,... --from tp=2,pp=2 --to tp=4,pp=1 SRC OUT
       naive_reshard.py --compare-pt OUT_PT OUT_ST   # the .pt output equals the .safetensors output
"""
import argparse
import json
import os
import re
import struct
import sys

import torch

DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
NAMES = {v: k for k, v in DTYPES.items()}

LAYER = re.compile(r"^language_model\.encoder\.layers\.(\d+)\.(.*)$")
# Megatron-LM legacy GPT: tensor-parallel split dim of each (layer-local) name;
# anything not listed is replicated across tp.
LAYER_SPLIT = {
    "self_attention.query_key_value.weight": 0,
    "self_attention.query_key_value.bias": 0,
    "self_attention.dense.weight": 1,
    "mlp.dense_h_to_4h.weight": 0,
    "mlp.dense_h_to_4h.bias": 0,
    "mlp.dense_4h_to_h.weight": 1,
}
FIRST = {"language_model.embedding.word_embeddings.weight": 0,
         "language_model.embedding.position_embeddings.weight": None}
LAST = {"language_model.encoder.final_layernorm.weight": None,
        "language_model.encoder.final_layernorm.bias": None}
HEAD = "word_embeddings_for_head.weight"  # tied to the word embeddings; last stage when pp > 1
WORD = "language_model.embedding.word_embeddings.weight"


def parse_kv(text):
    out = {}
    for item in text.split(","):
        k, v = item.split("=")
        out[k] = v
    return out


def parse_config(text):
    kv = parse_kv(text)
    cfg = {"tp": int(kv.get("tp", 1)), "pp": int(kv.get("pp", 1)), "dp": int(kv.get("dp", 1))}
    if "pp_layers" in kv:
        cfg["pp_layers"] = [int(x) for x in kv["pp_layers"].split("+")]
    return cfg


def stage_layers(cfg, layers):
    """(first global layer, count) of every pipeline stage."""
    counts = cfg.get("pp_layers") or [layers // cfg["pp"]] * cfg["pp"]
    assert sum(counts) == layers, "pp does not divide layers; give pp_layers"
    out, first = [], 0
    for c in counts:
        out.append((first, c))
        first += c
    return out


def rank_of(cfg, tp, dp, pp):
    return pp * cfg["dp"] * cfg["tp"] + dp * cfg["tp"] + tp


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = bytearray(os.fstat(f.fileno()).st_size - 8 - n)
        f.readinto(data)
    header.pop("__metadata__", None)
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        dtype = DTYPES[info["dtype"]]
        t = torch.frombuffer(data, dtype=dtype, count=(e - b) // torch.tensor([], dtype=dtype).element_size(),
                             offset=b) if e > b else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"])
    return out


def write_safetensors(path, tensors):
    header, offset = {}, 0
    for name, t in tensors.items():
        n = t.numel() * t.element_size()
        header[name] = {"dtype": NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for t in tensors.values():
            f.write(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def split_dim(name):
    """(placement, layer or None, layer-local suffix, split dim or None)."""
    m = LAYER.match(name)
    if m:
        return "layer", int(m.group(1)), m.group(2), LAYER_SPLIT.get(m.group(2))
    if name in FIRST:
        return "first", None, name, FIRST[name]
    if name in LAST:
        return "last", None, name, LAST[name]
    if name == HEAD:
        return "last", None, name, 0
    raise SystemExit(f"naive_reshard: unknown tensor {name}")


def load_full(src, cfg, layers):
    """The whole model as {global name: tensor}, from dp replica 0 of every (pp, tp) rank."""
    stages = stage_layers(cfg, layers)
    pieces = {}  # global name -> (split dim, [tp pieces])
    for pp in range(cfg["pp"]):
        first, _ = stages[pp]
        for tp in range(cfg["tp"]):
            path = os.path.join(src, f"rank-{rank_of(cfg, tp, 0, pp):05d}", "model.safetensors")
            for name, t in read_safetensors(path).items():
                where, layer, suffix, dim = split_dim(name)
                if where == "layer":
                    name = f"language_model.encoder.layers.{first + layer}.{suffix}"
                if name == HEAD:  # tied: the same global tensor as the word embeddings
                    name = WORD
                parts = pieces.setdefault(name, (dim, {}))[1]
                parts.setdefault(tp, t)  # the tied copy on the last stage is a replica
    full = {}
    for name, (dim, parts) in pieces.items():
        full[name] = parts[0].clone() if dim is None else torch.cat([parts[i] for i in range(cfg["tp"])], dim=dim)
        parts.clear()  # drop the source pieces as soon as the full tensor exists
    return full


def shard(full, name, dim, tp, tp_size):
    t = full[name]
    if dim is None:
        return t
    return torch.chunk(t, tp_size, dim=dim)[tp].clone()  # clone: save only this piece


def write_target(full, out, cfg, layers, fmt):
    stages = stage_layers(cfg, layers)
    layer_names = sorted({split_dim(n)[2] for n in full if split_dim(n)[0] == "layer"})
    for pp in range(cfg["pp"]):
        first, count = stages[pp]
        for tp in range(cfg["tp"]):
            local = {}
            if pp == 0:
                for name, dim in FIRST.items():
                    local[name] = shard(full, name, dim, tp, cfg["tp"])
            for i in range(count):
                for suffix in layer_names:
                    g = f"language_model.encoder.layers.{first + i}.{suffix}"
                    local[f"language_model.encoder.layers.{i}.{suffix}"] = shard(full, g, LAYER_SPLIT.get(suffix), tp,
                                                                                cfg["tp"])
            if pp == cfg["pp"] - 1:
                for name, dim in LAST.items():
                    local[name] = shard(full, name, dim, tp, cfg["tp"])
                if cfg["pp"] > 1:
                    local[HEAD] = shard(full, WORD, 0, tp, cfg["tp"])
            for dp in range(cfg["dp"]):
                d = os.path.join(out, f"rank-{rank_of(cfg, tp, dp, pp):05d}")
                os.makedirs(d, exist_ok=True)
                if fmt == "torch":
                    torch.save(local, os.path.join(d, "model.pt"))
                else:
                    write_safetensors(os.path.join(d, "model.safetensors"), local)


def compare_pt(pt_dir, st_dir):
    ranks = sorted(os.listdir(st_dir))
    assert ranks == sorted(os.listdir(pt_dir)), "different rank directories"
    for r in ranks:
        a = torch.load(os.path.join(pt_dir, r, "model.pt"))
        b = read_safetensors(os.path.join(st_dir, r, "model.safetensors"))
        assert a.keys() == b.keys(), f"{r}: different tensor names"
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, f"{r} {k}: dtype/shape"
            assert torch.equal(a[k].view(torch.uint8), b[k].contiguous().view(torch.uint8)), f"{r} {k}: bytes differ"
    print(f"naive_reshard: {len(ranks)} ranks: model.pt equals model.safetensors tensor for tensor")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dims", help="layers=...,hidden=...")
    ap.add_argument("--from", dest="src_cfg")
    ap.add_argument("--to", dest="dst_cfg")
    ap.add_argument("--format", choices=["torch", "safetensors"], default="torch")
    ap.add_argument("--compare-pt", action="store_true", help="SRC: a torch output, OUT: a safetensors output")
    ap.add_argument("src")
    ap.add_argument("out")
    a = ap.parse_args()
    if a.compare_pt:
        compare_pt(a.src, a.out)
        return
    layers = int(parse_kv(a.dims)["layers"])
    full = load_full(a.src, parse_config(a.src_cfg), layers)
    write_target(full, a.out, parse_config(a.dst_cfg), layers, a.format)


if __name__ == "__main__":
    sys.exit(main())

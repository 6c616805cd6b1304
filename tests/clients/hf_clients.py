"""Hugging Face transformers and safetensors against a ptcfs hf/ tree (docs/hf_format.md).

  hf_clients.py check HF_DIR REF_DIR --arch llama|gpt --dims layers=..,hidden=..,...
      REF_DIR/rank-00000/model.safetensors holds the model's global tensors
      (`ptcfs synth --config tp=1`). Checks, in float64:
        - model.safetensors.index.json names every tensor once, each in the shard
          that holds it; safetensors.safe_open reads every shard (every tensor
          read, "format": "pt" metadata); config.json has the dims;
        - every HF tensor equals, bit for bit, the one this script cuts from the
          global tensors itself (q/k/v per query group of linear_qkv, [gate; up]
          of linear_fc1; legacy Megatron's query_key_value as it is);
        - transformers' from_pretrained(HF_DIR) gives the logits of the same
          class built from those independently cut weights, exactly, and the
          logits of a plain float64 forward of the Megatron model written here
          (Megatron-Core's RoPE without interleaving, GQA by query group; legacy
          GPT with learned positions and a tied head) within 1e-4
          (transformers runs RMSNorm and RoPE's angles in float32).
      Prints "CHECK OK".

  hf_clients.py save OUT=llama|llama-tied|gpt ... [--dtype f32|bf16] [--shard-size 100KB]
      For each, a tiny model (LlamaForCausalLM with GQA, untied or tied, or
      GPTBigCodeForCausalLM without multi-query; seeded, every tensor random)
      saved by save_pretrained(OUT, max_shard_size=...). Prints "SAVE OK".

  hf_clients.py same A B [A2 B2 ...]
      Each pair of HF directories holds the same tensors (names, dtypes, shapes,
      bytes) and the same sizes in config.json (the experts' too). Prints "SAME OK".

  (Mixtral and Qwen3-MoE: hf_moe_clients.py.)
"""

import argparse
import json
import math
import os
import sys
import warnings

warnings.filterwarnings("ignore")

import torch
from safetensors import safe_open
from safetensors.torch import load_file

TOKENS = torch.Generator().manual_seed(1)


def parse_dims(text):
    d = {k: int(v) for k, v in (kv.split("=") for kv in text.split(","))}
    d.setdefault("ffn", 4 * d["hidden"])
    d.setdefault("kv_heads", d["heads"])
    d.setdefault("head_dim", d["hidden"] // d["heads"])
    return d


def read_hf(hf_dir):
    """{name: tensor} of every shard, checking the index against the shards."""
    index_path = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            pairs = json.load(f, object_pairs_hook=lambda p: p)
        weight_map = dict(dict(pairs)["weight_map"])
        names = [k for k, _ in dict(pairs)["weight_map"]]
        assert len(names) == len(set(names)), "the index names a tensor twice"
        files = sorted(set(weight_map.values()))
    else:
        weight_map, files = None, ["model.safetensors"]
    tensors, where = {}, {}
    for file in files:
        with safe_open(os.path.join(hf_dir, file), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}, f"{file}: metadata {f.metadata()}"
            for name in f.keys():
                assert name not in tensors, f"{name} in {file} and {where[name]}"
                tensors[name], where[name] = f.get_tensor(name), file
    if weight_map is not None:
        assert set(weight_map) == set(tensors), set(weight_map) ^ set(tensors)
        for name, file in weight_map.items():
            assert where[name] == file, f"{name}: index says {file}, found in {where[name]}"
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    if weight_map is not None:
        with open(index_path) as f:
            assert json.load(f)["metadata"]["total_size"] == total
    return tensors, len(files)


def llama_from_globals(g, d, tied):
    """HF Llama's tensors cut from Megatron-Core's global tensors, by this script's own rules."""
    hd, kv, per = d["head_dim"], d["kv_heads"], d["heads"] // d["kv_heads"]
    out = {"model.embed_tokens.weight": g["embedding.word_embeddings.weight"],
           "model.norm.weight": g["decoder.final_layernorm.weight"]}
    if not tied:
        out["lm_head.weight"] = g["output_layer.weight"]
    for i in range(d["layers"]):
        p, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = g[p + "self_attention.linear_qkv.weight"].view(kv, (per + 2) * hd, -1)
        out[h + "self_attn.q_proj.weight"] = qkv[:, :per * hd].reshape(-1, qkv.shape[-1])
        out[h + "self_attn.k_proj.weight"] = qkv[:, per * hd:(per + 1) * hd].reshape(-1, qkv.shape[-1])
        out[h + "self_attn.v_proj.weight"] = qkv[:, (per + 1) * hd:].reshape(-1, qkv.shape[-1])
        out[h + "self_attn.o_proj.weight"] = g[p + "self_attention.linear_proj.weight"]
        gate, up = g[p + "mlp.linear_fc1.weight"].chunk(2, dim=0)
        out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = gate, up
        out[h + "mlp.down_proj.weight"] = g[p + "mlp.linear_fc2.weight"]
        out[h + "input_layernorm.weight"] = g[p + "self_attention.linear_qkv.layer_norm_weight"]
        out[h + "post_attention_layernorm.weight"] = g[p + "mlp.linear_fc1.layer_norm_weight"]
    return {k: v.contiguous() for k, v in out.items()}


def gpt_from_globals(g, d):
    L = "language_model."
    out = {"transformer.wte.weight": g[L + "embedding.word_embeddings.weight"],
           "transformer.wpe.weight": g[L + "embedding.position_embeddings.weight"],
           "transformer.ln_f.weight": g[L + "encoder.final_layernorm.weight"],
           "transformer.ln_f.bias": g[L + "encoder.final_layernorm.bias"]}
    names = {"ln_1": "input_layernorm", "attn.c_attn": "self_attention.query_key_value",
             "attn.c_proj": "self_attention.dense", "ln_2": "post_attention_layernorm",
             "mlp.c_fc": "mlp.dense_h_to_4h", "mlp.c_proj": "mlp.dense_4h_to_h"}
    for i in range(d["layers"]):
        for hf, mg in names.items():
            for kind in ("weight", "bias"):
                out[f"transformer.h.{i}.{hf}.{kind}"] = g[f"{L}encoder.layers.{i}.{mg}.{kind}"]
    return out


def causal_attention(q, k, v):
    """q [b, h, s, d], k/v [b, h, s, d]: softmax(q k^T / sqrt(d)) v, causal, float64."""
    s = q.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def llama_reference(g, d, tokens, eps, theta, tied):
    """Megatron-Core's GPT (RMSNorm, SwiGLU, RoPE without interleaving, GQA) on the global tensors."""
    hd, kv, heads = d["head_dim"], d["kv_heads"], d["heads"]
    per = heads // kv
    b, s = tokens.shape

    def rms(x, w):
        return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    freqs = torch.outer(torch.arange(s, dtype=torch.float64), inv)
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()

    def rope(x):  # x [b, h, s, hd]: x cos + rotate_half(x) sin
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    x = g["embedding.word_embeddings.weight"][tokens]
    for i in range(d["layers"]):
        p = f"decoder.layers.{i}."
        h = rms(x, g[p + "self_attention.linear_qkv.layer_norm_weight"])
        qkv = (h @ g[p + "self_attention.linear_qkv.weight"].T).view(b, s, kv, (per + 2) * hd)
        q = qkv[..., :per * hd].reshape(b, s, heads, hd).transpose(1, 2)
        k = qkv[..., per * hd:(per + 1) * hd].transpose(1, 2)
        v = qkv[..., (per + 1) * hd:].transpose(1, 2)
        k, v = k.repeat_interleave(per, dim=1), v.repeat_interleave(per, dim=1)  # head j reads group j // per
        a = causal_attention(rope(q), rope(k), v).transpose(1, 2).reshape(b, s, heads * hd)
        x = x + a @ g[p + "self_attention.linear_proj.weight"].T
        h = rms(x, g[p + "mlp.linear_fc1.layer_norm_weight"])
        gate, up = (h @ g[p + "mlp.linear_fc1.weight"].T).chunk(2, dim=-1)
        x = x + (torch.nn.functional.silu(gate) * up) @ g[p + "mlp.linear_fc2.weight"].T
    x = rms(x, g["decoder.final_layernorm.weight"])
    return x @ g["embedding.word_embeddings.weight" if tied else "output_layer.weight"].T


def gpt_reference(g, d, tokens, eps):
    """Legacy Megatron-LM GPT: learned positions, LayerNorm, q/k/v per head, tanh GeLU, tied head."""
    L = "language_model."
    heads, hd = d["heads"], d["hidden"] // d["heads"]
    b, s = tokens.shape

    def ln(x, name):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), g[name + ".weight"], g[name + ".bias"], eps)

    def linear(x, name):
        return x @ g[name + ".weight"].T + g[name + ".bias"]

    x = g[L + "embedding.word_embeddings.weight"][tokens] + g[L + "embedding.position_embeddings.weight"][:s]
    for i in range(d["layers"]):
        p = f"{L}encoder.layers.{i}."
        qkv = linear(ln(x, p + "input_layernorm"), p + "self_attention.query_key_value").view(b, s, heads, 3 * hd)
        q, k, v = (t.transpose(1, 2) for t in qkv.split(hd, dim=-1))
        x = x + linear(causal_attention(q, k, v).transpose(1, 2).reshape(b, s, -1), p + "self_attention.dense")
        h = linear(ln(x, p + "post_attention_layernorm"), p + "mlp.dense_h_to_4h")
        x = x + linear(torch.nn.functional.gelu(h, approximate="tanh"), p + "mlp.dense_4h_to_h")
    return ln(x, L + "encoder.final_layernorm") @ g[L + "embedding.word_embeddings.weight"].T


def check(args):
    import transformers
    d = parse_dims(args.dims)
    with open(os.path.join(args.hf_dir, "config.json")) as f:
        config = json.load(f)
    g = load_file(os.path.join(args.ref_dir, "rank-00000", "model.safetensors"))
    tied = config["tie_word_embeddings"]
    if args.arch == "llama":
        sizes = {"num_hidden_layers": "layers", "hidden_size": "hidden", "num_attention_heads": "heads",
                 "num_key_value_heads": "kv_heads", "head_dim": "head_dim", "intermediate_size": "ffn",
                 "vocab_size": "vocab", "max_position_embeddings": "seq"}
        cls = transformers.LlamaForCausalLM
        want = llama_from_globals(g, d, tied)
    else:
        sizes = {"n_layer": "layers", "n_embd": "hidden", "n_head": "heads", "n_inner": "ffn", "vocab_size": "vocab",
                 "n_positions": "seq"}
        cls = transformers.GPTBigCodeForCausalLM
        want = gpt_from_globals(g, d)
        assert tied and not config["multi_query"], config
    for key, dim in sizes.items():
        assert config[key] == d[dim], f"config.json {key} = {config[key]}, dims {dim} = {d[dim]}"

    got, shards = read_hf(args.hf_dir)
    assert set(got) == set(want), f"names differ: {sorted(set(got) ^ set(want))[:6]}"
    for name, t in want.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), f"{name} differs from the cut of the globals"

    tokens = torch.randint(0, d["vocab"], (2, min(16, d["seq"])), generator=TOKENS)
    loaded = cls.from_pretrained(args.hf_dir, dtype=torch.float64).eval()
    built = cls(loaded.config).to(torch.float64).eval()
    missing, unexpected = built.load_state_dict({k: v.double() for k, v in want.items()}, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)
    if tied:
        built.tie_weights()
    with torch.no_grad():
        a, b = loaded(tokens).logits, built(tokens).logits
    assert torch.equal(a, b), f"from_pretrained's logits differ from the independent cut's by {(a - b).abs().max()}"
    gd = {k: v.double() for k, v in g.items()}
    with torch.no_grad():
        if args.arch == "llama":
            theta = config.get("rope_theta") or config.get("rope_parameters", {}).get("rope_theta")
            ref = llama_reference(gd, d, tokens, config["rms_norm_eps"], theta, tied)
        else:
            ref = gpt_reference(gd, d, tokens, config["layer_norm_epsilon"])
    diff = (a - ref).abs().max().item()
    assert diff < 1e-4, f"logits differ from the Megatron model's by {diff}"
    print(f"CHECK OK: {len(got)} tensors in {shards} shards, logits {tuple(a.shape)} exact, "
          f"{diff:.1e} from the Megatron forward")
    return 0


def save(args):
    import transformers
    for spec in args.models:
        out, kind = spec.split("=")
        torch.manual_seed(0)
        if kind in ("llama", "llama-tied"):
            config = transformers.LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                                              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                              rms_norm_eps=1e-5, tie_word_embeddings=kind == "llama-tied")
            model = transformers.LlamaForCausalLM(config)
        else:
            config = transformers.GPTBigCodeConfig(vocab_size=96, n_embd=64, n_head=4, n_inner=128, n_layer=4,
                                                   n_positions=32, multi_query=False, bos_token_id=0, eos_token_id=0)
            model = transformers.GPTBigCodeForCausalLM(config)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_()
        model = model.to({"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype])
        model.save_pretrained(out, max_shard_size=args.shard_size)
        print(f"{out}: {sorted(os.listdir(out))}")
    print(f"SAVE OK: {len(args.models)} models")
    return 0


def same_pair(dir_a, dir_b):
    a, _ = read_hf(dir_a)
    b, _ = read_hf(dir_b)
    assert list(sorted(a)) == list(sorted(b)), sorted(set(a) ^ set(b))
    for name in a:
        x, y = a[name], b[name]
        assert x.dtype == y.dtype and x.shape == y.shape, f"{name}: {x.dtype} {x.shape} != {y.dtype} {y.shape}"
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), f"{name}: bytes differ"
    configs = []
    for d in (dir_a, dir_b):
        with open(os.path.join(d, "config.json")) as f:
            configs.append(json.load(f))
    for key in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "max_position_embeddings", "tie_word_embeddings", "rms_norm_eps",
                "n_embd", "n_head", "n_inner", "n_layer", "n_positions", "num_local_experts", "num_experts",
                "num_experts_per_tok", "moe_intermediate_size", "mlp_only_layers", "decoder_sparse_step",
                "shared_expert_intermediate_size", "qkv_bias"):
        assert configs[0].get(key) == configs[1].get(key), f"config.json {key}: {configs[0].get(key)} != {configs[1].get(key)}"
    print(f"{dir_a} = {dir_b}: {len(a)} tensors")


def same(args):
    assert len(args.dirs) % 2 == 0, "same takes pairs of directories"
    for i in range(0, len(args.dirs), 2):
        same_pair(args.dirs[i], args.dirs[i + 1])
    print(f"SAME OK: {len(args.dirs) // 2} pairs")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("check")
    p.add_argument("hf_dir")
    p.add_argument("ref_dir")
    p.add_argument("--arch", choices=("llama", "gpt"), default="llama")
    p.add_argument("--dims", required=True)
    p = sub.add_parser("save")
    p.add_argument("models", nargs="+", help="OUT=llama|llama-tied|gpt")
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    p.add_argument("--shard-size", default="100KB")
    p = sub.add_parser("same")
    p.add_argument("dirs", nargs="+", help="A B [A2 B2 ...]")
    args = parser.parse_args()
    return {"check": check, "save": save, "same": same}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())

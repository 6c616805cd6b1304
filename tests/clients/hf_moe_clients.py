"""transformers' mixtures of experts (Mixtral, Qwen3-MoE, Qwen2-MoE) against a ptcfs hf/ tree (docs/hf_format.md).

  hf_moe_clients.py check HF_DIR REF_DIR --arch mixtral|qwen3_moe|qwen2_moe --dims layers=..,experts=..,...
      REF_DIR/rank-00000/model.safetensors holds the model's global tensors in
      Megatron-Core's names (`ptcfs synth --config tp=1`, or `ptcfs export
      --config tp=1`). Checks, in float64:
        - every shard reads with safetensors, the index names each tensor once
          (hf_clients.read_hf); config.json has the dims (experts, their ffn,
          the dense layers as Qwen3-MoE's mlp_only_layers);
        - every HF tensor equals, bit for bit, the one this script cuts from the
          global tensors itself (an expert's w1/gate_proj and w3/up_proj the
          halves of its linear_fc1, w2/down_proj its linear_fc2, the router
          the gate, q/k norms Megatron-Core's q_layernorm/k_layernorm, Qwen2-MoE's
          shared_expert the halves of shared_experts.linear_fc1 and its
          shared_expert_gate Megatron-Core's shared_experts.gate_weight);
        - transformers' from_pretrained(HF_DIR) gives the logits of the same
          class built from those independently cut weights, exactly, and those
          of a plain float64 forward of the Megatron-Core MoE model written here
          (top-k routing on the router's softmax, renormalised; each expert a
          SwiGLU MLP; the shared experts' SwiGLU times the sigmoid of their gate,
          as Megatron-Core's SharedExpertMLP with moe_shared_expert_gate) within 1e-4.
      Prints "CHECK OK".

  hf_moe_clients.py save OUT=mixtral|qwen3_moe|qwen3_moe_all|qwen2_moe ... [--dtype f32|bf16] [--shard-size 100KB]
      For each, a tiny model (MixtralForCausalLM, every layer MoE; or
      Qwen3MoeForCausalLM with layer 0 dense, or none: _all, q/k norms; or
      Qwen2MoeForCausalLM with layer 0 dense, a shared expert and its gate, no
      q/k/v biases) of random weights
      (seeded) saved by transformers' own save_pretrained. Prints "SAVE OK".

  (hf_clients.py same compares two HF directories byte for byte.)
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_clients import causal_attention, parse_dims, read_hf  # noqa: E402

TOKENS = torch.Generator().manual_seed(2)


def moe_dims(text):
    d = parse_dims(text)
    d.setdefault("moe_ffn", d["ffn"])
    d.setdefault("moe_every", 1)
    d.setdefault("dense_first", 0)
    return d


def is_moe(d, layer):
    return layer >= d["dense_first"] and layer % d["moe_every"] == 0


def moe_from_globals(g, d, arch, tied):
    """The HF tensors cut from Megatron-Core's global tensors, by this script's own rules."""
    hd, kv, per = d["head_dim"], d["kv_heads"], d["heads"] // d["kv_heads"]
    out = {"model.embed_tokens.weight": g["embedding.word_embeddings.weight"],
           "model.norm.weight": g["decoder.final_layernorm.weight"]}
    if not tied:
        out["lm_head.weight"] = g["output_layer.weight"]
    block = "block_sparse_moe" if arch == "mixtral" else "mlp"
    names = ("w1", "w3", "w2") if arch == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    for i in range(d["layers"]):
        p, h = f"decoder.layers.{i}.", f"model.layers.{i}."
        qkv = g[p + "self_attention.linear_qkv.weight"].view(kv, (per + 2) * hd, -1)
        out[h + "self_attn.q_proj.weight"] = qkv[:, :per * hd].reshape(-1, qkv.shape[-1])
        out[h + "self_attn.k_proj.weight"] = qkv[:, per * hd:(per + 1) * hd].reshape(-1, qkv.shape[-1])
        out[h + "self_attn.v_proj.weight"] = qkv[:, (per + 1) * hd:].reshape(-1, qkv.shape[-1])
        out[h + "self_attn.o_proj.weight"] = g[p + "self_attention.linear_proj.weight"]
        if arch == "qwen3_moe":
            out[h + "self_attn.q_norm.weight"] = g[p + "self_attention.q_layernorm.weight"]
            out[h + "self_attn.k_norm.weight"] = g[p + "self_attention.k_layernorm.weight"]
        out[h + "input_layernorm.weight"] = g[p + "self_attention.linear_qkv.layer_norm_weight"]
        if not is_moe(d, i):
            gate, up = g[p + "mlp.linear_fc1.weight"].chunk(2, dim=0)
            out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = gate, up
            out[h + "mlp.down_proj.weight"] = g[p + "mlp.linear_fc2.weight"]
            out[h + "post_attention_layernorm.weight"] = g[p + "mlp.linear_fc1.layer_norm_weight"]
            continue
        out[h + "post_attention_layernorm.weight"] = g[p + "pre_mlp_layernorm.weight"]
        out[h + block + ".gate.weight"] = g[p + "mlp.router.weight"]
        for e in range(d["experts"]):
            x = f"{p}mlp.experts.local_experts.{e}."
            gate, up = g[x + "linear_fc1.weight"].chunk(2, dim=0)
            w1, w3, w2 = names
            out[f"{h}{block}.experts.{e}.{w1}.weight"] = gate
            out[f"{h}{block}.experts.{e}.{w3}.weight"] = up
            out[f"{h}{block}.experts.{e}.{w2}.weight"] = g[x + "linear_fc2.weight"]
        if arch == "qwen2_moe":
            gate, up = g[p + "mlp.shared_experts.linear_fc1.weight"].chunk(2, dim=0)
            out[h + "mlp.shared_expert.gate_proj.weight"], out[h + "mlp.shared_expert.up_proj.weight"] = gate, up
            out[h + "mlp.shared_expert.down_proj.weight"] = g[p + "mlp.shared_experts.linear_fc2.weight"]
            out[h + "mlp.shared_expert_gate.weight"] = g[p + "mlp.shared_experts.gate_weight"]
    return {k: v.contiguous() for k, v in out.items()}


def moe_reference(g, d, tokens, eps, theta, tied, top_k, qk_norm):
    """Megatron-Core's GPT with MoE layers on the global tensors, float64."""
    hd, kv, heads = d["head_dim"], d["kv_heads"], d["heads"]
    per = heads // kv
    b, s = tokens.shape
    silu = torch.nn.functional.silu

    def rms(x, w):
        return w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)

    inv = 1.0 / theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    freqs = torch.outer(torch.arange(s, dtype=torch.float64), inv)
    cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()

    def rope(x):
        x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def swiglu(h, fc1, fc2):
        gate, up = (h @ fc1.T).chunk(2, dim=-1)
        return (silu(gate) * up) @ fc2.T

    x = g["embedding.word_embeddings.weight"][tokens]
    for i in range(d["layers"]):
        p = f"decoder.layers.{i}."
        h = rms(x, g[p + "self_attention.linear_qkv.layer_norm_weight"])
        qkv = (h @ g[p + "self_attention.linear_qkv.weight"].T).view(b, s, kv, (per + 2) * hd)
        q = qkv[..., :per * hd].reshape(b, s, heads, hd).transpose(1, 2)
        k = qkv[..., per * hd:(per + 1) * hd].transpose(1, 2)
        v = qkv[..., (per + 1) * hd:].transpose(1, 2)
        if qk_norm:
            q = rms(q, g[p + "self_attention.q_layernorm.weight"])
            k = rms(k, g[p + "self_attention.k_layernorm.weight"])
        k, v = k.repeat_interleave(per, dim=1), v.repeat_interleave(per, dim=1)
        a = causal_attention(rope(q), rope(k), v).transpose(1, 2).reshape(b, s, heads * hd)
        x = x + a @ g[p + "self_attention.linear_proj.weight"].T
        if not is_moe(d, i):
            h = rms(x, g[p + "mlp.linear_fc1.layer_norm_weight"])
            x = x + swiglu(h, g[p + "mlp.linear_fc1.weight"], g[p + "mlp.linear_fc2.weight"])
            continue
        h = rms(x, g[p + "pre_mlp_layernorm.weight"])
        probs = torch.softmax(h @ g[p + "mlp.router.weight"].T, dim=-1)
        top = torch.topk(probs, top_k, dim=-1)
        weights = torch.zeros_like(probs).scatter(-1, top.indices, top.values / top.values.sum(-1, keepdim=True))
        for e in range(d["experts"]):
            x_e = f"{p}mlp.experts.local_experts.{e}."
            x = x + weights[..., e:e + 1] * swiglu(h, g[x_e + "linear_fc1.weight"], g[x_e + "linear_fc2.weight"])
        if p + "mlp.shared_experts.linear_fc1.weight" in g:  # SharedExpertMLP: sigmoid(h @ gate_weight^T) * MLP(h)
            sh = p + "mlp.shared_experts."
            gate = torch.sigmoid(h @ g[sh + "gate_weight"].T)
            x = x + gate * swiglu(h, g[sh + "linear_fc1.weight"], g[sh + "linear_fc2.weight"])
    x = rms(x, g["decoder.final_layernorm.weight"])
    return x @ g["embedding.word_embeddings.weight" if tied else "output_layer.weight"].T


def check_config(config, d, arch):
    sizes = {"num_hidden_layers": "layers", "hidden_size": "hidden", "num_attention_heads": "heads",
             "num_key_value_heads": "kv_heads", "head_dim": "head_dim", "vocab_size": "vocab",
             "max_position_embeddings": "seq"}
    if arch == "mixtral":
        sizes["intermediate_size"] = "moe_ffn"
        assert d["dense_first"] == 0 and d["moe_every"] == 1, "Mixtral: every layer MoE"
    else:
        sizes["intermediate_size"] = "ffn"
        sizes["moe_intermediate_size"] = "moe_ffn"
        dense = [i for i in range(d["layers"]) if not is_moe(d, i)]
        assert config["mlp_only_layers"] == dense and config.get("decoder_sparse_step", 1) == 1, config
    if arch == "qwen2_moe":
        sizes["shared_expert_intermediate_size"] = "shared_ffn"
        assert config["qkv_bias"] is False, "the llama schema has no q/k/v biases"
    experts = config.get("num_local_experts", config.get("num_experts"))
    assert experts == d["experts"], f"config.json has {experts} experts, dims {d['experts']}"
    for key, dim in sizes.items():
        assert config[key] == d[dim], f"config.json {key} = {config[key]}, dims {dim} = {d[dim]}"


def check(args):
    import transformers
    d = moe_dims(args.dims)
    with open(os.path.join(args.hf_dir, "config.json")) as f:
        config = json.load(f)
    assert config["model_type"] == args.arch, config["model_type"]
    check_config(config, d, args.arch)
    g = load_file(os.path.join(args.ref_dir, "rank-00000", "model.safetensors"))
    tied = config["tie_word_embeddings"]
    want = moe_from_globals(g, d, args.arch, tied)
    got, shards = read_hf(args.hf_dir)
    assert set(got) == set(want), f"names differ: {sorted(set(got) ^ set(want))[:6]}"
    for name, t in want.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), f"{name} differs from the cut of the globals"

    cls = {"mixtral": transformers.MixtralForCausalLM, "qwen3_moe": transformers.Qwen3MoeForCausalLM,
           "qwen2_moe": transformers.Qwen2MoeForCausalLM}[args.arch]
    tokens = torch.randint(0, d["vocab"], (2, min(16, d["seq"])), generator=TOKENS)
    # float64: the experts computed one by one (transformers 5's grouped_mm takes no doubles).
    loaded = cls.from_pretrained(args.hf_dir, dtype=torch.float64, experts_implementation="eager").eval()
    if args.arch != "mixtral":
        assert loaded.config.norm_topk_prob, "the reference renormalises the top-k weights"
    # The same class from the independently cut weights, written by safetensors beside the config:
    # transformers' own conversion fuses the experts of both alike.
    with tempfile.TemporaryDirectory() as tmp:
        save_file(want, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        shutil.copy(os.path.join(args.hf_dir, "config.json"), tmp)
        built = cls.from_pretrained(tmp, dtype=torch.float64, experts_implementation="eager").eval()
    with torch.no_grad():
        a, b = loaded(tokens).logits, built(tokens).logits
    assert torch.equal(a, b), f"from_pretrained's logits differ from the independent cut's by {(a - b).abs().max()}"
    gd = {k: v.double() for k, v in g.items()}
    theta = config.get("rope_theta") or config.get("rope_parameters", {}).get("rope_theta")
    with torch.no_grad():
        ref = moe_reference(gd, d, tokens, config["rms_norm_eps"], theta, tied, config["num_experts_per_tok"],
                            args.arch == "qwen3_moe")
    diff = (a - ref).abs().max().item()
    assert diff < 1e-4, f"logits differ from the Megatron model's by {diff}"
    print(f"CHECK OK: {args.arch}, {len(got)} tensors in {shards} shards, logits {tuple(a.shape)} exact, "
          f"{diff:.1e} from the Megatron forward")
    return 0


def save(args):
    import transformers
    for spec in args.models:
        out, kind = spec.split("=")
        torch.manual_seed(0)
        common = dict(vocab_size=96, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=32, num_experts_per_tok=2, tie_word_embeddings=False)
        if kind == "mixtral":
            config = transformers.MixtralConfig(intermediate_size=48, num_hidden_layers=3, num_local_experts=4,
                                                rms_norm_eps=1e-5, **common)
            model = transformers.MixtralForCausalLM(config)
        elif kind == "qwen2_moe":
            config = transformers.Qwen2MoeConfig(intermediate_size=96, moe_intermediate_size=32,
                                                 shared_expert_intermediate_size=40, num_hidden_layers=4,
                                                 num_experts=4, mlp_only_layers=[0], decoder_sparse_step=1,
                                                 norm_topk_prob=True, qkv_bias=False, **common)
            model = transformers.Qwen2MoeForCausalLM(config)
        else:
            config = transformers.Qwen3MoeConfig(intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=4,
                                                 head_dim=16, num_experts=4,
                                                 mlp_only_layers=[] if kind == "qwen3_moe_all" else [0],
                                                 decoder_sparse_step=1, norm_topk_prob=True, **common)
            model = transformers.Qwen3MoeForCausalLM(config)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_()
        model = model.to({"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype])
        model.save_pretrained(out, max_shard_size=args.shard_size)
        print(f"{out}: {sorted(os.listdir(out))}")
    print(f"SAVE OK: {len(args.models)} models")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("check")
    p.add_argument("hf_dir")
    p.add_argument("ref_dir")
    p.add_argument("--arch", choices=("mixtral", "qwen3_moe", "qwen2_moe"), required=True)
    p.add_argument("--dims", required=True)
    p = sub.add_parser("save")
    p.add_argument("models", nargs="+", help="OUT=mixtral|qwen3_moe|qwen3_moe_all|qwen2_moe")
    p.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    p.add_argument("--shard-size", default="100KB")
    args = parser.parse_args()
    return {"check": check, "save": save}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())

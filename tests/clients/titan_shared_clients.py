"""torchtitan's MoE with shared experts (torchtitan 0.3, from PyPI) against ptcfs's DCP keys in its names.

torchtitan's Qwen3 builder (_build_qwen3_moe_layers) takes no shared experts, so
each layer's MoE.Config gets torchtitan's own FeedForward config as its
shared_experts (make_ffn_config: MoE.shared_experts.w1/w2/w3, what its
DeepSeek-V3 builder gives them), and, without q/k norms (a Mixtral-shaped
store), its GQA config gets no qk_norm (torchtitan's make_gqa_config default).
The model is built from DIMS (ptcfs's dims string: experts, moe_ffn,
shared_ffn, ...); every layer MoE. The harness is titan_clients.py's (gloo
processes, torchtitan's flattening of the model and the optimizer, train_state/...).

The reference is independent of ptcfs's torchtitan names: TORCH_DCP_DIR is the
store's own tensors under torch's keys (`ptcfs export --format dcp`: Megatron-Core
names), loaded with dcp and cut into torchtitan's keys here (linear_qkv per
query group into wq/wk/wv, no RoPE permutation: Qwen3's CosSinRoPE is HF's
rotate-half; each [gate; up] linear_fc1 halved into w1/w3; the experts stacked
[experts, ...]; Adam's moments alike, q/k/v as the one fused wqkv the optimizer
keeps, linear_qkv's rows as they are).

  titan_shared_clients.py load DCP_DIR DIMS TORCH_DCP_DIR [--no-qk-norm] --procs N
      dcp.load in N processes, into plain tensors and Shard(0) DTensors (the
      stacked experts expert-parallel), equals the reference (zero expert
      biases), Adam's moments included; each layer's MoE block (routed and
      shared experts) gives the same output. Prints "LOAD OK".

  titan_shared_clients.py save OUT_DIR SEED DIMS [--no-qk-norm] --procs N
      N processes save values drawn from SEED (titan_clients.Save). Prints "SAVE OK".

  titan_shared_clients.py torch TORCH_DCP_DIR SEED DIMS [--no-qk-norm]
      The store's tensors under torch's keys, cut here into torchtitan's,
      equal the values SEED draws, bit for bit (what a save imported).
      Prints "TORCH OK".
"""

import argparse
import os
import sys

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import Shard, distribute_tensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import titan_clients as tc  # noqa: E402

from torchtitan.models.common import Embedding, Linear  # noqa: E402
from torchtitan.models.common.config_utils import make_ffn_config  # noqa: E402
from torchtitan.models.common.rope import CosSinRoPE  # noqa: E402
from torchtitan.models.qwen3 import Qwen3Model, _build_qwen3_moe_layers, _qwen3_norm  # noqa: E402

BIAS = ".moe.expert_bias_E"
NO_QK = "+no-qk"  # appended to DIMS: a model without q/k norms


def parse(text):
    qk = not text.endswith(NO_QK)
    d = dict(kv.split("=") for kv in text.removesuffix(NO_QK).split(","))
    d = {k: int(v) for k, v in d.items()}
    d.setdefault("kv_heads", d["heads"])
    d.setdefault("head_dim", d["hidden"] // d["heads"])
    d.setdefault("moe_ffn", d["ffn"])
    assert d.get("dense_first", 0) == 0 and d.get("moe_every", 1) == 1, "every layer MoE"
    return d, qk


def model_config(text):
    """torchtitan's Qwen3 MoE of DIMS, with shared experts (and q/k norms unless +no-qk)."""
    d, qk = parse(text)
    dim, hd, vocab = d["hidden"], d["head_dim"], d["vocab"]
    layers = _build_qwen3_moe_layers(
        fuse_qkv=True, n_layers=d["layers"], dim=dim, n_heads=d["heads"], n_kv_heads=d["kv_heads"],
        head_dim=hd, moe_hidden_dim=d["moe_ffn"], num_experts=d["experts"], top_k=2, attn_backend="flex",
        moe_comm_backend="standard", rope=CosSinRoPE.Config(dim=hd, max_seq_len=d["seq"], theta=10000.0))
    init = {"weight": torch.nn.init.zeros_}
    for layer in layers:
        if d.get("shared_ffn", 0):
            layer.moe.shared_experts = make_ffn_config(dim=dim, hidden_dim=d["shared_ffn"], w1_param_init=init,
                                                       w2w3_param_init=init)
        if not qk:
            layer.attention.qk_norm = None
    return Qwen3Model.Config(
        vocab_size=vocab, dim=dim, norm=_qwen3_norm(dim),
        tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim),
        lm_head=Linear.Config(in_features=dim, out_features=vocab), layers=layers), d


def shard(flat, mesh):
    """Shard(0) DTensors; the buffers replicated."""
    return {k: t if k.endswith(BIAS) else distribute_tensor(t, mesh, [Shard(0)]) for k, t in flat.items()}


# titan_clients' harness over this model (the ranks are forked after it patched them).
tc.model_config = model_config
tc.shard = shard


def titan_of_megatron(g, d, qk, moments):
    """torchtitan's keys cut from the store's tensors `g` (Megatron-Core names) by this script's rules.
    `moments`: Adam's state, whose q/k/v is the optimizer's one fused wqkv."""
    hd, kv, per = d["head_dim"], d["kv_heads"], d["heads"] // d["kv_heads"]
    out = {"tok_embeddings.weight": g["embedding.word_embeddings.weight"],
           "norm.weight": g["decoder.final_layernorm.weight"], "lm_head.weight": g["output_layer.weight"]}
    for i in range(d["layers"]):
        p, t = f"decoder.layers.{i}.", f"layers.{i}."
        qkv = g[p + "self_attention.linear_qkv.weight"]
        if moments:
            out[t + "attention.qkv_linear.wqkv.weight"] = qkv
        else:
            grouped = qkv.view(kv, (per + 2) * hd, -1)
            out[t + "attention.qkv_linear.wq.weight"] = grouped[:, :per * hd].reshape(-1, qkv.shape[-1])
            out[t + "attention.qkv_linear.wk.weight"] = grouped[:, per * hd:(per + 1) * hd].reshape(-1, qkv.shape[-1])
            out[t + "attention.qkv_linear.wv.weight"] = grouped[:, (per + 1) * hd:].reshape(-1, qkv.shape[-1])
        out[t + "attention.wo.weight"] = g[p + "self_attention.linear_proj.weight"]
        if qk:
            out[t + "attention.q_norm.weight"] = g[p + "self_attention.q_layernorm.weight"]
            out[t + "attention.k_norm.weight"] = g[p + "self_attention.k_layernorm.weight"]
        out[t + "attention_norm.weight"] = g[p + "self_attention.linear_qkv.layer_norm_weight"]
        out[t + "ffn_norm.weight"] = g[p + "pre_mlp_layernorm.weight"]
        out[t + "moe.router.gate.weight"] = g[p + "mlp.router.weight"]
        fc1 = [g[f"{p}mlp.experts.local_experts.{e}.linear_fc1.weight"].chunk(2) for e in range(d["experts"])]
        inner = t + "moe.routed_experts.inner_experts."
        out[inner + "w1_EFD"] = torch.stack([gate for gate, _ in fc1])
        out[inner + "w3_EFD"] = torch.stack([up for _, up in fc1])
        out[inner + "w2_EDF"] = torch.stack(
            [g[f"{p}mlp.experts.local_experts.{e}.linear_fc2.weight"] for e in range(d["experts"])])
        if d.get("shared_ffn", 0):
            gate, up = g[p + "mlp.shared_experts.linear_fc1.weight"].chunk(2)
            out[t + "moe.shared_experts.w1.weight"], out[t + "moe.shared_experts.w3.weight"] = gate, up
            out[t + "moe.shared_experts.w2.weight"] = g[p + "mlp.shared_experts.linear_fc2.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def from_torch_keys(torch_dcp_dir, text):
    """The store's tensors (torch keys) as torchtitan's flattened keys: parameters and Adam's moments."""
    d, qk = parse(text)
    meta = dcp.FileSystemReader(torch_dcp_dir).read_metadata()
    flat = {k: torch.empty(m.size, dtype=m.properties.dtype)
            for k, m in meta.state_dict_metadata.items() if hasattr(m, "size")}
    dcp.load(flat, checkpoint_id=torch_dcp_dir, no_dist=True)
    params = {k[len("model."):]: t for k, t in flat.items() if k.startswith("model.")}
    out = titan_of_megatron(params, d, qk, moments=False)
    for kind in ("exp_avg", "exp_avg_sq"):
        state = {k[len("optim.state."):-len(kind) - 1]: t for k, t in flat.items()
                 if k.startswith("optim.state.") and k.endswith("." + kind)}
        if state:
            for name, t in titan_of_megatron(state, d, qk, moments=True).items():
                out[f"optimizer.state.{name}.{kind}"] = t
    return out


def moe_outputs(flat, text):
    """Each layer's MoE block's output (routed and shared experts) on fixed inputs, with `flat`'s weights."""
    cfg, d = model_config(text)
    model = cfg.build()
    model.load_state_dict({k: tc.local(v) for k, v in flat.items() if not k.startswith("optimizer.")})
    x = torch.randn(2, 8, d["hidden"], generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return [layer.moe(x) for layer in model.layers.values()]


class SameOutputs:
    """After `load` (a titan_clients.Load), the MoE blocks' outputs of rank 0's loaded weights
    equal `want`'s, and the shared experts count (they change the output)."""

    def __init__(self, load, want, text):
        self.load, self.want, self.text = load, want, text

    def __call__(self, rank, world):
        self.load(rank, world)
        plain = {k: torch.zeros_like(t) for k, t in self.want.items()}
        tc.dcp.load(tc.nest(plain), checkpoint_id=self.load.args.dir)
        got, want = moe_outputs(plain, self.text), moe_outputs(self.want, self.text)
        for i, (a, b) in enumerate(zip(got, want)):
            if not torch.equal(a, b):
                raise AssertionError(f"rank {rank}: layer {i}'s MoE output differs by {(a - b).abs().max()}")
        unshared = {k: torch.zeros_like(t) if ".moe.shared_experts." in k else t for k, t in plain.items()}
        if parse(self.text)[0].get("shared_ffn", 0) and torch.equal(moe_outputs(unshared, self.text)[0], got[0]):
            raise AssertionError("the shared experts do not change the MoE output")


def template(text):
    keys = tc.titan_template(text)
    d, _ = parse(text)
    shared = sum(".moe.shared_experts." in k and not k.startswith("optimizer.") for k in keys)
    assert shared == 3 * d["layers"] * (d.get("shared_ffn", 0) > 0), f"{shared} shared-expert keys"
    return keys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["load", "save", "torch"])
    ap.add_argument("dir")
    ap.add_argument("rest", nargs="+")
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--no-qk-norm", action="store_true")
    args = ap.parse_args()
    if args.mode == "load":
        text = args.rest[0] + (NO_QK if args.no_qk_norm else "")
        want = from_torch_keys(args.rest[1], text)
        for i in range(parse(text)[0]["layers"]):
            want[f"layers.{i}{BIAS}"] = torch.zeros(parse(text)[0]["experts"], dtype=torch.float32)
        keys = template(text)
        assert set(want) == set(keys), f"the reference's keys are not the model's: {sorted(set(want) ^ set(keys))[:6]}"
        tc.spawn(args.procs, SameOutputs(tc.Load(args, want), want, text))
        print("LOAD OK")
        return
    seed, text = int(args.rest[0]), args.rest[1] + (NO_QK if args.no_qk_norm else "")
    saved = tc.values(seed, template(text))
    if args.mode == "save":
        tc.spawn(args.procs, tc.Save(args, saved, text))
        print("SAVE OK")
    else:
        got = from_torch_keys(args.dir, text)
        want = {k: v for k, v in saved.items() if not k.endswith(BIAS)}
        assert set(got) == set(want), f"keys differ: {sorted(set(got) ^ set(want))[:6]}"
        tc.same(got, want, "the store's tensors cut into torchtitan's keys")
        print("TORCH OK")


if __name__ == "__main__":
    main()

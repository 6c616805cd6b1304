"""DeepSeek-V3's multi-head latent attention through ptcfs's mount: transformers' DeepseekV3ForCausalLM
and torchtitan's DeepSeekV3Model (0.3, its own builder, a small flavour), float32, on the CPU.

The harness is titan_clients.py's (gloo processes, forked, its flattening and comparisons).

  titan_mla_clients.py hf HF_DIR SEED
      DeepseekV3ForCausalLM of a small config (3 layers, the first dense, q compressed, 4 experts
      and a shared one), its weights and router biases (e_score_correction_bias) drawn from SEED,
      save_pretrained into HF_DIR. Prints "HF OK".

  titan_mla_clients.py load DCP_DIR HF_DIR MOUNT_HF_DIR --procs 1,2
      dcp.load of DCP_DIR in 1 and in 2 processes, into plain tensors and Shard(0) DTensors,
      equals torchtitan's own DeepSeekV3StateDictAdapter.from_hf of HF_DIR (the reference,
      independent of ptcfs's names; the router's bias as expert_bias_E); then torchtitan's model
      with those weights and DeepseekV3ForCausalLM.from_pretrained(MOUNT_HF_DIR) give the same
      logits on fixed tokens (max difference <= 1e-3 of the largest logit, float32; torchtitan's
      grouped experts, which compute in bfloat16, in float32 for this check: float32_experts).
      Prints "LOAD OK".

  titan_mla_clients.py save DCP_DIR/step-N SEED HF_DIR MOUNT_HF_DIR --procs 2
      2 processes dcp.save torchtitan's model keys (no optimizer: its expert_bias_E is a buffer
      with no state, which ptcfs's schema cannot mark yet) with values drawn from SEED, each rank
      its Shard(0) (the rename of .metadata commits it); then dcp.load of DCP_DIR (the parent) in
      1 process equals those values, and MOUNT_HF_DIR's tensors are them under HF's names (the
      adapter's to_hf): the bias a torchtitan save wrote is HF's e_score_correction_bias.
      Prints "SAVE OK".
"""

import argparse
import json
import os
import sys

import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import titan_clients as tc  # noqa: E402

from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm  # noqa: E402
from torchtitan.models.deepseek_v3 import DeepSeekV3Model, _build_dsv3_layers  # noqa: E402
from torchtitan.models.deepseek_v3.state_dict_adapter import DeepSeekV3StateDictAdapter  # noqa: E402

HF_CONFIG = dict(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=3,
                 num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=4,
                 kv_lora_rank=12, q_lora_rank=16, qk_rope_head_dim=4, v_head_dim=8, qk_nope_head_dim=8, n_group=1,
                 topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1, max_position_embeddings=16,
                 rms_norm_eps=1e-5, routed_scaling_factor=2.5, norm_topk_prob=True, tie_word_embeddings=False)


def model_config(hf_dir):
    """torchtitan's DeepSeek-V3 of HF_DIR's config.json, by its own builder (its RoPE without yarn)."""
    with open(os.path.join(hf_dir, "config.json")) as f:
        c = json.load(f)
    dim, vocab, rope = c["hidden_size"], c["vocab_size"], c["qk_rope_head_dim"]
    layers = _build_dsv3_layers(
        n_layers=c["num_hidden_layers"], n_dense_layers=c["first_k_dense_replace"], dim=dim,
        n_heads=c["num_attention_heads"], q_lora_rank=c["q_lora_rank"] or 0, kv_lora_rank=c["kv_lora_rank"],
        qk_nope_head_dim=c["qk_nope_head_dim"], qk_rope_head_dim=rope, v_head_dim=c["v_head_dim"], mscale=1.0,
        dense_hidden_dim=c["intermediate_size"], moe_hidden_dim=c["moe_intermediate_size"],
        num_experts=c["n_routed_experts"], num_shared_experts=c["n_shared_experts"],
        router_top_k=c["num_experts_per_tok"], router_score_func="sigmoid", router_num_expert_groups=c["n_group"],
        router_num_limited_groups=c["topk_group"], router_route_scale=c["routed_scaling_factor"],
        router_route_norm=c["norm_topk_prob"], attn_backend="flex", moe_comm_backend="standard",
        non_blocking_capacity_factor=None,
        rope=ComplexRoPE.Config(dim=rope, max_seq_len=c["max_position_embeddings"], theta=10000.0))
    cfg = DeepSeekV3Model.Config(
        vocab_size=vocab, dim=dim, tok_embeddings=Embedding.Config(num_embeddings=vocab, embedding_dim=dim),
        norm=RMSNorm.Config(normalized_shape=dim), lm_head=Linear.Config(in_features=dim, out_features=vocab),
        layers=layers)
    return cfg, c


tc.model_config = model_config  # titan_clients' harness over this model (the ranks are forked after it patched it)


def float32_experts(self, x_RD, num_tokens_per_expert_E):
    """GroupedExperts.forward in float32: torchtitan's casts x and the weights to bfloat16 for
    torch._grouped_mm (0.06 apart from float32 here), so the logits check computes its experts'
    SwiGLU (the same w1, w3, w2 and token groups) in float32; routing, attention and the rest
    stay torchtitan's own."""
    w1, w2, w3 = (tc.local(w) for w in (self.w1_EFD, self.w2_EDF, self.w3_EFD))
    out, start = [], 0
    for e, n in enumerate(num_tokens_per_expert_E.tolist()):
        x = x_RD[start:start + n]
        start += n
        out.append((torch.nn.functional.silu(x @ w1[e].T) * (x @ w3[e].T)) @ w2[e].T)
    return torch.cat(out)


def hf_tensors(hf_dir):
    out = {}
    for name in sorted(os.listdir(hf_dir)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(hf_dir, name)))
    return out


def model_keys(hf_dir):
    return {k: v for k, v in tc.titan_template(hf_dir).items() if not k.startswith("optimizer.")}


def reference(hf_dir):
    """torchtitan's model keys from HF_DIR by its own adapter."""
    cfg, _ = model_config(hf_dir)
    want = dict(DeepSeekV3StateDictAdapter(cfg, None).from_hf(hf_tensors(hf_dir)))
    keys = set(model_keys(hf_dir))
    assert set(want) == keys, f"the adapter's keys are not the model's: {sorted(set(want) ^ keys)[:6]}"
    return want


def write_hf(hf_dir, seed):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(DeepseekV3Config(**HF_CONFIG)).float()
    with torch.no_grad():
        for name, t in model.state_dict().items():  # norms and biases too, not their initial ones
            t.copy_(torch.randn(t.shape) * (0.3 if t.dim() > 1 else 0.1) + (1.0 if name.endswith("norm.weight") else 0))
    model.save_pretrained(hf_dir)


def logits_agree(flat, hf_dir, mount_hf):
    """torchtitan's forward with `flat` and transformers' from MOUNT_HF agree."""
    from transformers import DeepseekV3ForCausalLM
    cfg, c = model_config(hf_dir)
    titan = cfg.build()
    titan.load_state_dict({k: tc.local(v) for k, v in flat.items()})
    for layer in titan.layers.values():
        if layer.moe_enabled:
            experts = layer.moe.routed_experts.inner_experts
            experts.forward = float32_experts.__get__(experts)
    hf = DeepseekV3ForCausalLM.from_pretrained(mount_hf, dtype=torch.float32, attn_implementation="eager")
    tokens = torch.randint(0, c["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(5))
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)  # one document per row: causal
    with torch.no_grad():
        a = titan(tokens, positions, titan.get_attention_masks(positions))
        b = hf(tokens).logits
    diff = (a - b).abs().max().item()
    if diff > 1e-3 * max(1.0, b.abs().max().item()):
        raise AssertionError(f"torchtitan's and transformers' logits differ by {diff}")
    print(f"logits: max difference {diff:.2e} over {tuple(a.shape)}, largest {b.abs().max().item():.2f}")


class SaveModel:
    def __init__(self, args, saved):
        self.args, self.saved = args, saved

    def __call__(self, rank, world):
        mesh = tc.init_device_mesh("cpu", (world,))
        tc.dcp.save(tc.nest(tc.shard(self.saved, mesh)), checkpoint_id=self.args.dir)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["hf", "load", "save"])
    ap.add_argument("dir")
    ap.add_argument("rest", nargs="+")
    ap.add_argument("--procs", default="1")
    args = ap.parse_args()
    if args.mode == "hf":
        write_hf(args.dir, int(args.rest[0]))
        print("HF OK")
    elif args.mode == "load":
        hf_dir, mount_hf = args.rest
        want = reference(hf_dir)
        for procs in args.procs.split(","):
            tc.spawn(int(procs), tc.Load(args, want))
        logits_agree(want, hf_dir, mount_hf)
        print("LOAD OK")
    else:
        seed, hf_dir, mount_hf = int(args.rest[0]), args.rest[1], args.rest[2]
        saved = tc.values(seed, model_keys(hf_dir))
        tc.spawn(int(args.procs), SaveModel(args, saved))
        args.dir = os.path.dirname(args.dir.rstrip("/"))
        tc.spawn(1, tc.Load(args, saved))
        cfg, _ = model_config(hf_dir)
        tc.same(hf_tensors(mount_hf), DeepSeekV3StateDictAdapter(cfg, None).to_hf(saved), "hf/ after the save")
        print("SAVE OK")


if __name__ == "__main__":
    main()

"""The names and shapes DeepSeek-V3's multi-head latent attention has in the real libraries,
for tests/mla_names_test.cc (tests/data/mla_names_golden.json).

Run with the venv's python (transformers 5, torchtitan 0.3, megatron-core 0.16):

  .venv/bin/python tests/mla_names_golden.py > tests/data/mla_names_golden.json

For one small model with experts (q compressed, and not: q_lora_rank 0 / None):
  hf:     the tensors transformers' DeepseekV3ForCausalLM.save_pretrained writes (name, shape),
          and its config.json
  titan:  torchtitan's DeepSeekV3Model state_dict (key, shape), built as its own registry
          builds the flavours (build_mla_moe_layers)
  mcore:  Megatron-Core GPTModel's named_parameters with the local spec's MLASelfAttention
          (get_gpt_layer_local_spec(multi_latent_attention=True, qk_layernorm=True)), in order,
          one process of gloo (Transformer Engine's spec needs TE, which has no CPU build; the local
          spec's core attention refuses MLA's k_channels, so a subclass drops them: it has no parameter;
          and MLA's isinstance(..., TELinear) needs a class where TE's is None)
"""

import json
import os
import sys
import tempfile

import torch

DIMS = dict(layers=3, hidden=16, heads=4, vocab=32, seq=8, ffn=24, q_lora=8, kv_lora=6, qk_nope=4, qk_rope=2,
            v_head=6, experts=4, moe_ffn=8, shared_ffn=8, dense_first=1)


def dims_text(d):
    return ",".join(f"{k}={v}" for k, v in d.items())


def hf(d):
    from safetensors import safe_open
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    config = DeepseekV3Config(
        vocab_size=d["vocab"], hidden_size=d["hidden"], intermediate_size=d["ffn"], moe_intermediate_size=d["moe_ffn"],
        num_hidden_layers=d["layers"], num_attention_heads=d["heads"], num_key_value_heads=d["heads"],
        n_shared_experts=d["shared_ffn"] // d["moe_ffn"], n_routed_experts=d["experts"], kv_lora_rank=d["kv_lora"],
        q_lora_rank=d["q_lora"] or None, qk_rope_head_dim=d["qk_rope"], v_head_dim=d["v_head"],
        qk_nope_head_dim=d["qk_nope"], n_group=1, topk_group=1, num_experts_per_tok=2,
        first_k_dense_replace=d["dense_first"], max_position_embeddings=d["seq"], tie_word_embeddings=False)
    model = DeepseekV3ForCausalLM(config).float()
    with tempfile.TemporaryDirectory() as out:
        model.save_pretrained(out)
        with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
            tensors = sorted([k, list(f.get_slice(k).get_shape())] for k in f.keys())
        with open(os.path.join(out, "config.json")) as f:
            saved = json.load(f)
    return tensors, saved


def titan(d):
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.deepseek_v3 import DeepSeekV3Model, _build_dsv3_layers
    layers = _build_dsv3_layers(
        n_layers=d["layers"], n_dense_layers=d["dense_first"], dim=d["hidden"], n_heads=d["heads"],
        q_lora_rank=d["q_lora"], kv_lora_rank=d["kv_lora"], qk_nope_head_dim=d["qk_nope"],
        qk_rope_head_dim=d["qk_rope"], v_head_dim=d["v_head"], mscale=1.0, dense_hidden_dim=d["ffn"],
        moe_hidden_dim=d["moe_ffn"], num_experts=d["experts"], num_shared_experts=d["shared_ffn"] // d["moe_ffn"],
        router_top_k=2, router_score_func="sigmoid", attn_backend="flex", moe_comm_backend="standard",
        non_blocking_capacity_factor=None,
        rope=ComplexRoPE.Config(dim=d["qk_rope"], max_seq_len=d["seq"], theta=10000.0))
    config = DeepSeekV3Model.Config(
        vocab_size=d["vocab"], dim=d["hidden"],
        tok_embeddings=Embedding.Config(num_embeddings=d["vocab"], embedding_dim=d["hidden"]),
        norm=RMSNorm.Config(normalized_shape=d["hidden"]),
        lm_head=Linear.Config(in_features=d["hidden"], out_features=d["vocab"]), layers=layers)
    with torch.device("meta"):
        model = config.build()
    return [[k, list(v.shape)] for k, v in model.state_dict().items()]


def mcore(d):
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29731")
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "clients"))
    from megatron.core import parallel_state, tensor_parallel
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import MLATransformerConfig
    import mcore_moe
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    torch.cuda.current_device = lambda: "cpu"
    shim = mcore_moe._NoFork()
    tensor_parallel.get_cuda_rng_tracker = lambda *a, **k: shim
    tensor_parallel.random.get_cuda_rng_tracker = lambda *a, **k: shim
    config = MLATransformerConfig(
        num_layers=d["layers"], hidden_size=d["hidden"], num_attention_heads=d["heads"], ffn_hidden_size=d["ffn"],
        q_lora_rank=d["q_lora"] or None, kv_lora_rank=d["kv_lora"], qk_head_dim=d["qk_nope"],
        qk_pos_emb_head_dim=d["qk_rope"], v_head_dim=d["v_head"], normalization="RMSNorm", qk_layernorm=True,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, add_bias_linear=False,
        use_cpu_initialization=True, params_dtype=torch.float32, num_moe_experts=d["experts"],
        moe_ffn_hidden_size=d["moe_ffn"], moe_shared_expert_intermediate_size=d["shared_ffn"],
        moe_layer_freq=[0] * d["dense_first"] + [1] * (d["layers"] - d["dense_first"]), moe_router_topk=2,
        moe_router_enable_expert_bias=True, moe_router_score_function="sigmoid", moe_grouped_gemm=False,
        moe_token_dispatcher_type="allgather", rope_type="rope", apply_rope_fusion=False, bias_activation_fusion=False,
        bias_dropout_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False)
    spec = get_gpt_layer_local_spec(num_experts=d["experts"], moe_grouped_gemm=False, normalization="RMSNorm",
                                    multi_latent_attention=True, qk_layernorm=True)
    # The local spec's DotProductAttention takes no k_channels, which MLA passes (it runs with TE's
    # attention only): a core attention that drops them, so the module tree (no parameters in it) builds.
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class LocalCoreAttention(DotProductAttention):
        def __init__(self, *args, k_channels=None, v_channels=None, **kwargs):
            super().__init__(*args, **kwargs)

    spec.submodules.self_attention.submodules.core_attention = LocalCoreAttention
    import megatron.core.transformer.multi_latent_attention as mla
    if not isinstance(mla.TELinear, type):  # without TE no class, which MLA's isinstance check cannot take
        mla.TELinear = type("NoTELinear", (), {})
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=d["vocab"], max_sequence_length=d["seq"],
                     share_embeddings_and_output_weights=False, position_embedding_type="rope")
    params = [[k, list(v.shape)] for k, v in model.named_parameters()]
    buffers = [[k, list(v.shape)] for k, v in model.state_dict().items() if k.endswith("expert_bias")]
    return params, buffers


def main():
    out = {"dims": dims_text(DIMS)}
    plain = dict(DIMS, q_lora=0)
    out["dims_no_q_lora"] = dims_text(plain)
    out["hf"], out["hf_config"] = hf(DIMS)
    out["hf_no_q_lora"], _ = hf(plain)
    out["titan"] = titan(DIMS)
    out["titan_no_q_lora"] = titan(plain)
    try:
        out["mcore_local"], out["mcore_buffers"] = mcore(DIMS)
    except Exception as e:  # noqa: BLE001: recorded, the test says why it has none
        out["mcore_error"] = f"{type(e).__name__}: {e}"
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()

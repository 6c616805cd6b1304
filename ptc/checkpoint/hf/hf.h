// Hugging Face's view of a model: the tensor names, the cuts of fused tensors
// and the files `save_pretrained` writes (docs/hf_format.md):
//
//   config.json                          the architecture and its sizes
//   model-0000K-of-0000N.safetensors     the tensors, cut into shards of at most
//                                        a size (one shard: model.safetensors)
//   model.safetensors.index.json         which shard holds each tensor (N > 1)
//
// An HF tensor is a LocalTensor whose segments are boxes of the store's global
// tensors, placed densely one after another: Llama's q_proj is the query rows
// of every query group of Megatron-Core's linear_qkv, gate_proj the first half
// of linear_fc1. So a rendering reads each box from the pieces that hold it,
// and an import stores each HF tensor's bytes as one piece of those boxes.
//
// Architectures, recognised by the schema's rule names and the dims (a schema
// of one's own with these names maps too):
//   Megatron-Core GPT (the built-in `llama`)      LlamaForCausalLM
//     with experts=                               MixtralForCausalLM (every layer MoE,
//                                                 no shared experts)
//     with experts= and q/k norms                 Qwen3MoeForCausalLM (dense layers
//     (self_attention.q_layernorm, k_layernorm)   as its mlp_only_layers)
//     with experts=, shared_ffn= and the shared   Qwen2MoeForCausalLM (its shared_expert
//     experts' gate (mlp.shared_experts.          and shared_expert_gate; dense layers
//     gate_weight, SharedGateSchema)              as its mlp_only_layers)
//     with kv_lora= (MLA), experts= and shared_ffn= DeepseekV3ForCausalLM (its router's
//     and the router's expert_bias                e_score_correction_bias; dense layers
//     (ExpertBiasSchema)                          below first_k_dense_replace)
//   legacy Megatron-LM GPT (`megatron-gpt`)       GPTBigCodeForCausalLM (GPT-2
//                                                 with Linear layers, q/k/v per head)
// An expert's HF tensors are cut from its global tensors as a dense MLP's
// (w1/gate_proj the gate half of linear_fc1, w3/up_proj the up half, w2/
// down_proj linear_fc2), one per expert as save_pretrained writes them.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/base/status.h"
#include "ptc/model/dims.h"
#include "ptc/model/schema.h"
#include "ptc/model/view.h"

namespace ptc::hf {

inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kIndexFile = "model.safetensors.index.json";
inline constexpr const char* kSingleFile = "model.safetensors";
// save_pretrained's default max_shard_size ("5GB", decimal).
inline constexpr uint64_t kDefaultShardBytes = 5'000'000'000;

enum class Arch { kLlama, kGptBigCode, kMixtral, kQwen3Moe, kQwen2Moe, kDeepseekV3 };

// config.json's "architectures" entry of `arch` ("MixtralForCausalLM").
const char* ArchName(Arch arch);

// The HF tensors of a model, in the order HF's state_dict lists them.
struct Model {
  Arch arch = Arch::kLlama;
  std::vector<LocalTensor> tensors;  // name: HF's; segments: boxes of global tensors, dense, in order;
                                     // buffer: its global tensor's
  bool tied = false;                 // the output layer is the input embedding (no lm_head.weight)
};

// What MapModel maps beyond Hugging Face's own architectures.
struct MapOptions {
  // Shared experts without a gate (Megatron-Core's mlp.shared_experts.linear_fc1/
  // linear_fc2 and no gate_weight) in a Mixtral or Qwen3-MoE, under DeepSeek-V3's
  // HF names (mlp.shared_experts.{gate,up,down}_proj.weight after the routed
  // experts): torchtitan's MoE has them (dcp.h, TorchtitanTensors); HF's Mixtral
  // and Qwen3-MoE do not, so an export refuses them.
  bool ungated_shared_experts = false;
  // DeepSeek-V3's router without its e_score_correction_bias (a schema without
  // ExpertBiasSchema's rule): torchtitan's expert_bias_E is then carried as
  // saved (dcp.h), where HF's DeepseekV3 needs the tensor.
  bool expert_bias_optional = false;
};

// The HF names and cuts of `spec`'s parameters (optimizer state is not carried).
// \error InvalidArgument naming the rule: a schema with no rule this mapping
//        recognises (or q/k norms without experts: Qwen3ForCausalLM is not
//        mapped); a rule the architecture has no HF tensor for; a rule it
//        needs that the schema lacks; a global tensor whose shape is not the
//        one HF's config gives it (or dims HF's architecture cannot express:
//        GPTBigCode with kv_heads != heads or heads*head_dim != hidden).
Result<Model> MapModel(const ModelSpec& spec, const MapOptions& options = {});

struct Shard {
  std::string file;             // "model-00001-of-00003.safetensors", or kSingleFile
  std::vector<size_t> tensors;  // indices into Model::tensors
  uint64_t bytes = 0;           // of tensor data
};

// What the files are: the model, its shards, config.json and the index.
struct Plan {
  Model model;
  std::vector<Shard> shards;
  std::string config_json;
  std::string index_json;  // empty with one shard (model.safetensors, no index)
};

// Tensors cut greedily in order into shards of at most `max_bytes` of data
// (a tensor larger than that alone in its own), named as save_pretrained names them.
std::vector<Shard> CutShards(const std::vector<LocalTensor>& tensors, uint64_t max_bytes);

// The export of `spec`. `kept`: config.json of the model's import
// (extra["hf"]["config"]), or null: its fields are kept but for the ones the
// model gives (sizes, architecture, dtype, tying), which are written over.
// \error as MapModel; InvalidArgument for max_bytes 0.
Result<Plan> PlanExport(const ModelSpec& spec, uint64_t max_bytes, const nlohmann::json& kept = nullptr);

// The safetensors metadata HF writes in every shard (transformers refuses a
// shard without it).
std::map<std::string, std::string> ShardMetadata();

// "5GB", "500MB", "2GiB", "1000000": bytes (decimal units as HF's
// max_shard_size, binary with "i").
// \error InvalidArgument naming the text.
Result<uint64_t> ParseShardSize(std::string_view text);

// The ptcfs model a config.json describes, for an import.
struct ConfigModel {
  // built-in llama (with a tied output layer when tie_word_embeddings; with
  // Qwen3-MoE's q/k norms, "llama-qk", QkNormSchema; with Qwen2-MoE's shared
  // expert gate, "llama-sg", SharedGateSchema) or megatron-gpt
  Schema schema;
  ModelDims dims;
  Arch arch = Arch::kLlama;
};
// \error InvalidArgument naming `what` and the field: an architecture ptcfs
//        does not map, a missing or non-integer size, a feature the mapping
//        cannot carry (biases in Llama, an activation other than silu,
//        GPTBigCode's multi-query or untied head; Qwen2-MoE's qkv_bias (its
//        default) or sliding window; MoE layers no moe_every/dense_first
//        gives: Qwen2/3-MoE's decoder_sparse_step other than 1, mlp_only_layers
//        not below the first MoE layer and every k-th after), dims ParseDims
//        refuses.
Result<ConfigModel> ModelOfConfig(const nlohmann::json& config, const std::string& what);

// `base` (the llama schema, tied or not) with Megatron-Core's q/k norms
// (self_attention.q_layernorm.weight and k_layernorm.weight, [head_dim] per
// layer, after linear_qkv as SelfAttention registers them), named NAME-qk.
// \error InvalidArgument when `base` has no linear_qkv rule.
Result<Schema> QkNormSchema(const Schema& base);

// `base` (the llama schema, tied or not) with the shared experts' sigmoid gate
// as Megatron-Core's SharedExpertMLP registers it with moe_shared_expert_gate:
// decoder.layers.{i}.mlp.shared_experts.gate_weight [1, hidden] per MoE layer,
// whole on every tp rank, after shared_experts.linear_fc2 (when shared_ffn),
// named NAME-sg. Qwen2-MoE's shared_expert_gate.weight is this tensor.
// \error InvalidArgument when `base` has no shared_experts.linear_fc2 rule.
Result<Schema> SharedGateSchema(const Schema& base);

// `base` (the llama schema, tied or not) with the router's expert bias
// (DeepSeek-V3's auxiliary-loss-free load balancing) as Megatron-Core's
// TopKRouter registers it with moe_router_enable_expert_bias:
// decoder.layers.{i}.mlp.router.expert_bias [experts] per MoE layer, whole on
// every tp rank, after mlp.router.weight, named NAME-eb. HF's DeepseekV3
// mlp.gate.e_score_correction_bias and torchtitan's moe.expert_bias_E are
// this tensor. A buffer in all three, which keep no optimizer state for it:
// the rule is marked "buffer" (a store made before the mark keeps its schema,
// and Adam state for the bias: docs/hf_format.md).
// \error InvalidArgument when `base` has no mlp.router.weight rule.
Result<Schema> ExpertBiasSchema(const Schema& base);

}  // namespace ptc::hf

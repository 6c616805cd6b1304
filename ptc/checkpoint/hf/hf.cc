#include "ptc/checkpoint/hf/hf.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "ptc/base/json_fields.h"
#include "ptc/format/pickle.h"
#include "ptc/model/rule_layers.h"

namespace ptc::hf {
namespace {

// How an HF tensor is cut from its global tensor (rows of dim 0).
enum class Cut {
  kWhole,
  kQuery,  // of linear_qkv: per query group [its q heads; k; v], the q heads of every group
  kKey,    // the k head of every group
  kValue,  // the v head of every group
  kGate,   // of linear_fc1 [gate; up]: the first half
  kUp,     // the second half
};

struct Entry {
  const char* hf;    // HF's name; {i}: the layer, {e}: the expert
  const char* rule;  // the schema rule it is cut from
  Cut cut;
  std::vector<std::string> shape;  // HF's shape, formulas over the dims
  bool output = false;             // the output layer: absent or tied to the embedding means tied
};

struct ArchInfo {
  Arch arch;
  const char* architecture;  // config.json "architectures"
  const char* model_type;
  const char* key_rule;        // a rule that only this architecture's schemas have
  const char* embedding;       // the rule a tied output layer is tied to
  std::vector<Entry> entries;  // HF's state_dict order: first entries, one layer's, last entries
};

constexpr const char* kQkv = "decoder.layers.{i}.self_attention.linear_qkv.weight";
constexpr const char* kQNorm = "decoder.layers.{i}.self_attention.q_layernorm.weight";
constexpr const char* kKNorm = "decoder.layers.{i}.self_attention.k_layernorm.weight";
constexpr const char* kDenseNorm = "decoder.layers.{i}.mlp.linear_fc1.layer_norm_weight";
constexpr const char* kDenseFc1 = "decoder.layers.{i}.mlp.linear_fc1.weight";
constexpr const char* kDenseFc2 = "decoder.layers.{i}.mlp.linear_fc2.weight";
constexpr const char* kMoeNorm = "decoder.layers.{i}.pre_mlp_layernorm.weight";
constexpr const char* kRouter = "decoder.layers.{i}.mlp.router.weight";
constexpr const char* kExpertFc1 = "decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc1.weight";
constexpr const char* kExpertFc2 = "decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc2.weight";
constexpr const char* kSharedFc1 = "decoder.layers.{i}.mlp.shared_experts.linear_fc1.weight";
constexpr const char* kSharedFc2 = "decoder.layers.{i}.mlp.shared_experts.linear_fc2.weight";
constexpr const char* kSharedGate = "decoder.layers.{i}.mlp.shared_experts.gate_weight";
constexpr const char* kExpertBias = "decoder.layers.{i}.mlp.router.expert_bias";
constexpr const char* kMlaNorm = "decoder.layers.{i}.input_layernorm.weight";
constexpr const char* kKvDown = "decoder.layers.{i}.self_attention.linear_kv_down_proj.weight";

// A MoE layer's shared experts: none, DeepSeek-V3's names without a gate
// (MapOptions), or Qwen2-MoE's shared_expert and its sigmoid gate.
enum class Shared { kNone, kUngated, kQwen2 };

// Llama and its mixtures of experts (Mixtral, Qwen3-MoE): the same attention
// and norms, the MLP of each kind of layer under the architecture's names, in
// the order its modules register them (Mixtral's experts w1, w2, w3 as
// transformers 4's MixtralBlockSparseTop2MLP; Qwen3-MoE's q/k norms after
// o_proj, its dense layers' MLP before the MoE block's gate and experts; the
// shared experts after the routed ones, as Qwen2MoeSparseMoeBlock and
// DeepseekV3MoE register them).
ArchInfo LlamaFamily(Arch arch, const char* architecture, const char* model_type, Shared shared = Shared::kNone) {
  std::vector<Entry> e = {
      {"model.embed_tokens.weight", "embedding.word_embeddings.weight", Cut::kWhole, {"vocab", "hidden"}},
      {"model.layers.{i}.self_attn.q_proj.weight", kQkv, Cut::kQuery, {"heads*head_dim", "hidden"}},
      {"model.layers.{i}.self_attn.k_proj.weight", kQkv, Cut::kKey, {"kv_heads*head_dim", "hidden"}},
      {"model.layers.{i}.self_attn.v_proj.weight", kQkv, Cut::kValue, {"kv_heads*head_dim", "hidden"}},
      {"model.layers.{i}.self_attn.o_proj.weight",
       "decoder.layers.{i}.self_attention.linear_proj.weight",
       Cut::kWhole,
       {"hidden", "heads*head_dim"}},
  };
  if (arch == Arch::kQwen3Moe) {
    e.push_back({"model.layers.{i}.self_attn.q_norm.weight", kQNorm, Cut::kWhole, {"head_dim"}});
    e.push_back({"model.layers.{i}.self_attn.k_norm.weight", kKNorm, Cut::kWhole, {"head_dim"}});
  }
  if (arch != Arch::kMixtral) {  // the dense layers' MLP (Qwen3-MoE's mlp_only_layers)
    e.push_back({"model.layers.{i}.mlp.gate_proj.weight", kDenseFc1, Cut::kGate, {"ffn", "hidden"}});
    e.push_back({"model.layers.{i}.mlp.up_proj.weight", kDenseFc1, Cut::kUp, {"ffn", "hidden"}});
    e.push_back({"model.layers.{i}.mlp.down_proj.weight", kDenseFc2, Cut::kWhole, {"hidden", "ffn"}});
  }
  if (arch == Arch::kMixtral) {
    e.push_back({"model.layers.{i}.block_sparse_moe.gate.weight", kRouter, Cut::kWhole, {"experts", "hidden"}});
    e.push_back(
        {"model.layers.{i}.block_sparse_moe.experts.{e}.w1.weight", kExpertFc1, Cut::kGate, {"moe_ffn", "hidden"}});
    e.push_back(
        {"model.layers.{i}.block_sparse_moe.experts.{e}.w2.weight", kExpertFc2, Cut::kWhole, {"hidden", "moe_ffn"}});
    e.push_back(
        {"model.layers.{i}.block_sparse_moe.experts.{e}.w3.weight", kExpertFc1, Cut::kUp, {"moe_ffn", "hidden"}});
  }
  if (arch == Arch::kQwen3Moe || arch == Arch::kQwen2Moe) {
    e.push_back({"model.layers.{i}.mlp.gate.weight", kRouter, Cut::kWhole, {"experts", "hidden"}});
    e.push_back({"model.layers.{i}.mlp.experts.{e}.gate_proj.weight", kExpertFc1, Cut::kGate, {"moe_ffn", "hidden"}});
    e.push_back({"model.layers.{i}.mlp.experts.{e}.up_proj.weight", kExpertFc1, Cut::kUp, {"moe_ffn", "hidden"}});
    e.push_back({"model.layers.{i}.mlp.experts.{e}.down_proj.weight", kExpertFc2, Cut::kWhole, {"hidden", "moe_ffn"}});
  }
  if (shared != Shared::kNone) {
    const bool qwen2 = shared == Shared::kQwen2;
    const char* gate = qwen2 ? "model.layers.{i}.mlp.shared_expert.gate_proj.weight"
                             : "model.layers.{i}.mlp.shared_experts.gate_proj.weight";
    const char* up = qwen2 ? "model.layers.{i}.mlp.shared_expert.up_proj.weight"
                           : "model.layers.{i}.mlp.shared_experts.up_proj.weight";
    const char* down = qwen2 ? "model.layers.{i}.mlp.shared_expert.down_proj.weight"
                             : "model.layers.{i}.mlp.shared_experts.down_proj.weight";
    e.push_back({gate, kSharedFc1, Cut::kGate, {"shared_ffn", "hidden"}});
    e.push_back({up, kSharedFc1, Cut::kUp, {"shared_ffn", "hidden"}});
    e.push_back({down, kSharedFc2, Cut::kWhole, {"hidden", "shared_ffn"}});
    if (qwen2)
      e.push_back({"model.layers.{i}.mlp.shared_expert_gate.weight", kSharedGate, Cut::kWhole, {"1", "hidden"}});
  }
  e.push_back({"model.layers.{i}.input_layernorm.weight",
               "decoder.layers.{i}.self_attention.linear_qkv.layer_norm_weight",
               Cut::kWhole,
               {"hidden"}});
  // Megatron-Core's norm before the MLP: fused into a dense layer's linear_fc1, its own in an MoE layer.
  if (arch != Arch::kMixtral)
    e.push_back({"model.layers.{i}.post_attention_layernorm.weight", kDenseNorm, Cut::kWhole, {"hidden"}});
  if (arch != Arch::kLlama)
    e.push_back({"model.layers.{i}.post_attention_layernorm.weight", kMoeNorm, Cut::kWhole, {"hidden"}});
  e.push_back({"model.norm.weight", "decoder.final_layernorm.weight", Cut::kWhole, {"hidden"}});
  e.push_back({"lm_head.weight", "output_layer.weight", Cut::kWhole, {"vocab", "hidden"}, true});
  return ArchInfo{arch, architecture, model_type, kQkv, "embedding.word_embeddings.weight", std::move(e)};
}

// DeepSeek-V3 (transformers' DeepseekV3ForCausalLM): multi-head latent
// attention, in the order DeepseekV3Attention registers it (q_proj or q_a_proj,
// q_a_layernorm, q_b_proj; kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj;
// o_proj: each the whole Megatron-Core tensor, rows as they are: HF's
// rope_interleave takes DeepSeek's pair order, which ptcfs keeps), the dense
// layers' MLP, then DeepseekV3MoE's experts (one tensor per expert as
// save_pretrained writes them), gate (the router and, with `expert_bias`, its
// e_score_correction_bias) and shared_experts. A rule whose "when" does not
// hold (q_proj with q_lora, q_a_proj without) has no tensor.
ArchInfo DeepseekV3(bool expert_bias) {
#define PTC_MLA "decoder.layers.{i}.self_attention."
  constexpr const char *q = PTC_MLA "linear_q_proj.weight", *q_down = PTC_MLA "linear_q_down_proj.weight",
                       *q_norm = PTC_MLA "linear_q_up_proj.layer_norm_weight", *q_up = PTC_MLA "linear_q_up_proj.weight",
                       *kv_norm = PTC_MLA "linear_kv_up_proj.layer_norm_weight",
                       *kv_up = PTC_MLA "linear_kv_up_proj.weight", *proj = PTC_MLA "linear_proj.weight";
#undef PTC_MLA
  std::vector<Entry> e = {
      {"model.embed_tokens.weight", "embedding.word_embeddings.weight", Cut::kWhole, {"vocab", "hidden"}},
      {"model.layers.{i}.self_attn.q_proj.weight", q, Cut::kWhole, {"heads*(qk_nope+qk_rope)", "hidden"}},
      {"model.layers.{i}.self_attn.q_a_proj.weight", q_down, Cut::kWhole, {"q_lora", "hidden"}},
      {"model.layers.{i}.self_attn.q_a_layernorm.weight", q_norm, Cut::kWhole, {"q_lora"}},
      {"model.layers.{i}.self_attn.q_b_proj.weight", q_up, Cut::kWhole, {"heads*(qk_nope+qk_rope)", "q_lora"}},
      {"model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight", kKvDown, Cut::kWhole, {"kv_lora+qk_rope", "hidden"}},
      {"model.layers.{i}.self_attn.kv_a_layernorm.weight", kv_norm, Cut::kWhole, {"kv_lora"}},
      {"model.layers.{i}.self_attn.kv_b_proj.weight", kv_up, Cut::kWhole, {"heads*(qk_nope+v_head)", "kv_lora"}},
      {"model.layers.{i}.self_attn.o_proj.weight", proj, Cut::kWhole, {"hidden", "heads*v_head"}},
      {"model.layers.{i}.mlp.gate_proj.weight", kDenseFc1, Cut::kGate, {"ffn", "hidden"}},
      {"model.layers.{i}.mlp.up_proj.weight", kDenseFc1, Cut::kUp, {"ffn", "hidden"}},
      {"model.layers.{i}.mlp.down_proj.weight", kDenseFc2, Cut::kWhole, {"hidden", "ffn"}},
      {"model.layers.{i}.mlp.experts.{e}.gate_proj.weight", kExpertFc1, Cut::kGate, {"moe_ffn", "hidden"}},
      {"model.layers.{i}.mlp.experts.{e}.up_proj.weight", kExpertFc1, Cut::kUp, {"moe_ffn", "hidden"}},
      {"model.layers.{i}.mlp.experts.{e}.down_proj.weight", kExpertFc2, Cut::kWhole, {"hidden", "moe_ffn"}},
      {"model.layers.{i}.mlp.gate.weight", kRouter, Cut::kWhole, {"experts", "hidden"}},
  };
  if (expert_bias) e.push_back({"model.layers.{i}.mlp.gate.e_score_correction_bias", kExpertBias, Cut::kWhole, {"experts"}});
  e.push_back({"model.layers.{i}.mlp.shared_experts.gate_proj.weight", kSharedFc1, Cut::kGate, {"shared_ffn", "hidden"}});
  e.push_back({"model.layers.{i}.mlp.shared_experts.up_proj.weight", kSharedFc1, Cut::kUp, {"shared_ffn", "hidden"}});
  e.push_back({"model.layers.{i}.mlp.shared_experts.down_proj.weight", kSharedFc2, Cut::kWhole, {"hidden", "shared_ffn"}});
  e.push_back({"model.layers.{i}.input_layernorm.weight", kMlaNorm, Cut::kWhole, {"hidden"}});
  e.push_back({"model.layers.{i}.post_attention_layernorm.weight", kDenseNorm, Cut::kWhole, {"hidden"}});
  e.push_back({"model.layers.{i}.post_attention_layernorm.weight", kMoeNorm, Cut::kWhole, {"hidden"}});
  e.push_back({"model.norm.weight", "decoder.final_layernorm.weight", Cut::kWhole, {"hidden"}});
  e.push_back({"lm_head.weight", "output_layer.weight", Cut::kWhole, {"vocab", "hidden"}, true});
  return ArchInfo{Arch::kDeepseekV3, "DeepseekV3ForCausalLM", "deepseek_v3", kKvDown,
                  "embedding.word_embeddings.weight", std::move(e)};
}

const std::vector<ArchInfo>& Archs() {
  static const std::vector<ArchInfo> archs = {
      LlamaFamily(Arch::kLlama, "LlamaForCausalLM", "llama"),
      LlamaFamily(Arch::kMixtral, "MixtralForCausalLM", "mixtral"),
      LlamaFamily(Arch::kQwen3Moe, "Qwen3MoeForCausalLM", "qwen3_moe"),
      LlamaFamily(Arch::kQwen2Moe, "Qwen2MoeForCausalLM", "qwen2_moe", Shared::kQwen2),
      DeepseekV3(true),
      {Arch::kGptBigCode,
       "GPTBigCodeForCausalLM",
       "gpt_bigcode",
       "language_model.encoder.layers.{i}.self_attention.query_key_value.weight",
       "language_model.embedding.word_embeddings.weight",
       {
           {"transformer.wte.weight",
            "language_model.embedding.word_embeddings.weight",
            Cut::kWhole,
            {"vocab", "hidden"}},
           {"transformer.wpe.weight",
            "language_model.embedding.position_embeddings.weight",
            Cut::kWhole,
            {"seq", "hidden"}},
           {"transformer.h.{i}.ln_1.weight",
            "language_model.encoder.layers.{i}.input_layernorm.weight",
            Cut::kWhole,
            {"hidden"}},
           {"transformer.h.{i}.ln_1.bias",
            "language_model.encoder.layers.{i}.input_layernorm.bias",
            Cut::kWhole,
            {"hidden"}},
           // Megatron's query_key_value is [q; k; v] per head, as GPTBigCode's c_attn (multi_query off).
           {"transformer.h.{i}.attn.c_attn.weight",
            "language_model.encoder.layers.{i}.self_attention.query_key_value.weight",
            Cut::kWhole,
            {"3*hidden", "hidden"}},
           {"transformer.h.{i}.attn.c_attn.bias",
            "language_model.encoder.layers.{i}.self_attention.query_key_value.bias",
            Cut::kWhole,
            {"3*hidden"}},
           {"transformer.h.{i}.attn.c_proj.weight",
            "language_model.encoder.layers.{i}.self_attention.dense.weight",
            Cut::kWhole,
            {"hidden", "hidden"}},
           {"transformer.h.{i}.attn.c_proj.bias",
            "language_model.encoder.layers.{i}.self_attention.dense.bias",
            Cut::kWhole,
            {"hidden"}},
           {"transformer.h.{i}.ln_2.weight",
            "language_model.encoder.layers.{i}.post_attention_layernorm.weight",
            Cut::kWhole,
            {"hidden"}},
           {"transformer.h.{i}.ln_2.bias",
            "language_model.encoder.layers.{i}.post_attention_layernorm.bias",
            Cut::kWhole,
            {"hidden"}},
           {"transformer.h.{i}.mlp.c_fc.weight",
            "language_model.encoder.layers.{i}.mlp.dense_h_to_4h.weight",
            Cut::kWhole,
            {"ffn", "hidden"}},
           {"transformer.h.{i}.mlp.c_fc.bias",
            "language_model.encoder.layers.{i}.mlp.dense_h_to_4h.bias",
            Cut::kWhole,
            {"ffn"}},
           {"transformer.h.{i}.mlp.c_proj.weight",
            "language_model.encoder.layers.{i}.mlp.dense_4h_to_h.weight",
            Cut::kWhole,
            {"hidden", "ffn"}},
           {"transformer.h.{i}.mlp.c_proj.bias",
            "language_model.encoder.layers.{i}.mlp.dense_4h_to_h.bias",
            Cut::kWhole,
            {"hidden"}},
           {"transformer.ln_f.weight", "language_model.encoder.final_layernorm.weight", Cut::kWhole, {"hidden"}},
           {"transformer.ln_f.bias", "language_model.encoder.final_layernorm.bias", Cut::kWhole, {"hidden"}},
           {"lm_head.weight", "word_embeddings_for_head.weight", Cut::kWhole, {"vocab", "hidden"}, true},
       }},
  };
  return archs;
}

const ArchInfo& InfoOf(Arch arch) {
  for (const ArchInfo& a : Archs()) {
    if (a.arch == arch) return a;
  }
  return Archs().front();
}

bool IsLayer(const std::string& pattern) { return pattern.find("{i}") != std::string::npos; }

bool IsExpert(const std::string& pattern) { return pattern.find("{e}") != std::string::npos; }

// `pattern` with its layer ({i}) and expert ({e}).
std::string Named(std::string pattern, Index layer, Index expert) {
  for (const auto& [mark, value] : {std::pair<const char*, Index>{"{i}", layer}, {"{e}", expert}}) {
    const size_t at = pattern.find(mark);
    if (at != std::string::npos) pattern.replace(at, 3, std::to_string(value));
  }
  return pattern;
}

// Row blocks [begin, end) of a global tensor of `shape`, placed one after another.
LocalTensor RowBlocks(std::string name, const std::string& global, DType dtype, const Shape& shape,
                      const std::vector<std::pair<Index, Index>>& rows) {
  LocalTensor t{std::move(name), dtype, shape, {}};
  Index at = 0;
  for (const auto& [begin, end] : rows) {
    Box box = Box::Full(shape);
    box.begin[0] = begin;
    box.end[0] = end;
    const Index elements = box.volume();
    t.segments.push_back(Segment{global, box, DenseLayout(box, at)});
    at += elements;
  }
  t.shape[0] = 0;
  for (const auto& [begin, end] : rows) t.shape[0] += end - begin;
  return t;
}

// The HF tensor `name` cut from global tensor `g` as `cut` says.
Result<LocalTensor> CutTensor(const std::string& name, const GlobalTensor& g, Cut cut, const ModelDims& dims) {
  const Index rows = g.shape.empty() ? 0 : g.shape[0];
  std::vector<std::pair<Index, Index>> blocks;
  switch (cut) {
    case Cut::kWhole:
      return LocalTensor{
          name, g.dtype, g.shape, {Segment{g.name, Box::Full(g.shape), DenseLayout(Box::Full(g.shape))}}};
    case Cut::kQuery:
    case Cut::kKey:
    case Cut::kValue: {
      const Index d = dims.head_dim, groups = dims.kv_heads, per_group = dims.heads / dims.kv_heads;
      if (rows != (dims.heads + 2 * groups) * d) {
        return InvalidArgumentError("tensor " + g.name + " has " + std::to_string(rows) +
                                    " rows, not (heads+2*kv_heads)*head_dim = " +
                                    std::to_string((dims.heads + 2 * groups) * d) + ": it cannot be cut into " + name);
      }
      const Index group_rows = (per_group + 2) * d;
      for (Index q = 0; q < groups; ++q) {
        const Index base = q * group_rows;
        if (cut == Cut::kQuery) blocks.emplace_back(base, base + per_group * d);
        if (cut == Cut::kKey) blocks.emplace_back(base + per_group * d, base + (per_group + 1) * d);
        if (cut == Cut::kValue) blocks.emplace_back(base + (per_group + 1) * d, base + group_rows);
      }
      break;
    }
    case Cut::kGate:
    case Cut::kUp:
      if (rows % 2 != 0) {
        return InvalidArgumentError("tensor " + g.name + " has an odd number of rows (" + std::to_string(rows) +
                                    "): it is no [gate; up] pair");
      }
      blocks.emplace_back(cut == Cut::kGate ? 0 : rows / 2, cut == Cut::kGate ? rows / 2 : rows);
      break;
  }
  return RowBlocks(name, g.name, g.dtype, g.shape, blocks);
}

std::string Quote(const std::string& s) { return "'" + s + "'"; }

std::string ShardName(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

uint64_t TensorBytes(const LocalTensor& t) { return static_cast<uint64_t>(NumElements(t.shape)) * DTypeSize(t.dtype); }

// The MoE fields of Mixtral's or Qwen3-MoE's config.json. Both name the
// experts num_local_experts or num_experts (transformers maps one to the
// other): the one the kept config has, else the one the hub's models use.
void SetMoeConfig(Arch arch, const ModelDims& d, nlohmann::json* c) {
  const bool local = c->contains("num_local_experts") || (arch == Arch::kMixtral && !c->contains("num_experts"));
  (*c)[local ? "num_local_experts" : "num_experts"] = d.experts;
  // top-k routing: the kept one when it fits, else transformers' default (at most every expert).
  const Index default_k = std::min<Index>(arch == Arch::kMixtral ? 2 : arch == Arch::kQwen2Moe ? 4 : 8, d.experts);
  auto k = c->find("num_experts_per_tok");
  if (k == c->end() || !k->is_number_integer() || k->get<Index>() < 1 || k->get<Index>() > d.experts) {
    (*c)["num_experts_per_tok"] = default_k;
  }
  if (arch == Arch::kMixtral) {  // every layer MoE: its intermediate_size is the experts'
    (*c)["intermediate_size"] = d.moe_ffn;
    return;
  }
  (*c)["moe_intermediate_size"] = d.moe_ffn;
  (*c)["decoder_sparse_step"] = 1;
  nlohmann::json dense = nlohmann::json::array();
  for (Index l = 0; l < d.layers; ++l) {
    if (!d.IsMoeLayer(l)) dense.push_back(l);
  }
  (*c)["mlp_only_layers"] = std::move(dense);
  if (arch == Arch::kQwen2Moe) (*c)["shared_expert_intermediate_size"] = d.shared_ffn;
}

// The fields of DeepseekV3Config beyond Llama's: MLA's ranks and head dims,
// the experts, the dense first layers; its group-limited routing kept where it
// fits the experts, else one group (its defaults, 8 groups of which 4, fit 256).
void SetDeepseekConfig(const ModelDims& d, nlohmann::json* c) {
  (*c)["q_lora_rank"] = d.q_lora ? nlohmann::json(d.q_lora) : nlohmann::json(nullptr);
  (*c)["kv_lora_rank"] = d.kv_lora;
  (*c)["qk_nope_head_dim"] = d.qk_nope;
  (*c)["qk_rope_head_dim"] = d.qk_rope;
  (*c)["v_head_dim"] = d.v_head;
  (*c)["rope_interleave"] = true;
  (*c)["n_routed_experts"] = d.experts;
  (*c)["moe_intermediate_size"] = d.moe_ffn;
  (*c)["n_shared_experts"] = d.shared_ffn / d.moe_ffn;  // CheckDeepseekDims: a multiple
  (*c)["first_k_dense_replace"] = d.dense_first;
  auto int_in = [c](const char* key, Index lo, Index hi) {
    auto it = c->find(key);
    return it != c->end() && it->is_number_integer() && it->get<Index>() >= lo && it->get<Index>() <= hi;
  };
  if (!int_in("num_experts_per_tok", 1, d.experts)) (*c)["num_experts_per_tok"] = std::min<Index>(8, d.experts);
  const Index k = (*c)["num_experts_per_tok"].get<Index>();
  const bool groups_fit = int_in("n_group", 1, d.experts) && d.experts % (*c)["n_group"].get<Index>() == 0 &&
                          int_in("topk_group", 1, (*c)["n_group"].get<Index>()) &&
                          (*c)["topk_group"].get<Index>() * (d.experts / (*c)["n_group"].get<Index>()) >= k;
  if (!groups_fit) {
    (*c)["n_group"] = 1;
    (*c)["topk_group"] = 1;
  }
}

nlohmann::json ConfigOf(const Model& model, const ModelSpec& spec, const nlohmann::json& kept) {
  const ModelDims& d = spec.dims;
  nlohmann::json c = kept.is_object() ? kept : nlohmann::json::object();
  const ArchInfo& info = InfoOf(model.arch);
  c["architectures"] = {info.architecture};
  c["model_type"] = info.model_type;
  c["tie_word_embeddings"] = model.tied;
  // transformers 5 writes "dtype", earlier ones (and 5, reading) "torch_dtype".
  c[c.contains("dtype") ? "dtype" : "torch_dtype"] = std::string(pickle::TorchDTypeName(spec.dtype));
  if (model.arch != Arch::kGptBigCode) {
    if (!kept.is_object()) {  // Megatron-Core's defaults (TransformerConfig)
      c["rms_norm_eps"] = 1e-5;
      c["rope_theta"] = 10000.0;
    }
    c["hidden_size"] = d.hidden;
    c["intermediate_size"] = d.ffn;
    c["num_hidden_layers"] = d.layers;
    c["num_attention_heads"] = d.heads;
    c["num_key_value_heads"] = d.kv_heads;
    c["head_dim"] = d.head_dim;
    c["vocab_size"] = d.vocab;
    c["max_position_embeddings"] = d.seq;
    c["hidden_act"] = "silu";
    // Qwen2-MoE's q/k/v biases are one switch (qkv_bias, on by default); the others' attention_bias.
    c[model.arch == Arch::kQwen2Moe ? "qkv_bias" : "attention_bias"] = false;
    if (model.arch == Arch::kLlama) c["mlp_bias"] = false;
    if (model.arch == Arch::kDeepseekV3) {
      SetDeepseekConfig(d, &c);
    } else if (model.arch != Arch::kLlama) {
      SetMoeConfig(model.arch, d, &c);
    }
  } else {
    if (!kept.is_object()) {  // Megatron-LM's defaults: the fused bias-GeLU (tanh), LayerNorm eps
      c["activation_function"] = "gelu_pytorch_tanh";
      c["layer_norm_epsilon"] = 1e-5;
      c["bos_token_id"] = nullptr;  // GPTBigCodeConfig's defaults (50256) lie outside most vocabularies
      c["eos_token_id"] = nullptr;
    }
    c["n_embd"] = d.hidden;
    c["n_head"] = d.heads;
    c["n_layer"] = d.layers;
    c["n_inner"] = d.ffn;
    c["n_positions"] = d.seq;
    c["vocab_size"] = d.vocab;
    c["multi_query"] = false;
    c["scale_attn_weights"] = true;
  }
  return c;
}

}  // namespace

namespace {

// What DeepseekV3Config can say of the dims: every layer from
// first_k_dense_replace MoE, with n_shared_experts shared experts of
// moe_intermediate_size each.
// \error InvalidArgument naming the dims key.
Status CheckDeepseekDims(const ModelDims& d) {
  const std::string what = "dims " + d.ToString() + ": DeepseekV3ForCausalLM ";
  if (d.experts == 0) {
    return InvalidArgumentError(what + "has MoE layers (experts=): a dense model with multi-head latent attention "
                                       "has no Hugging Face architecture ptcfs maps");
  }
  if (d.moe_every != 1) {
    return InvalidArgumentError(what + "has every layer from first_k_dense_replace MoE, not moe_every=" +
                                std::to_string(d.moe_every));
  }
  if (d.shared_ffn == 0 || d.shared_ffn % d.moe_ffn != 0) {
    return InvalidArgumentError(what + "has n_shared_experts shared experts of moe_intermediate_size: shared_ffn=" +
                                std::to_string(d.shared_ffn) + " is no positive multiple of moe_ffn=" +
                                std::to_string(d.moe_ffn));
  }
  return Status::OK();
}

// The architecture `spec` maps to: by the rules only one family has, then
// (Llama's) by its experts, shared experts' gate and q/k norms.
Result<const ArchInfo*> SelectArch(const ModelSpec& spec) {
  const Schema& schema = spec.schema;
  if (schema.Find(InfoOf(Arch::kGptBigCode).key_rule) != nullptr) return &InfoOf(Arch::kGptBigCode);
  if (spec.dims.IsMla() && schema.Find(kKvDown) != nullptr) {
    PTC_RETURN_IF_ERROR(CheckDeepseekDims(spec.dims));
    return &InfoOf(Arch::kDeepseekV3);
  }
  if (schema.Find(kQkv) == nullptr) {
    return InvalidArgumentError("schema " + schema.name +
                                ": Hugging Face has no architecture ptcfs maps it to (it maps Megatron-Core GPT names, "
                                "the built-in llama, to LlamaForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM or "
                                "Qwen2MoeForCausalLM "
                                "and legacy Megatron-LM GPT names, megatron-gpt, to GPTBigCodeForCausalLM; "
                                "docs/hf_format.md)");
  }
  const bool qk_norm = schema.Find(kQNorm) != nullptr || schema.Find(kKNorm) != nullptr;
  if (spec.dims.experts > 0 && spec.dims.shared_ffn > 0 && schema.Find(kSharedGate) != nullptr) {
    return &InfoOf(Arch::kQwen2Moe);
  }
  if (spec.dims.experts == 0) {
    if (!qk_norm) return &InfoOf(Arch::kLlama);
    return InvalidArgumentError("schema " + schema.name + ": rule " + Quote(kQNorm) +
                                " without experts would be Qwen3ForCausalLM, which ptcfs does not map "
                                "(docs/hf_format.md)");
  }
  return &InfoOf(qk_norm ? Arch::kQwen3Moe : Arch::kMixtral);
}

// Every rule of `spec`'s schema has its HF tensors and every entry its rule,
// placed as the entry is; the output layer tied or not.
// \error InvalidArgument naming the rule at fault.
Result<bool> CheckRules(const ModelSpec& spec, const ArchInfo& info) {
  const Schema& schema = spec.schema;
  std::set<std::string> mapped;
  const Entry* output = nullptr;
  for (const Entry& e : info.entries) {
    mapped.insert(e.rule);
    if (e.output) output = &e;
  }
  for (const TensorRule& r : schema.rules) {
    const Result<uint64_t> tensors = RuleTensors(r, spec.dims);  // none: an MoE rule of a dense model
    if (!mapped.count(r.name) && (!tensors.ok() || *tensors > 0)) {
      return InvalidArgumentError("schema " + schema.name + ": rule " + Quote(r.name) + " has no tensor in " +
                                  info.architecture + " (docs/hf_format.md)");
    }
  }
  const TensorRule* output_rule = output != nullptr ? schema.Find(output->rule) : nullptr;
  const bool tied = output_rule == nullptr || output_rule->tied_to == info.embedding;
  if (output_rule != nullptr && !output_rule->tied_to.empty() && !tied) {
    return InvalidArgumentError("schema " + schema.name + ": rule " + Quote(output_rule->name) + " is tied to " +
                                Quote(output_rule->tied_to) + ", not to the embedding");
  }
  for (const Entry& e : info.entries) {
    const TensorRule* r = schema.Find(e.rule);
    if (r == nullptr && !e.output) {
      return InvalidArgumentError(std::string(info.architecture) + " needs rule " + Quote(e.rule) + ", which schema " +
                                  schema.name + " lacks");
    }
    if (r != nullptr && IsLayer(e.hf) != (r->pp == PpPlacement::kLayer)) {
      return InvalidArgumentError("schema " + schema.name + ": rule " + Quote(r->name) +
                                  (IsLayer(e.hf) ? " is not" : " is") + " one per layer, unlike " + e.hf);
    }
    if (r != nullptr && IsExpert(e.hf) != r->expert) {
      return InvalidArgumentError("schema " + schema.name + ": rule " + Quote(r->name) +
                                  (IsExpert(e.hf) ? " is not" : " is") + " one per expert, unlike " + e.hf);
    }
  }
  const ModelDims& dims = spec.dims;
  if (info.arch == Arch::kGptBigCode && (dims.kv_heads != dims.heads || dims.heads * dims.head_dim != dims.hidden)) {
    return InvalidArgumentError("dims " + dims.ToString() +
                                ": GPTBigCodeForCausalLM has kv_heads = heads and heads*head_dim = hidden");
  }
  return tied;
}

// Adds to `model` the HF tensors of `info`'s entries, in HF's order.
Status AddTensors(const ModelSpec& spec, const ArchInfo& info, Model* model) {
  const ModelDims& dims = spec.dims;
  ModelSpec params = spec;
  params.optimizer = false;
  PTC_ASSIGN_OR_RETURN(std::vector<GlobalTensor> globals, GlobalTensors(params));
  std::map<std::string, const GlobalTensor*> by_name;
  for (const GlobalTensor& g : globals) by_name[g.name] = &g;
  auto add = [&](const Entry& e, Index layer, Index expert) -> Status {
    if (e.output && model->tied) return Status::OK();
    if (const TensorRule* rule = spec.schema.Find(e.rule); rule != nullptr) {
      PTC_ASSIGN_OR_RETURN(bool when, RuleWhen(*rule, dims));
      if (!when) return Status::OK();  // MLA's q_proj with q_lora, its q_a_proj without
    }
    if (IsLayer(e.hf) && !RuleOnLayer(*spec.schema.Find(e.rule), dims, layer)) return Status::OK();  // another kind
    const std::string name = Named(e.hf, layer, expert), global = Named(e.rule, layer, expert);
    auto it = by_name.find(global);
    if (it == by_name.end()) return InternalError("no global tensor " + global);
    PTC_ASSIGN_OR_RETURN(LocalTensor t, CutTensor(name, *it->second, e.cut, dims));
    t.buffer = it->second->buffer;  // e_score_correction_bias: no optimizer state (torchtitan's keys)
    TensorRule want;
    want.name = e.hf;
    for (const std::string& f : e.shape) want.shape.push_back(f);
    PTC_ASSIGN_OR_RETURN(Shape shape, RuleShape(want, dims));
    if (t.shape != shape) {
      return InvalidArgumentError("tensor " + global + " " + ShapeToString(it->second->shape) + " gives " + name + " " +
                                  ShapeToString(t.shape) + ", but the config's " + name + " is " +
                                  ShapeToString(shape));
    }
    model->tensors.push_back(std::move(t));
    return Status::OK();
  };
  const std::vector<Entry>& entries = info.entries;
  size_t first_layer = 0, last_layer = 0;  // entries [first_layer, last_layer) are per layer
  while (first_layer < entries.size() && !IsLayer(entries[first_layer].hf)) ++first_layer;
  last_layer = first_layer;
  while (last_layer < entries.size() && IsLayer(entries[last_layer].hf)) ++last_layer;
  for (size_t i = 0; i < first_layer; ++i) PTC_RETURN_IF_ERROR(add(entries[i], 0, 0));
  for (Index layer = 0; layer < dims.layers; ++layer) {
    for (size_t i = first_layer; i < last_layer;) {
      size_t run = i;  // a run of expert entries: expert by expert
      while (run < last_layer && IsExpert(entries[run].hf)) ++run;
      if (run == i) {
        PTC_RETURN_IF_ERROR(add(entries[i++], layer, 0));
        continue;
      }
      const Index experts = dims.IsMoeLayer(layer) ? dims.experts : 0;
      for (Index expert = 0; expert < experts; ++expert) {
        for (size_t j = i; j < run; ++j) PTC_RETURN_IF_ERROR(add(entries[j], layer, expert));
      }
      i = run;
    }
  }
  for (size_t i = last_layer; i < entries.size(); ++i) PTC_RETURN_IF_ERROR(add(entries[i], 0, 0));
  return Status::OK();
}

}  // namespace

const char* ArchName(Arch arch) { return InfoOf(arch).architecture; }

Result<Model> MapModel(const ModelSpec& spec, const MapOptions& options) {
  PTC_ASSIGN_OR_RETURN(const ArchInfo* selected, SelectArch(spec));
  ArchInfo info = *selected;
  if (options.ungated_shared_experts && (info.arch == Arch::kMixtral || info.arch == Arch::kQwen3Moe) &&
      spec.dims.shared_ffn > 0 && spec.schema.Find(kSharedFc1) != nullptr) {
    info = LlamaFamily(info.arch, info.architecture, info.model_type, Shared::kUngated);
  }
  if (options.expert_bias_optional && info.arch == Arch::kDeepseekV3 && spec.schema.Find(kExpertBias) == nullptr) {
    info = DeepseekV3(false);
  }
  Model model;
  model.arch = info.arch;
  PTC_ASSIGN_OR_RETURN(model.tied, CheckRules(spec, info));
  PTC_RETURN_IF_ERROR(AddTensors(spec, info, &model));
  return model;
}

std::vector<Shard> CutShards(const std::vector<LocalTensor>& tensors, uint64_t max_bytes) {
  std::vector<Shard> shards;
  Shard current;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t bytes = TensorBytes(tensors[i]);
    if (!current.tensors.empty() && current.bytes + bytes > max_bytes) {
      shards.push_back(std::move(current));
      current = Shard{};
    }
    current.tensors.push_back(i);
    current.bytes += bytes;
  }
  if (!current.tensors.empty() || shards.empty()) shards.push_back(std::move(current));
  for (size_t i = 0; i < shards.size(); ++i) {
    shards[i].file = shards.size() == 1 ? kSingleFile : ShardName(i, shards.size());
  }
  return shards;
}

Result<Plan> PlanExport(const ModelSpec& spec, uint64_t max_bytes, const nlohmann::json& kept) {
  if (max_bytes == 0) return InvalidArgumentError("a shard size of 0 bytes");
  Plan plan;
  PTC_ASSIGN_OR_RETURN(plan.model, MapModel(spec));
  plan.shards = CutShards(plan.model.tensors, max_bytes);
  plan.config_json = JsonText(ConfigOf(plan.model, spec, kept), 2) + "\n";
  if (plan.shards.size() > 1) {
    nlohmann::json map = nlohmann::json::object();
    uint64_t total = 0;
    for (const Shard& s : plan.shards) {
      for (size_t t : s.tensors) map[plan.model.tensors[t].name] = s.file;
      total += s.bytes;
    }
    nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", std::move(map)}};
    plan.index_json = JsonText(index, 2) + "\n";
  }
  return plan;
}

std::map<std::string, std::string> ShardMetadata() { return {{"format", "pt"}}; }

Result<uint64_t> ParseShardSize(std::string_view text) {
  const std::string what = "shard size '" + std::string(text) + "'";
  uint64_t n = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, n);
  if (ec != std::errc() || p == text.data()) {
    return InvalidArgumentError(what + ": not a number of bytes (e.g. 5GB, 500MB, 2GiB, 1000000)");
  }
  static const std::map<std::string, uint64_t, std::less<>> kUnits = {{"", 1},
                                                                      {"B", 1},
                                                                      {"KB", 1000},
                                                                      {"MB", 1000'000},
                                                                      {"GB", 1000'000'000},
                                                                      {"TB", 1000'000'000'000},
                                                                      {"KiB", 1ull << 10},
                                                                      {"MiB", 1ull << 20},
                                                                      {"GiB", 1ull << 30},
                                                                      {"TiB", 1ull << 40}};
  auto unit = kUnits.find(std::string_view(p, static_cast<size_t>(end - p)));
  if (unit == kUnits.end())
    return InvalidArgumentError(what + ": unknown unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  if (n == 0) return InvalidArgumentError(what + ": must be more than 0");
  if (n > UINT64_MAX / unit->second) return InvalidArgumentError(what + ": too large");
  return n * unit->second;
}
}  // namespace ptc::hf

// config.json of a Hugging Face model: the ptcfs model it describes (hf.h, ModelOfConfig).
#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ptc/base/json_fields.h"
#include "ptc/checkpoint/hf/hf.h"
#include "ptc/format/pickle.h"
#include "ptc/model/limits.h"

namespace ptc::hf {

namespace {

// A positive integer field of a config.json, or `fallback` when absent or null (if given).
Result<Index> SizeField(const nlohmann::json& c, const char* key, const std::string& what,
                        std::optional<Index> fallback = std::nullopt) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) {
    if (fallback) return *fallback;
    return InvalidArgumentError(what + ": \"" + key + "\" is missing");
  }
  if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
    return InvalidArgumentError(what + ": \"" + key + "\" must be a positive integer, not " + JsonText(*it));
  }
  return it->get<Index>();
}

Result<bool> BoolField(const nlohmann::json& c, const char* key, bool fallback, const std::string& what) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return InvalidArgumentError(what + ": \"" + key + "\" must be true or false");
  return it->get<bool>();
}

Result<ModelDims> Dims(Index layers, Index hidden, Index heads, Index kv_heads, Index head_dim, Index ffn, Index vocab,
                       Index seq, const std::string& what, const std::string& moe = "") {
  const std::string text = "layers=" + std::to_string(layers) + ",hidden=" + std::to_string(hidden) +
                           ",heads=" + std::to_string(heads) + ",vocab=" + std::to_string(vocab) +
                           ",seq=" + std::to_string(seq) + ",ffn=" + std::to_string(ffn) +
                           ",kv_heads=" + std::to_string(kv_heads) + ",head_dim=" + std::to_string(head_dim) + moe;
  PTC_ASSIGN_OR_RETURN(ModelDims dims, ParseDims(text), what);
  return dims;
}

// The dtype a config.json names ("torch_dtype", or "dtype" of transformers 5),
// when it names one: a torch dtype's name ("bfloat16"), or "auto".
Status CheckConfigDType(const nlohmann::json& c, const std::string& what) {
  for (const char* key : {"torch_dtype", "dtype"}) {
    auto it = c.find(key);
    if (it == c.end() || it->is_null()) continue;
    const std::string name = it->is_string() ? it->get<std::string>() : "";
    // "auto", and torch's own aliases (transformers takes getattr(torch, name)).
    bool known = name == "auto" || name == "float" || name == "half" || name == "double";
    for (int t = 0; t < kNumDTypes; ++t) known = known || (!name.empty() && name == pickle::TorchDTypeName(DType(t)));
    if (!known) {
      return InvalidArgumentError(what + ": \"" + key + "\" is " + JsonText(*it) +
                                  ", no torch dtype (\"bfloat16\", \"float32\", ...)");
    }
  }
  return Status::OK();
}

std::string Quote(const std::string& s) { return "'" + s + "'"; }

// The number of experts: Mixtral's and Qwen3-MoE's num_local_experts, or
// num_experts, which transformers maps to it (HF's default when neither).
Result<Index> ExpertsField(const nlohmann::json& c, Index fallback, const std::string& what) {
  if (c.contains("num_local_experts") && c.contains("num_experts")) {
    PTC_ASSIGN_OR_RETURN(Index local, SizeField(c, "num_local_experts", what));
    PTC_ASSIGN_OR_RETURN(Index experts, SizeField(c, "num_experts", what));
    if (local != experts) {
      return InvalidArgumentError(what + ": \"num_local_experts\" and \"num_experts\" differ (" +
                                  std::to_string(local) + ", " + std::to_string(experts) + ")");
    }
    return local;
  }
  return SizeField(c, c.contains("num_experts") ? "num_experts" : "num_local_experts", what, fallback);
}

// Qwen3-MoE's MoE layers (those not in mlp_only_layers whose layer+1 is a
// multiple of decoder_sparse_step) as ptcfs's dims: ",dense_first=D,moe_every=K".
// \error InvalidArgument naming the fields when no D and K give those layers.
Result<std::string> QwenMoeLayers(const nlohmann::json& c, Index layers, const std::string& what) {
  if (layers > kMaxLayers) {  // before a walk over them (ParseDims names the limit too)
    return InvalidArgumentError(what + ": \"num_hidden_layers\" is " + std::to_string(layers) + ", above ptcfs's " +
                                std::to_string(kMaxLayers));
  }
  PTC_ASSIGN_OR_RETURN(Index step, SizeField(c, "decoder_sparse_step", what, 1));
  std::set<Index> dense;
  if (auto it = c.find("mlp_only_layers"); it != c.end() && !it->is_null()) {
    if (!it->is_array()) return InvalidArgumentError(what + ": \"mlp_only_layers\" is not a list of layers");
    for (const nlohmann::json& l : *it) {
      if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= layers) {
        return InvalidArgumentError(what + ": \"mlp_only_layers\" holds " + JsonText(l) + ", no layer of " +
                                    std::to_string(layers));
      }
      dense.insert(l.get<Index>());
    }
  }
  std::vector<Index> moe;
  for (Index l = 0; l < layers; ++l) {
    if (dense.count(l) == 0 && (l + 1) % step == 0) moe.push_back(l);
  }
  if (moe.empty()) return InvalidArgumentError(what + ": no MoE layer (mlp_only_layers, decoder_sparse_step)");
  // ptcfs's MoE layers: l >= dense_first with l % moe_every == 0.
  const Index first = moe.front();
  const Index every = moe.size() > 1 ? moe[1] - moe[0] : first > 0 ? first : layers;
  ModelDims d;
  d.experts = 1;
  d.dense_first = first;
  d.moe_every = every;
  for (Index l = 0; l < layers; ++l) {
    if (d.IsMoeLayer(l) != std::binary_search(moe.begin(), moe.end(), l)) {
      return InvalidArgumentError(what + ": its MoE layers (decoder_sparse_step " + std::to_string(step) +
                                  ", mlp_only_layers) are not every k-th layer from a first one (layer l with "
                                  "l % k == 0), as ptcfs's moe_every and dense_first place them");
    }
  }
  return ",dense_first=" + std::to_string(first) + ",moe_every=" + std::to_string(every);
}

// The MoE dims of a Mixtral, Qwen3-MoE or Qwen2-MoE config.json (HF's defaults where absent).
Result<std::string> MoeDims(const nlohmann::json& c, const std::string& type, Index layers, Index ffn,
                            const std::string& what) {
  const bool mixtral = type == "mixtral", qwen2 = type == "qwen2_moe";
  PTC_ASSIGN_OR_RETURN(Index experts, ExpertsField(c, mixtral ? 8 : qwen2 ? 60 : 128, what));
  Index moe_ffn = ffn;
  if (!mixtral) {
    PTC_ASSIGN_OR_RETURN(moe_ffn, SizeField(c, "moe_intermediate_size", what, qwen2 ? 1408 : 768));
  }
  std::string placed;
  if (!mixtral) {
    PTC_ASSIGN_OR_RETURN(placed, QwenMoeLayers(c, layers, what));
  }
  if (qwen2) {  // every MoE layer has the shared expert (Qwen2MoeSparseMoeBlock)
    PTC_ASSIGN_OR_RETURN(Index shared, SizeField(c, "shared_expert_intermediate_size", what, 5632));
    placed += ",shared_ffn=" + std::to_string(shared);
  }
  return ",experts=" + std::to_string(experts) + ",moe_ffn=" + std::to_string(moe_ffn) + placed;
}

// What Qwen2-MoE's config switches on that the llama schema cannot carry:
// q/k/v biases (qkv_bias, true by default) and a sliding window.
Status CheckQwen2Moe(const nlohmann::json& c, const std::string& what) {
  PTC_ASSIGN_OR_RETURN(bool qkv_bias, BoolField(c, "qkv_bias", true, what));
  if (qkv_bias) {
    return InvalidArgumentError(what +
                                ": \"qkv_bias\" is true (Qwen2-MoE's default); the llama schema has no q/k/v "
                                "biases (docs/hf_format.md)");
  }
  PTC_ASSIGN_OR_RETURN(bool window, BoolField(c, "use_sliding_window", false, what));
  if (window) {
    return InvalidArgumentError(what + ": \"use_sliding_window\" is true; ptcfs maps full attention only");
  }
  return Status::OK();
}

// The built-in llama, with its output layer tied to the embedding when `tied`
// (Megatron-Core's share_embeddings_and_output_weights), named llama-tied.
Result<Schema> LlamaSchema(bool tied) {
  PTC_ASSIGN_OR_RETURN(Schema llama, LoadSchema("llama"));
  if (!tied) return llama;
  nlohmann::json doc = llama.ToJson();
  doc["name"] = "llama-tied";
  for (auto& rule : doc["tensors"]) {
    if (rule["name"] == "output_layer.weight") {
      rule.erase("shape");
      rule["tied_to"] = "embedding.word_embeddings.weight";
    }
  }
  return ParseSchema("llama-tied", doc);
}

// Llama, Mixtral, Qwen3-MoE and Qwen2-MoE: the built-in llama (tied, with q/k
// norms or the shared experts' gate as the config says).
Result<ConfigModel> LlamaFamilyOfConfig(const nlohmann::json& c, const std::string& type, const std::string& what) {
  ConfigModel out;
  out.arch = type == "llama"       ? Arch::kLlama
             : type == "mixtral"   ? Arch::kMixtral
             : type == "qwen2_moe" ? Arch::kQwen2Moe
                                   : Arch::kQwen3Moe;
  if (out.arch == Arch::kQwen2Moe) PTC_RETURN_IF_ERROR(CheckQwen2Moe(c, what));
  PTC_ASSIGN_OR_RETURN(Index layers, SizeField(c, "num_hidden_layers", what));
  PTC_ASSIGN_OR_RETURN(Index hidden, SizeField(c, "hidden_size", what));
  PTC_ASSIGN_OR_RETURN(Index heads, SizeField(c, "num_attention_heads", what));
  PTC_ASSIGN_OR_RETURN(Index kv_heads, SizeField(c, "num_key_value_heads", what, heads));
  PTC_ASSIGN_OR_RETURN(Index head_dim, SizeField(c, "head_dim", what, heads > 0 ? hidden / heads : 0));
  PTC_ASSIGN_OR_RETURN(Index ffn, SizeField(c, "intermediate_size", what));
  PTC_ASSIGN_OR_RETURN(Index vocab, SizeField(c, "vocab_size", what));
  PTC_ASSIGN_OR_RETURN(Index seq, SizeField(c, "max_position_embeddings", what, 2048));
  for (const char* bias : {"attention_bias", "mlp_bias"}) {
    PTC_ASSIGN_OR_RETURN(bool on, BoolField(c, bias, false, what));
    if (on) {
      return InvalidArgumentError(what + ": \"" + bias +
                                  "\" is true; the llama schema has no biases (docs/hf_format.md)");
    }
  }
  if (auto it = c.find("hidden_act"); it != c.end() && !it->is_null() && *it != "silu") {
    return InvalidArgumentError(what + ": \"hidden_act\" is " + JsonText(*it) +
                                "; ptcfs maps Llama's SwiGLU (silu) only");
  }
  std::string moe;
  if (out.arch != Arch::kLlama) {
    PTC_ASSIGN_OR_RETURN(moe, MoeDims(c, type, layers, ffn, what));
  }
  PTC_ASSIGN_OR_RETURN(bool tied, BoolField(c, "tie_word_embeddings", false, what));
  PTC_ASSIGN_OR_RETURN(out.dims, Dims(layers, hidden, heads, kv_heads, head_dim, ffn, vocab, seq, what, moe));
  PTC_ASSIGN_OR_RETURN(out.schema, LlamaSchema(tied));
  if (out.arch == Arch::kQwen3Moe) {
    PTC_ASSIGN_OR_RETURN(out.schema, QkNormSchema(out.schema));
  }
  if (out.arch == Arch::kQwen2Moe) {
    PTC_ASSIGN_OR_RETURN(out.schema, SharedGateSchema(out.schema));
  }
  return out;
}

// A size field of DeepseekV3Config that may be 0, or null for 0 (q_lora_rank:
// no q compression; first_k_dense_replace: no dense layer).
Result<Index> SizeOrZero(const nlohmann::json& c, const char* key, Index fallback, const std::string& what) {
  if (auto it = c.find(key); it != c.end() && (it->is_null() || (it->is_number_integer() && *it == 0))) return Index{0};
  return SizeField(c, key, what, fallback);
}

// What DeepseekV3Config switches on that ptcfs cannot carry.
Status CheckDeepseek(const nlohmann::json& c, const std::string& what) {
  PTC_ASSIGN_OR_RETURN(bool bias, BoolField(c, "attention_bias", false, what));
  if (bias) return InvalidArgumentError(what + ": \"attention_bias\" is true; the llama schema has no biases");
  PTC_ASSIGN_OR_RETURN(bool interleave, BoolField(c, "rope_interleave", true, what));
  if (!interleave) {
    return InvalidArgumentError(what +
                                ": \"rope_interleave\" is false; ptcfs keeps DeepSeek-V3's rope rows in its own "
                                "pair order, which HF reads with rope_interleave true (its default; docs/hf_format.md)");
  }
  if (auto it = c.find("hidden_act"); it != c.end() && !it->is_null() && *it != "silu") {
    return InvalidArgumentError(what + ": \"hidden_act\" is " + JsonText(*it) + "; ptcfs maps SwiGLU (silu) only");
  }
  return Status::OK();
}

// DeepSeek-V3 (DeepseekV3Config, its defaults where a field is absent): the
// built-in llama with MLA dims and the router's expert bias (ExpertBiasSchema).
Result<ConfigModel> DeepseekOfConfig(const nlohmann::json& c, const std::string& what) {
  PTC_RETURN_IF_ERROR(CheckDeepseek(c, what));
  ConfigModel out;
  out.arch = Arch::kDeepseekV3;
  PTC_ASSIGN_OR_RETURN(Index layers, SizeField(c, "num_hidden_layers", what, 61));
  PTC_ASSIGN_OR_RETURN(Index hidden, SizeField(c, "hidden_size", what, 7168));
  PTC_ASSIGN_OR_RETURN(Index heads, SizeField(c, "num_attention_heads", what, 128));
  PTC_ASSIGN_OR_RETURN(Index kv_heads, SizeField(c, "num_key_value_heads", what, heads));
  if (kv_heads != heads) {
    return InvalidArgumentError(what + ": \"num_key_value_heads\" " + std::to_string(kv_heads) +
                                " differs from \"num_attention_heads\" " + std::to_string(heads) +
                                ": every head of multi-head latent attention has its own k and v");
  }
  std::string dims = "layers=" + std::to_string(layers) + ",hidden=" + std::to_string(hidden) +
                     ",heads=" + std::to_string(heads);
  const struct {
    const char* key;
    const char* dim;
    Index fallback;
  } kFieldsOf[] = {{"vocab_size", "vocab", 129280},        {"max_position_embeddings", "seq", 4096},
                   {"intermediate_size", "ffn", 18432},    {"q_lora_rank", "q_lora", 1536},
                   {"kv_lora_rank", "kv_lora", 512},       {"qk_nope_head_dim", "qk_nope", 128},
                   {"qk_rope_head_dim", "qk_rope", 64},    {"v_head_dim", "v_head", 128},
                   {"n_routed_experts", "experts", 256},   {"moe_intermediate_size", "moe_ffn", 2048},
                   {"first_k_dense_replace", "dense_first", 3}};
  Index moe_ffn = 0;
  for (const auto& f : kFieldsOf) {
    const bool zero_ok = std::string_view(f.key) == "q_lora_rank" || std::string_view(f.key) == "first_k_dense_replace";
    PTC_ASSIGN_OR_RETURN(Index v, zero_ok ? SizeOrZero(c, f.key, f.fallback, what) : SizeField(c, f.key, what, f.fallback));
    dims += std::string(",") + f.dim + "=" + std::to_string(v);
    if (std::string_view(f.dim) == "moe_ffn") moe_ffn = v;
  }
  PTC_ASSIGN_OR_RETURN(Index shared, SizeField(c, "n_shared_experts", what, 1));
  Index shared_ffn = 0;
  if (__builtin_mul_overflow(shared, moe_ffn, &shared_ffn)) {
    return InvalidArgumentError(what + ": n_shared_experts * moe_intermediate_size overflows");
  }
  dims += ",shared_ffn=" + std::to_string(shared_ffn);
  PTC_ASSIGN_OR_RETURN(out.dims, ParseDims(dims), what);
  PTC_ASSIGN_OR_RETURN(bool tied, BoolField(c, "tie_word_embeddings", false, what));
  PTC_ASSIGN_OR_RETURN(Schema llama, LlamaSchema(tied));
  PTC_ASSIGN_OR_RETURN(out.schema, ExpertBiasSchema(llama));
  return out;
}

}  // namespace

namespace {

// `base` with `added` rules after rule `after`, named NAME + `suffix`.
// \error InvalidArgument naming `after` when `base` has no such rule (`what`: what would follow it).
Result<Schema> WithRulesAfter(const Schema& base, const char* after, const std::vector<nlohmann::json>& added,
                              const char* suffix, const char* what) {
  nlohmann::json doc = base.ToJson();
  const std::string name = base.name + suffix;
  doc["name"] = name;
  nlohmann::json rules = nlohmann::json::array();
  bool found = false;
  for (auto& rule : doc["tensors"]) {
    rules.push_back(rule);
    if (rule["name"] != after) continue;
    found = true;
    for (const nlohmann::json& r : added) rules.push_back(r);
  }
  if (!found)
    return InvalidArgumentError("schema " + base.name + " has no rule " + after + " for " + what + " to follow");
  doc["tensors"] = std::move(rules);
  return ParseSchema(name, doc);
}

}  // namespace

Result<Schema> QkNormSchema(const Schema& base) {
  std::vector<nlohmann::json> norms;
  for (const char* norm : {"q_layernorm", "k_layernorm"}) {
    norms.push_back({{"name", std::string("decoder.layers.{i}.self_attention.") + norm + ".weight"},
                     {"shape", {"head_dim"}},
                     {"pp", "layer"}});
  }
  return WithRulesAfter(base, "decoder.layers.{i}.self_attention.linear_qkv.weight", norms, "-qk", "q/k norms");
}

Result<Schema> SharedGateSchema(const Schema& base) {
  const nlohmann::json gate = {{"name", "decoder.layers.{i}.mlp.shared_experts.gate_weight"},
                               {"shape", {"1", "hidden"}},
                               {"pp", "layer"},
                               {"layers", "moe"},
                               {"when", "shared_ffn"}};
  return WithRulesAfter(base, "decoder.layers.{i}.mlp.shared_experts.linear_fc2.weight", {gate}, "-sg", "a gate");
}

Result<Schema> ExpertBiasSchema(const Schema& base) {
  const nlohmann::json bias = {{"name", "decoder.layers.{i}.mlp.router.expert_bias"},
                               {"shape", {"experts"}},
                               {"pp", "layer"},
                               {"layers", "moe"},
                               {"buffer", true}};
  return WithRulesAfter(base, "decoder.layers.{i}.mlp.router.weight", {bias}, "-eb", "an expert bias");
}

Result<ConfigModel> ModelOfConfig(const nlohmann::json& c, const std::string& what) {
  if (!c.is_object()) return InvalidArgumentError(what + ": not a JSON object");
  std::string type;
  if (auto it = c.find("model_type"); it != c.end() && !it->is_null()) {
    if (!it->is_string()) return InvalidArgumentError(what + ": \"model_type\" is " + JsonText(*it) + ", not a string");
    type = it->get<std::string>();
  }
  PTC_RETURN_IF_ERROR(CheckConfigDType(c, what));
  if (type.empty()) {
    if (auto it = c.find("architectures"); it != c.end() && it->is_array() && !it->empty() && (*it)[0].is_string()) {
      const std::string a = (*it)[0].get<std::string>();
      if (a == "LlamaForCausalLM") type = "llama";
      if (a == "MixtralForCausalLM") type = "mixtral";
      if (a == "Qwen3MoeForCausalLM") type = "qwen3_moe";
      if (a == "Qwen2MoeForCausalLM") type = "qwen2_moe";
      if (a == "GPTBigCodeForCausalLM") type = "gpt_bigcode";
      if (a == "DeepseekV3ForCausalLM") type = "deepseek_v3";
    }
  }
  ConfigModel out;
  if (type == "llama" || type == "mixtral" || type == "qwen3_moe" || type == "qwen2_moe") {
    return LlamaFamilyOfConfig(c, type, what);
  }
  if (type == "deepseek_v3") return DeepseekOfConfig(c, what);
  if (type == "gpt_bigcode") {
    out.arch = Arch::kGptBigCode;
    PTC_ASSIGN_OR_RETURN(Index layers, SizeField(c, "n_layer", what));
    PTC_ASSIGN_OR_RETURN(Index hidden, SizeField(c, "n_embd", what));
    PTC_ASSIGN_OR_RETURN(Index heads, SizeField(c, "n_head", what));
    PTC_ASSIGN_OR_RETURN(Index ffn, SizeField(c, "n_inner", what, 4 * hidden));
    PTC_ASSIGN_OR_RETURN(Index vocab, SizeField(c, "vocab_size", what));
    PTC_ASSIGN_OR_RETURN(Index seq, SizeField(c, "n_positions", what));
    PTC_ASSIGN_OR_RETURN(bool multi_query, BoolField(c, "multi_query", true, what));
    if (multi_query) {
      return InvalidArgumentError(what +
                                  ": \"multi_query\" is true (its default); megatron-gpt has a key and value "
                                  "per head");
    }
    PTC_ASSIGN_OR_RETURN(bool tied, BoolField(c, "tie_word_embeddings", true, what));
    if (!tied) return InvalidArgumentError(what + ": \"tie_word_embeddings\" is false; megatron-gpt ties its head");
    PTC_ASSIGN_OR_RETURN(bool scaled, BoolField(c, "scale_attn_weights", true, what));
    if (!scaled) {
      return InvalidArgumentError(what +
                                  ": \"scale_attn_weights\" is false; megatron-gpt scales its attention "
                                  "scores by 1/sqrt(head_dim)");
    }
    if (auto it = c.find("activation_function"); it != c.end() && !it->is_null()) {
      static constexpr std::string_view kGelus[] = {"gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast"};
      const bool gelu = it->is_string() &&
                        std::find(std::begin(kGelus), std::end(kGelus), it->get<std::string>()) != std::end(kGelus);
      if (!gelu) {
        return InvalidArgumentError(what + ": \"activation_function\" is " + JsonText(*it) +
                                    "; megatron-gpt's MLP is a GeLU (gelu, gelu_pytorch_tanh, gelu_new, gelu_fast)");
      }
    }
    if (hidden % heads != 0) return InvalidArgumentError(what + ": n_embd is not a multiple of n_head");
    PTC_ASSIGN_OR_RETURN(out.dims, Dims(layers, hidden, heads, heads, hidden / heads, ffn, vocab, seq, what));
    PTC_ASSIGN_OR_RETURN(out.schema, LoadSchema("megatron-gpt"));
    return out;
  }
  return InvalidArgumentError(
      what + ": model_type " + (type.empty() ? std::string("(none)") : Quote(type)) +
      " is not one ptcfs maps (llama, mixtral, qwen3_moe, qwen2_moe, deepseek_v3, gpt_bigcode; docs/hf_format.md)");
}

}  // namespace ptc::hf

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
  const char* hf;    // HF's name; {i}: the layer
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

const std::vector<ArchInfo>& Archs() {
  static const std::vector<ArchInfo> archs = {
      {Arch::kLlama,
       "LlamaForCausalLM",
       "llama",
       "decoder.layers.{i}.self_attention.linear_qkv.weight",
       "embedding.word_embeddings.weight",
       {
           {"model.embed_tokens.weight", "embedding.word_embeddings.weight", Cut::kWhole, {"vocab", "hidden"}},
           {"model.layers.{i}.self_attn.q_proj.weight",
            "decoder.layers.{i}.self_attention.linear_qkv.weight",
            Cut::kQuery,
            {"heads*head_dim", "hidden"}},
           {"model.layers.{i}.self_attn.k_proj.weight",
            "decoder.layers.{i}.self_attention.linear_qkv.weight",
            Cut::kKey,
            {"kv_heads*head_dim", "hidden"}},
           {"model.layers.{i}.self_attn.v_proj.weight",
            "decoder.layers.{i}.self_attention.linear_qkv.weight",
            Cut::kValue,
            {"kv_heads*head_dim", "hidden"}},
           {"model.layers.{i}.self_attn.o_proj.weight",
            "decoder.layers.{i}.self_attention.linear_proj.weight",
            Cut::kWhole,
            {"hidden", "heads*head_dim"}},
           {"model.layers.{i}.mlp.gate_proj.weight",
            "decoder.layers.{i}.mlp.linear_fc1.weight",
            Cut::kGate,
            {"ffn", "hidden"}},
           {"model.layers.{i}.mlp.up_proj.weight",
            "decoder.layers.{i}.mlp.linear_fc1.weight",
            Cut::kUp,
            {"ffn", "hidden"}},
           {"model.layers.{i}.mlp.down_proj.weight",
            "decoder.layers.{i}.mlp.linear_fc2.weight",
            Cut::kWhole,
            {"hidden", "ffn"}},
           {"model.layers.{i}.input_layernorm.weight",
            "decoder.layers.{i}.self_attention.linear_qkv.layer_norm_weight",
            Cut::kWhole,
            {"hidden"}},
           {"model.layers.{i}.post_attention_layernorm.weight",
            "decoder.layers.{i}.mlp.linear_fc1.layer_norm_weight",
            Cut::kWhole,
            {"hidden"}},
           {"model.norm.weight", "decoder.final_layernorm.weight", Cut::kWhole, {"hidden"}},
           {"lm_head.weight", "output_layer.weight", Cut::kWhole, {"vocab", "hidden"}, true},
       }},
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

std::string WithLayer(std::string pattern, Index layer) {
  const size_t at = pattern.find("{i}");
  if (at != std::string::npos) pattern.replace(at, 3, std::to_string(layer));
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

nlohmann::json ConfigOf(const Model& model, const ModelSpec& spec, const nlohmann::json& kept) {
  const ModelDims& d = spec.dims;
  nlohmann::json c = kept.is_object() ? kept : nlohmann::json::object();
  const ArchInfo& info = InfoOf(model.arch);
  c["architectures"] = {info.architecture};
  c["model_type"] = info.model_type;
  c["tie_word_embeddings"] = model.tied;
  // transformers 5 writes "dtype", earlier ones (and 5, reading) "torch_dtype".
  c[c.contains("dtype") ? "dtype" : "torch_dtype"] = std::string(pickle::TorchDTypeName(spec.dtype));
  if (model.arch == Arch::kLlama) {
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
    c["attention_bias"] = false;
    c["mlp_bias"] = false;
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

Result<Model> MapModel(const ModelSpec& spec) {
  const Schema& schema = spec.schema;
  const ArchInfo* info = nullptr;
  for (const ArchInfo& a : Archs()) {
    if (schema.Find(a.key_rule) != nullptr) info = &a;
  }
  if (info == nullptr) {
    return InvalidArgumentError("schema " + schema.name +
                                ": Hugging Face has no architecture ptcfs maps it to (it maps Megatron-Core GPT names, "
                                "the built-in llama, to LlamaForCausalLM and legacy Megatron-LM GPT names, "
                                "megatron-gpt, to GPTBigCodeForCausalLM; docs/hf_format.md)");
  }
  Model model;
  model.arch = info->arch;
  // Every rule of the schema must have its HF tensors, every entry its rule.
  std::set<std::string> mapped;
  const Entry* output = nullptr;
  for (const Entry& e : info->entries) {
    mapped.insert(e.rule);
    if (e.output) output = &e;
  }
  for (const TensorRule& r : schema.rules) {
    const Result<uint64_t> tensors = RuleTensors(r, spec.dims);  // none: an MoE rule of a dense model
    if (!mapped.count(r.name) && (!tensors.ok() || *tensors > 0)) {
      return InvalidArgumentError("schema " + schema.name + ": rule " + Quote(r.name) + " has no tensor in " +
                                  info->architecture + " (docs/hf_format.md)");
    }
  }
  const TensorRule* output_rule = output != nullptr ? schema.Find(output->rule) : nullptr;
  model.tied = output_rule == nullptr || output_rule->tied_to == info->embedding;
  if (output_rule != nullptr && !output_rule->tied_to.empty() && !model.tied) {
    return InvalidArgumentError("schema " + schema.name + ": rule " + Quote(output_rule->name) + " is tied to " +
                                Quote(output_rule->tied_to) + ", not to the embedding");
  }
  for (const Entry& e : info->entries) {
    const TensorRule* r = schema.Find(e.rule);
    if (r == nullptr && !e.output) {
      return InvalidArgumentError(std::string(info->architecture) + " needs rule " + Quote(e.rule) + ", which schema " +
                                  schema.name + " lacks");
    }
    if (r != nullptr && IsLayer(e.hf) != (r->pp == PpPlacement::kLayer)) {
      return InvalidArgumentError("schema " + schema.name + ": rule " + Quote(r->name) +
                                  (IsLayer(e.hf) ? " is not" : " is") + " one per layer, unlike " + e.hf);
    }
  }
  const ModelDims& dims = spec.dims;
  if (model.arch == Arch::kGptBigCode && (dims.kv_heads != dims.heads || dims.heads * dims.head_dim != dims.hidden)) {
    return InvalidArgumentError("dims " + dims.ToString() +
                                ": GPTBigCodeForCausalLM has kv_heads = heads and heads*head_dim = hidden");
  }

  ModelSpec params = spec;
  params.optimizer = false;
  PTC_ASSIGN_OR_RETURN(std::vector<GlobalTensor> globals, GlobalTensors(params));
  std::map<std::string, const GlobalTensor*> by_name;
  for (const GlobalTensor& g : globals) by_name[g.name] = &g;
  auto add = [&](const Entry& e, Index layer) -> Status {
    if (e.output && model.tied) return Status::OK();
    const std::string name = WithLayer(e.hf, layer), global = WithLayer(e.rule, layer);
    auto it = by_name.find(global);
    if (it == by_name.end()) return InternalError("no global tensor " + global);
    PTC_ASSIGN_OR_RETURN(LocalTensor t, CutTensor(name, *it->second, e.cut, dims));
    TensorRule want;
    want.name = e.hf;
    for (const std::string& f : e.shape) want.shape.push_back(f);
    PTC_ASSIGN_OR_RETURN(Shape shape, RuleShape(want, dims));
    if (t.shape != shape) {
      return InvalidArgumentError("tensor " + global + " " + ShapeToString(it->second->shape) + " gives " + name + " " +
                                  ShapeToString(t.shape) + ", but the config's " + name + " is " +
                                  ShapeToString(shape));
    }
    model.tensors.push_back(std::move(t));
    return Status::OK();
  };
  const std::vector<Entry>& entries = info->entries;
  size_t first_layer = 0, last_layer = 0;  // entries [first_layer, last_layer) are per layer
  while (first_layer < entries.size() && !IsLayer(entries[first_layer].hf)) ++first_layer;
  last_layer = first_layer;
  while (last_layer < entries.size() && IsLayer(entries[last_layer].hf)) ++last_layer;
  for (size_t i = 0; i < first_layer; ++i) PTC_RETURN_IF_ERROR(add(entries[i], 0));
  for (Index layer = 0; layer < dims.layers; ++layer) {
    for (size_t i = first_layer; i < last_layer; ++i) PTC_RETURN_IF_ERROR(add(entries[i], layer));
  }
  for (size_t i = last_layer; i < entries.size(); ++i) PTC_RETURN_IF_ERROR(add(entries[i], 0));
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
                       Index seq, const std::string& what) {
  const std::string text = "layers=" + std::to_string(layers) + ",hidden=" + std::to_string(hidden) +
                           ",heads=" + std::to_string(heads) + ",vocab=" + std::to_string(vocab) +
                           ",seq=" + std::to_string(seq) + ",ffn=" + std::to_string(ffn) +
                           ",kv_heads=" + std::to_string(kv_heads) + ",head_dim=" + std::to_string(head_dim);
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

}  // namespace

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
      if (a == "GPTBigCodeForCausalLM") type = "gpt_bigcode";
    }
  }
  ConfigModel out;
  if (type == "llama") {
    out.arch = Arch::kLlama;
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
    PTC_ASSIGN_OR_RETURN(bool tied, BoolField(c, "tie_word_embeddings", false, what));
    PTC_ASSIGN_OR_RETURN(out.dims, Dims(layers, hidden, heads, kv_heads, head_dim, ffn, vocab, seq, what));
    PTC_ASSIGN_OR_RETURN(out.schema, LoadSchema("llama"));
    if (tied) {
      // Megatron-Core's share_embeddings_and_output_weights: the output layer is the embedding.
      nlohmann::json doc = out.schema.ToJson();
      doc["name"] = "llama-tied";
      for (auto& rule : doc["tensors"]) {
        if (rule["name"] == "output_layer.weight") {
          rule.erase("shape");
          rule["tied_to"] = "embedding.word_embeddings.weight";
        }
      }
      PTC_ASSIGN_OR_RETURN(out.schema, ParseSchema("llama-tied", doc));
    }
    return out;
  }
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
  return InvalidArgumentError(what + ": model_type " + (type.empty() ? std::string("(none)") : Quote(type)) +
                              " is not one ptcfs maps (llama, gpt_bigcode; docs/hf_format.md)");
}

}  // namespace ptc::hf

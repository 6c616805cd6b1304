// Hugging Face's view of a model (ptc/checkpoint/hf/hf.h, ptc/checkpoint/hf/read.h,
// view/hf_file.h) without a mount or transformers: the names and cuts (q/k/v per
// query group, [gate; up]), tied and untied heads, shards and the index, the
// config both ways, refusals naming the rule, file and tensor; an export
// imported back bit for bit in another layout, and damaged models (a missing
// shard, an index naming a tensor twice, a shape the config does not give, a
// tensor the model lacks) refused with nothing committed.
// (transformers' from_pretrained and save_pretrained: hf_clients_test.)
#include "ptc/checkpoint/hf/hf.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "fs/filesystem.h"
#include "ptc/base/json_fields.h"
#include "ptc/checkpoint/hf/read.h"
#include "ptc/model/schema.h"
#include "test_util.h"
#include "view/hf_file.h"

namespace ptc::hf {
namespace {

using ::ptc::testing::Contains;
using ::ptc::testing::Ptcfs;
using ::ptc::testing::Sh;
using ::ptc::testing::Slurp;
using ::ptc::testing::Spit;
using ::ptc::testing::TempDir;

ModelSpec Spec(const std::string& schema, const std::string& dims, DType dtype = DType::kBF16) {
  ModelSpec spec;
  spec.schema = *LoadSchema(schema);
  spec.dims = *ParseDims(dims);
  spec.dtype = dtype;
  return spec;
}

const LocalTensor* Find(const Model& m, const std::string& name) {
  for (const LocalTensor& t : m.tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Box Rows(Index begin, Index end, Index cols) { return Box{{begin, 0}, {end, cols}}; }

const std::string kLlamaDims = "layers=2,hidden=64,heads=8,kv_heads=2,vocab=96,seq=16,ffn=96";

TEST(HfMap, LlamaCutsQkvPerQueryGroupAndFc1IntoGateAndUp) {
  auto m = MapModel(Spec("llama", kLlamaDims));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->arch, Arch::kLlama);
  EXPECT_FALSE(m->tied);
  // HF's state_dict order: embedding, each layer's attention, MLP and norms, final norm, head.
  std::vector<std::string> names;
  for (const LocalTensor& t : m->tensors) names.push_back(t.name);
  ASSERT_EQ(names.size(), 1 + 2 * 9 + 2u);
  EXPECT_EQ(names.front(), "model.embed_tokens.weight");
  EXPECT_EQ(names[1], "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(names[9], "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(names[10], "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(names.back(), "lm_head.weight");
  // heads=8, kv_heads=2, head_dim=8: each group of linear_qkv is [4 q heads; k; v] = 48 rows.
  const std::string qkv = "decoder.layers.1.self_attention.linear_qkv.weight";
  const LocalTensor* q = Find(*m, "model.layers.1.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->shape, (Shape{64, 64}));
  ASSERT_EQ(q->segments.size(), 2u);
  EXPECT_EQ(q->segments[0].tensor, qkv);
  EXPECT_EQ(q->segments[0].box, Rows(0, 32, 64));
  EXPECT_EQ(q->segments[1].box, Rows(48, 80, 64));
  EXPECT_EQ(q->segments[1].layout, DenseLayout(Rows(48, 80, 64), 32 * 64));  // right after group 0's
  const LocalTensor* k = Find(*m, "model.layers.1.self_attn.k_proj.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->shape, (Shape{16, 64}));
  EXPECT_EQ(k->segments[0].box, Rows(32, 40, 64));
  EXPECT_EQ(k->segments[1].box, Rows(80, 88, 64));
  const LocalTensor* v = Find(*m, "model.layers.1.self_attn.v_proj.weight");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->segments[0].box, Rows(40, 48, 64));
  EXPECT_EQ(v->segments[1].box, Rows(88, 96, 64));
  const LocalTensor* gate = Find(*m, "model.layers.0.mlp.gate_proj.weight");
  const LocalTensor* up = Find(*m, "model.layers.0.mlp.up_proj.weight");
  ASSERT_TRUE(gate != nullptr && up != nullptr);
  EXPECT_EQ(gate->segments, (std::vector<Segment>{{"decoder.layers.0.mlp.linear_fc1.weight", Rows(0, 96, 64),
                                                   DenseLayout(Rows(0, 96, 64))}}));
  EXPECT_EQ(up->segments[0].box, Rows(96, 192, 64));
  EXPECT_EQ(up->segments[0].layout.offset, 0);
  EXPECT_EQ(up->dtype, DType::kBF16);
  // Every element of every global tensor lands in exactly one HF tensor.
  std::map<std::string, Index> covered;
  for (const LocalTensor& t : m->tensors) {
    for (const Segment& s : t.segments) covered[s.tensor] += s.box.volume();
  }
  const auto globals = GlobalTensors(Spec("llama", kLlamaDims));
  ASSERT_TRUE(globals.ok());
  for (const GlobalTensor& g : *globals) {
    EXPECT_EQ(covered[g.name], NumElements(g.shape)) << g.name;
  }
}

TEST(HfMap, TiedHeadsHaveNoLmHeadAndMegatronGptIsGptBigCode) {
  auto config = ModelOfConfig({{"model_type", "llama"},
                               {"num_hidden_layers", 2},
                               {"hidden_size", 64},
                               {"num_attention_heads", 8},
                               {"num_key_value_heads", 2},
                               {"intermediate_size", 96},
                               {"vocab_size", 96},
                               {"tie_word_embeddings", true}},
                              "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->dims.seq, 2048);  // LlamaConfig's default max_position_embeddings
  EXPECT_EQ(config->dims.head_dim, 8);
  ModelSpec spec{config->schema, config->dims, DType::kF32, false};
  auto m = MapModel(spec);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->tied);
  EXPECT_EQ(Find(*m, "lm_head.weight"), nullptr);

  auto gpt = MapModel(Spec("megatron-gpt", "layers=2,hidden=32,heads=4,vocab=64,seq=16", DType::kF32));
  ASSERT_TRUE(gpt.ok()) << gpt.status().ToString();
  EXPECT_EQ(gpt->arch, Arch::kGptBigCode);
  EXPECT_TRUE(gpt->tied);  // word_embeddings_for_head is tied to the embedding
  EXPECT_EQ(gpt->tensors.size(), 2 + 2 * 12 + 2u);
  const LocalTensor* c_attn = Find(*gpt, "transformer.h.1.attn.c_attn.weight");
  ASSERT_NE(c_attn, nullptr);  // q/k/v per head in both: the whole tensor
  EXPECT_EQ(c_attn->segments.size(), 1u);
  EXPECT_EQ(c_attn->segments[0].tensor, "language_model.encoder.layers.1.self_attention.query_key_value.weight");
  auto plan = PlanExport(Spec("megatron-gpt", "layers=2,hidden=32,heads=4,vocab=64,seq=16"), kDefaultShardBytes);
  ASSERT_TRUE(plan.ok());
  const nlohmann::json c = nlohmann::json::parse(plan->config_json);
  EXPECT_EQ(c["architectures"], nlohmann::json::array({"GPTBigCodeForCausalLM"}));
  EXPECT_EQ(c["multi_query"], false);
  EXPECT_EQ(c["n_inner"], 128);
  EXPECT_EQ(c["torch_dtype"], "bfloat16");
}

TEST(HfMap, RefusalsNameTheRule) {
  auto refused = [](const ModelSpec& spec, const std::string& part) {
    auto m = MapModel(spec);
    ASSERT_FALSE(m.ok()) << part;
    EXPECT_EQ(m.status().code(), Code::kInvalidArgument);
    EXPECT_TRUE(Contains(m.status().message(), part)) << m.status().ToString();
  };
  ModelSpec spec = Spec("llama", kLlamaDims);
  // A rule HF's Llama has no tensor for (Qwen2's q/k/v bias, say).
  TensorRule extra = spec.schema.rules[2];
  extra.name = "decoder.layers.{i}.self_attention.linear_qkv.bias";
  spec.schema.rules.push_back(extra);
  refused(spec, "rule 'decoder.layers.{i}.self_attention.linear_qkv.bias' has no tensor in LlamaForCausalLM");
  // A rule it needs, missing.
  spec = Spec("llama", kLlamaDims);
  std::erase_if(spec.schema.rules, [](const TensorRule& r) { return r.name == "decoder.final_layernorm.weight"; });
  refused(spec, "needs rule 'decoder.final_layernorm.weight'");
  // A schema of other names.
  spec = Spec("llama", kLlamaDims);
  spec.schema.name = "mine";
  spec.schema.rules = {spec.schema.rules[0]};
  spec.schema.rules[0].name = "wte";
  refused(spec, "schema mine: Hugging Face has no architecture");
  // GPTBigCode has a key and value per head.
  refused(Spec("megatron-gpt", "layers=2,hidden=32,heads=4,kv_heads=2,vocab=64,seq=16"),
          "GPTBigCodeForCausalLM has kv_heads = heads");
  // A shape the config does not give (a schema of its own with a narrower output layer).
  spec = Spec("llama", kLlamaDims);
  for (TensorRule& r : spec.schema.rules) {
    if (r.name == "output_layer.weight") r.shape = {"vocab/2", "hidden"};
  }
  refused(spec, "gives lm_head.weight [48, 64], but the config's lm_head.weight is [96, 64]");
}

TEST(HfShards, CutInOrderAtTheSizeAsSavePretrainedNamesThem) {
  auto t = [](const std::string& name, Index n) { return LocalTensor{name, DType::kF32, {n}, {}}; };
  // 400, 400, 1200 (over the size: alone), 100 bytes; at most 1000 a shard.
  auto shards = CutShards({t("a", 100), t("b", 100), t("c", 300), t("d", 25)}, 1000);
  ASSERT_EQ(shards.size(), 3u);
  EXPECT_EQ(shards[0].file, "model-00001-of-00003.safetensors");
  EXPECT_EQ(shards[0].tensors, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(shards[0].bytes, 800u);
  EXPECT_EQ(shards[1].tensors, (std::vector<size_t>{2}));
  EXPECT_EQ(shards[2].file, "model-00003-of-00003.safetensors");
  EXPECT_EQ(shards[2].tensors, (std::vector<size_t>{3}));
  shards = CutShards({t("a", 100), t("b", 100)}, 1000);
  ASSERT_EQ(shards.size(), 1u);
  EXPECT_EQ(shards[0].file, "model.safetensors");

  EXPECT_EQ(*ParseShardSize("5GB"), 5'000'000'000u);
  EXPECT_EQ(*ParseShardSize("2GiB"), 2ull << 30);
  EXPECT_EQ(*ParseShardSize("100KB"), 100'000u);
  EXPECT_EQ(*ParseShardSize("4096"), 4096u);
  for (const char* bad : {"", "GB", "5XB", "0", "-5GB", "99999999999999999999"}) {
    EXPECT_FALSE(ParseShardSize(bad).ok()) << bad;
  }

  auto plan = PlanExport(Spec("llama", kLlamaDims), 40'000);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_GT(plan->shards.size(), 1u);
  const nlohmann::json index = nlohmann::json::parse(plan->index_json);
  uint64_t total = 0;
  for (const LocalTensor& l : plan->model.tensors) total += NumElements(l.shape) * DTypeSize(l.dtype);
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(index["weight_map"].size(), plan->model.tensors.size());
  EXPECT_EQ(index["weight_map"]["model.layers.1.mlp.up_proj.weight"], plan->shards.back().file);
  const nlohmann::json c = nlohmann::json::parse(plan->config_json);
  EXPECT_EQ(c["num_key_value_heads"], 2);
  EXPECT_EQ(c["intermediate_size"], 96);
  EXPECT_EQ(c["rms_norm_eps"], 1e-5);  // Megatron-Core's default
  EXPECT_EQ(c["tie_word_embeddings"], false);
  // A config carried from an import keeps its other fields; the model's sizes win.
  auto kept = PlanExport(Spec("llama", kLlamaDims), 40'000,
                         {{"rope_theta", 500000.0}, {"hidden_size", 1}, {"bos_token_id", 7}});
  ASSERT_TRUE(kept.ok());
  const nlohmann::json k = nlohmann::json::parse(kept->config_json);
  EXPECT_EQ(k["rope_theta"], 500000.0);
  EXPECT_EQ(k["bos_token_id"], 7);
  EXPECT_EQ(k["hidden_size"], 64);
  EXPECT_FALSE(k.contains("rms_norm_eps"));
}

TEST(HfConfig, RefusesWhatTheMappingCannotCarry) {
  const nlohmann::json llama = {{"model_type", "llama"},    {"num_hidden_layers", 2},  {"hidden_size", 64},
                                {"num_attention_heads", 8}, {"intermediate_size", 96}, {"vocab_size", 96}};
  auto refused = [](nlohmann::json c, const std::string& part) {
    auto m = ModelOfConfig(c, "dir/config.json");
    ASSERT_FALSE(m.ok()) << part;
    EXPECT_TRUE(Contains(m.status().message(), "dir/config.json")) << m.status().ToString();
    EXPECT_TRUE(Contains(m.status().message(), part)) << m.status().ToString();
  };
  ASSERT_TRUE(ModelOfConfig(llama, "c").ok());
  auto with = [&](const char* key, nlohmann::json v) {
    nlohmann::json c = llama;
    c[key] = std::move(v);
    return c;
  };
  refused(with("model_type", "mistral"), "model_type 'mistral' is not one ptcfs maps");
  refused(with("attention_bias", true), "\"attention_bias\" is true");
  refused(with("hidden_act", "gelu"), "\"hidden_act\" is \"gelu\"");
  refused(with("num_hidden_layers", 0), "\"num_hidden_layers\" must be a positive integer");
  refused(with("num_key_value_heads", 3), "kv_heads");
  nlohmann::json c = llama;
  c.erase("vocab_size");
  refused(c, "\"vocab_size\" is missing");
  refused({{"model_type", "gpt_bigcode"},
           {"n_layer", 2},
           {"n_embd", 32},
           {"n_head", 4},
           {"vocab_size", 64},
           {"n_positions", 16}},
          "\"multi_query\" is true");
  // Issue 41, item 7: what a GPTBigCode or any config says that the mapping cannot carry was
  // accepted silently: relu, unscaled attention, a dtype torch has not, a model_type not a string.
  const nlohmann::json bigcode = {{"model_type", "gpt_bigcode"},
                                  {"n_layer", 2},
                                  {"n_embd", 32},
                                  {"n_head", 4},
                                  {"vocab_size", 64},
                                  {"n_positions", 16},
                                  {"multi_query", false},
                                  {"torch_dtype", "bfloat16"}};
  ASSERT_TRUE(ModelOfConfig(bigcode, "c").ok());
  auto bigcode_with = [&](const char* key, nlohmann::json v) {
    nlohmann::json b = bigcode;
    b[key] = std::move(v);
    return b;
  };
  refused(bigcode_with("activation_function", "relu"), "\"activation_function\" is \"relu\"");
  refused(bigcode_with("scale_attn_weights", false), "\"scale_attn_weights\" is false");
  EXPECT_TRUE(ModelOfConfig(bigcode_with("activation_function", "gelu_pytorch_tanh"), "c").ok());
  refused(with("torch_dtype", "float99"), "\"torch_dtype\" is \"float99\", no torch dtype");
  refused(with("dtype", 16), "\"dtype\" is 16");
  EXPECT_TRUE(ModelOfConfig(with("torch_dtype", "float32"), "c").ok());
  EXPECT_TRUE(ModelOfConfig(with("dtype", "auto"), "c").ok());
  refused(with("model_type", nlohmann::json::array({"llama"})), "\"model_type\" is [\"llama\"], not a string");
}

// Every element of every global tensor of `spec` lands in exactly one HF tensor.
void ExpectCovered(const Model& m, const ModelSpec& spec) {
  std::map<std::string, Index> covered;
  for (const LocalTensor& t : m.tensors) {
    for (const Segment& s : t.segments) covered[s.tensor] += s.box.volume();
  }
  const auto globals = GlobalTensors(spec);
  ASSERT_TRUE(globals.ok());
  EXPECT_EQ(covered.size(), globals->size());
  for (const GlobalTensor& g : *globals) EXPECT_EQ(covered[g.name], NumElements(g.shape)) << g.name;
}

const std::string kMixtralDims = "layers=2,hidden=32,heads=4,kv_heads=2,vocab=64,seq=16,ffn=24,experts=4,moe_ffn=24";

TEST(HfMoe, MixtralCutsEachExpertsFc1IntoW1AndW3) {
  const ModelSpec spec = Spec("llama", kMixtralDims);
  auto m = MapModel(spec);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->arch, Arch::kMixtral);
  EXPECT_STREQ(ArchName(m->arch), "MixtralForCausalLM");
  std::vector<std::string> names;
  for (const LocalTensor& t : m->tensors) names.push_back(t.name);
  // Per layer: q, k, v, o, the router, 4 experts' w1, w2, w3, two norms.
  ASSERT_EQ(names.size(), 1 + 2 * (4 + 1 + 4 * 3 + 2) + 2u);
  EXPECT_EQ(names[5], "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_EQ(names[6], "model.layers.0.block_sparse_moe.experts.0.w1.weight");
  EXPECT_EQ(names[7], "model.layers.0.block_sparse_moe.experts.0.w2.weight");
  EXPECT_EQ(names[8], "model.layers.0.block_sparse_moe.experts.0.w3.weight");
  EXPECT_EQ(names[17], "model.layers.0.block_sparse_moe.experts.3.w3.weight");
  EXPECT_EQ(names[19], "model.layers.0.post_attention_layernorm.weight");
  const std::string fc1 = "decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight";
  const LocalTensor* w1 = Find(*m, "model.layers.1.block_sparse_moe.experts.3.w1.weight");
  const LocalTensor* w3 = Find(*m, "model.layers.1.block_sparse_moe.experts.3.w3.weight");
  const LocalTensor* w2 = Find(*m, "model.layers.1.block_sparse_moe.experts.3.w2.weight");
  ASSERT_TRUE(w1 != nullptr && w2 != nullptr && w3 != nullptr);
  EXPECT_EQ(w1->segments, (std::vector<Segment>{{fc1, Rows(0, 24, 32), DenseLayout(Rows(0, 24, 32))}}));
  EXPECT_EQ(w3->segments, (std::vector<Segment>{{fc1, Rows(24, 48, 32), DenseLayout(Rows(24, 48, 32), 0)}}));
  EXPECT_EQ(w3->shape, (Shape{24, 32}));
  EXPECT_EQ(w2->segments.front().tensor, "decoder.layers.1.mlp.experts.local_experts.3.linear_fc2.weight");
  EXPECT_EQ(w2->shape, (Shape{32, 24}));
  EXPECT_EQ(Find(*m, "model.layers.1.block_sparse_moe.gate.weight")->segments.front().tensor,
            "decoder.layers.1.mlp.router.weight");
  EXPECT_EQ(Find(*m, "model.layers.1.post_attention_layernorm.weight")->segments.front().tensor,
            "decoder.layers.1.pre_mlp_layernorm.weight");
  ExpectCovered(*m, spec);

  // config.json: Mixtral's sizes, and it reads back as the same model.
  auto plan = PlanExport(spec, kDefaultShardBytes);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const nlohmann::json c = nlohmann::json::parse(plan->config_json);
  EXPECT_EQ(c["model_type"], "mixtral");
  EXPECT_EQ(c["num_local_experts"], 4);
  EXPECT_EQ(c["num_experts_per_tok"], 2);
  EXPECT_EQ(c["intermediate_size"], 24);
  auto back = ModelOfConfig(c, "config.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->arch, Arch::kMixtral);
  EXPECT_EQ(back->dims, spec.dims);
  EXPECT_EQ(back->schema.ToJson(), spec.schema.ToJson());
}

// Qwen3-MoE: 4 layers, layer 0 dense (mlp_only_layers), q/k norms.
nlohmann::json Qwen3MoeConfig() {
  return {{"model_type", "qwen3_moe"}, {"num_hidden_layers", 4},        {"hidden_size", 32},
          {"num_attention_heads", 4},  {"num_key_value_heads", 2},      {"head_dim", 16},
          {"intermediate_size", 48},   {"moe_intermediate_size", 16},   {"num_experts", 4},
          {"num_experts_per_tok", 2},  {"decoder_sparse_step", 1},      {"mlp_only_layers", {0}},
          {"vocab_size", 64},          {"max_position_embeddings", 128}};
}

TEST(HfMoe, Qwen3MoeHasQkNormsAndItsDenseLayersAsMlpOnlyLayers) {
  auto config = ModelOfConfig(Qwen3MoeConfig(), "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->arch, Arch::kQwen3Moe);
  EXPECT_EQ(config->dims.ToString(),
            "layers=4,hidden=32,heads=4,vocab=64,seq=128,ffn=48,kv_heads=2,head_dim=16,"
            "experts=4,moe_ffn=16,shared_ffn=0,moe_every=1,dense_first=1");
  EXPECT_EQ(config->schema.name, "llama-qk");
  ASSERT_NE(config->schema.Find("decoder.layers.{i}.self_attention.q_layernorm.weight"), nullptr);
  const ModelSpec spec{config->schema, config->dims, DType::kF32, false};
  auto m = MapModel(spec);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->arch, Arch::kQwen3Moe);
  // Layer 0 dense: Llama's MLP; layers 1-3 the gate and experts.
  EXPECT_NE(Find(*m, "model.layers.0.mlp.gate_proj.weight"), nullptr);
  EXPECT_EQ(Find(*m, "model.layers.0.mlp.gate.weight"), nullptr);
  EXPECT_EQ(Find(*m, "model.layers.1.mlp.gate_proj.weight"), nullptr);
  const LocalTensor* up = Find(*m, "model.layers.3.mlp.experts.2.up_proj.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->segments, (std::vector<Segment>{{"decoder.layers.3.mlp.experts.local_experts.2.linear_fc1.weight",
                                                 Rows(16, 32, 32), DenseLayout(Rows(16, 32, 32), 0)}}));
  const LocalTensor* q_norm = Find(*m, "model.layers.2.self_attn.q_norm.weight");
  ASSERT_NE(q_norm, nullptr);
  EXPECT_EQ(q_norm->shape, (Shape{16}));
  EXPECT_EQ(q_norm->segments.front().tensor, "decoder.layers.2.self_attention.q_layernorm.weight");
  EXPECT_EQ(Find(*m, "model.layers.0.post_attention_layernorm.weight")->segments.front().tensor,
            "decoder.layers.0.mlp.linear_fc1.layer_norm_weight");
  EXPECT_EQ(Find(*m, "model.layers.1.post_attention_layernorm.weight")->segments.front().tensor,
            "decoder.layers.1.pre_mlp_layernorm.weight");
  ExpectCovered(*m, spec);
  auto plan = PlanExport(spec, kDefaultShardBytes, Qwen3MoeConfig());
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const nlohmann::json c = nlohmann::json::parse(plan->config_json);
  EXPECT_EQ(c["mlp_only_layers"], nlohmann::json({0}));
  EXPECT_EQ(c["moe_intermediate_size"], 16);
  EXPECT_EQ(c["num_experts"], 4);
  EXPECT_FALSE(c.contains("num_local_experts"));
  auto back = ModelOfConfig(c, "config.json");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->dims, spec.dims);
  // Every other layer MoE from layer 2 (moe_every=2,dense_first=2): mlp_only_layers 0, 1, 3.
  auto every = ModelOfConfig(
      [] {
        nlohmann::json j = Qwen3MoeConfig();
        j["num_hidden_layers"] = 5;
        j["mlp_only_layers"] = {0, 1, 3};
        return j;
      }(),
      "c");
  ASSERT_TRUE(every.ok()) << every.status().ToString();
  EXPECT_EQ(every->dims.moe_every, 2);
  EXPECT_EQ(every->dims.dense_first, 2);
}

// Qwen2-MoE: layer 0 dense, a shared expert of 40 and its sigmoid gate on every MoE layer.
nlohmann::json Qwen2MoeConfig() {
  nlohmann::json c = Qwen3MoeConfig();
  c["model_type"] = "qwen2_moe";
  c["shared_expert_intermediate_size"] = 40;
  c["qkv_bias"] = false;
  return c;
}

TEST(HfMoe, Qwen2MoeHasTheSharedExpertAndItsGate) {
  auto config = ModelOfConfig(Qwen2MoeConfig(), "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->arch, Arch::kQwen2Moe);
  EXPECT_EQ(config->dims.ToString(),
            "layers=4,hidden=32,heads=4,vocab=64,seq=128,ffn=48,kv_heads=2,head_dim=16,"
            "experts=4,moe_ffn=16,shared_ffn=40,moe_every=1,dense_first=1");
  EXPECT_EQ(config->schema.name, "llama-sg");
  const TensorRule* gate = config->schema.Find("decoder.layers.{i}.mlp.shared_experts.gate_weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->shape, (std::vector<std::string>{"1", "hidden"}));
  const ModelSpec spec{config->schema, config->dims, DType::kF32, false};
  auto m = MapModel(spec);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->arch, Arch::kQwen2Moe);
  EXPECT_STREQ(ArchName(m->arch), "Qwen2MoeForCausalLM");
  std::vector<std::string> names;
  for (const LocalTensor& t : m->tensors) names.push_back(t.name);
  // Layer 1 (MoE): q, k, v, o, the router, 4 experts' gate/up/down, the shared expert's three, its gate, two norms.
  const auto at = std::find(names.begin(), names.end(), "model.layers.1.mlp.gate.weight") - names.begin();
  ASSERT_LT(at + 18, static_cast<ptrdiff_t>(names.size()));
  EXPECT_EQ(names[at + 12], "model.layers.1.mlp.experts.3.down_proj.weight");
  EXPECT_EQ(names[at + 13], "model.layers.1.mlp.shared_expert.gate_proj.weight");
  EXPECT_EQ(names[at + 14], "model.layers.1.mlp.shared_expert.up_proj.weight");
  EXPECT_EQ(names[at + 15], "model.layers.1.mlp.shared_expert.down_proj.weight");
  EXPECT_EQ(names[at + 16], "model.layers.1.mlp.shared_expert_gate.weight");
  EXPECT_EQ(names[at + 17], "model.layers.1.input_layernorm.weight");
  EXPECT_EQ(Find(*m, "model.layers.0.mlp.shared_expert.gate_proj.weight"), nullptr);  // layer 0 dense
  const std::string fc1 = "decoder.layers.2.mlp.shared_experts.linear_fc1.weight";
  const LocalTensor* up = Find(*m, "model.layers.2.mlp.shared_expert.up_proj.weight");
  ASSERT_NE(up, nullptr);
  EXPECT_EQ(up->segments, (std::vector<Segment>{{fc1, Rows(40, 80, 32), DenseLayout(Rows(40, 80, 32), 0)}}));
  EXPECT_EQ(Find(*m, "model.layers.2.mlp.shared_expert.gate_proj.weight")->segments,
            (std::vector<Segment>{{fc1, Rows(0, 40, 32), DenseLayout(Rows(0, 40, 32), 0)}}));
  EXPECT_EQ(Find(*m, "model.layers.2.mlp.shared_expert.down_proj.weight")->shape, (Shape{32, 40}));
  const LocalTensor* sg = Find(*m, "model.layers.3.mlp.shared_expert_gate.weight");
  ASSERT_NE(sg, nullptr);
  EXPECT_EQ(sg->shape, (Shape{1, 32}));
  EXPECT_EQ(sg->segments.front().tensor, "decoder.layers.3.mlp.shared_experts.gate_weight");
  ExpectCovered(*m, spec);
  // config.json: Qwen2-MoE's fields, and it reads back as the same model (with or without the kept config).
  for (const nlohmann::json& kept : {Qwen2MoeConfig(), nlohmann::json()}) {
    auto plan = PlanExport(spec, kDefaultShardBytes, kept);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    const nlohmann::json c = nlohmann::json::parse(plan->config_json);
    EXPECT_EQ(c["model_type"], "qwen2_moe");
    EXPECT_EQ(c["architectures"], nlohmann::json({"Qwen2MoeForCausalLM"}));
    EXPECT_EQ(c["shared_expert_intermediate_size"], 40);
    EXPECT_EQ(c["moe_intermediate_size"], 16);
    EXPECT_EQ(c["intermediate_size"], 48);
    EXPECT_EQ(c["qkv_bias"], false);
    EXPECT_FALSE(c.contains("attention_bias"));
    EXPECT_EQ(c["mlp_only_layers"], nlohmann::json({0}));
    EXPECT_EQ(c["num_experts_per_tok"], kept.is_null() ? 4 : 2);
    auto back = ModelOfConfig(c, "config.json");
    ASSERT_TRUE(back.ok()) << back.status().ToString();
    EXPECT_EQ(back->arch, Arch::kQwen2Moe);
    EXPECT_EQ(back->dims, spec.dims);
    EXPECT_EQ(back->schema.ToJson(), spec.schema.ToJson());
  }
  // Named by its architectures entry alone.
  nlohmann::json by_arch = Qwen2MoeConfig();
  by_arch.erase("model_type");
  by_arch["architectures"] = {"Qwen2MoeForCausalLM"};
  auto named = ModelOfConfig(by_arch, "config.json");
  ASSERT_TRUE(named.ok()) << named.status().ToString();
  EXPECT_EQ(named->arch, Arch::kQwen2Moe);
}

TEST(HfMoe, SharedExpertsRefusalsNameTheFieldOrRule) {
  auto refused = [](const char* key, const nlohmann::json& value, const std::string& part) {
    nlohmann::json c = Qwen2MoeConfig();
    if (value.is_null()) {
      c.erase(key);
    } else {
      c[key] = value;
    }
    auto r = ModelOfConfig(c, "cfg.json");
    ASSERT_FALSE(r.ok()) << part;
    EXPECT_TRUE(Contains(r.status().message(), part)) << r.status().message();
    EXPECT_TRUE(Contains(r.status().message(), "cfg.json")) << r.status().message();
  };
  refused("qkv_bias", nullptr, "\"qkv_bias\" is true (Qwen2-MoE's default)");
  refused("qkv_bias", true, "the llama schema has no q/k/v biases");
  refused("use_sliding_window", true, "\"use_sliding_window\" is true");
  refused("shared_expert_intermediate_size", 0, "\"shared_expert_intermediate_size\" must be a positive integer");
  refused("decoder_sparse_step", 2, "decoder_sparse_step 2");
  // Shared experts without a gate have no HF architecture here (Qwen3-MoE has none, DeepSeek-V3's attention is MLA).
  auto qk = QkNormSchema(*LoadSchema("llama"));
  ASSERT_TRUE(qk.ok()) << qk.status().ToString();
  auto ungated = MapModel(ModelSpec{*qk, *ParseDims(kMixtralDims + ",shared_ffn=8"), DType::kF32, false});
  ASSERT_FALSE(ungated.ok());
  EXPECT_TRUE(Contains(ungated.status().message(),
                       "rule 'decoder.layers.{i}.mlp.shared_experts.linear_fc1.weight' has no tensor in "
                       "Qwen3MoeForCausalLM"))
      << ungated.status().message();
  // The gate with q/k norms: Qwen2-MoE has none.
  auto both = SharedGateSchema(*qk);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  auto qk_gated = MapModel(ModelSpec{*both, *ParseDims(kMixtralDims + ",shared_ffn=8"), DType::kF32, false});
  ASSERT_FALSE(qk_gated.ok());
  EXPECT_TRUE(Contains(qk_gated.status().message(),
                       "rule 'decoder.layers.{i}.self_attention.q_layernorm.weight' has no tensor in "
                       "Qwen2MoeForCausalLM"))
      << qk_gated.status().message();
  // For torchtitan (MapOptions), ungated shared experts map under DeepSeek-V3's names.
  auto titan = MapModel(ModelSpec{*qk, *ParseDims(kMixtralDims + ",shared_ffn=8"), DType::kF32, false},
                        {.ungated_shared_experts = true});
  ASSERT_TRUE(titan.ok()) << titan.status().ToString();
  EXPECT_NE(Find(*titan, "model.layers.1.mlp.shared_experts.down_proj.weight"), nullptr);
  auto no_fc2 = SharedGateSchema(*ParseSchema("x", nlohmann::json::parse(R"({"name": "x", "tensors": [
      {"name": "w", "shape": ["hidden"], "pp": "first"}]})")));
  ASSERT_FALSE(no_fc2.ok());
  EXPECT_TRUE(Contains(no_fc2.status().message(), "shared_experts.linear_fc2.weight")) << no_fc2.status().message();
}

TEST(HfMoe, RefusalsNameTheFieldOrRule) {
  auto refused = [](const nlohmann::json& c, const std::string& part) {
    auto r = ModelOfConfig(c, "cfg.json");
    ASSERT_FALSE(r.ok()) << part;
    EXPECT_TRUE(Contains(r.status().message(), part)) << r.status().message();
    EXPECT_TRUE(Contains(r.status().message(), "cfg.json")) << r.status().message();
  };
  auto with = [](const char* key, nlohmann::json value) {
    nlohmann::json j = Qwen3MoeConfig();
    j[key] = std::move(value);
    return j;
  };
  refused(with("decoder_sparse_step", 2), "decoder_sparse_step 2");  // layers 1 and 3: not l % k == 0
  refused(with("mlp_only_layers", {0, 1, 2, 3}), "no MoE layer");
  refused(with("mlp_only_layers", {7}), "\"mlp_only_layers\" holds 7");
  refused(with("model_type", "qwen2_moe"), "\"qkv_bias\" is true (Qwen2-MoE's default)");
  refused(with("model_type", "deepseek_v2"), "model_type 'deepseek_v2' is not one ptcfs maps");
  nlohmann::json both = Qwen3MoeConfig();
  both["num_local_experts"] = 8;
  refused(both, "\"num_local_experts\" and \"num_experts\" differ");

  auto map_refused = [](const std::string& schema, const std::string& dims, const std::string& part) {
    auto r = MapModel(Spec(schema, dims));
    ASSERT_FALSE(r.ok()) << dims;
    EXPECT_TRUE(Contains(r.status().message(), part)) << r.status().message();
  };
  // Mixtral has no dense layer and no shared experts.
  map_refused("llama", kMixtralDims + ",dense_first=1",
              "rule 'decoder.layers.{i}.mlp.linear_fc1.layer_norm_weight' has no tensor in MixtralForCausalLM");
  map_refused("llama", kMixtralDims + ",shared_ffn=8",
              "rule 'decoder.layers.{i}.mlp.shared_experts.linear_fc1.weight' has no tensor in MixtralForCausalLM");
  auto qk = QkNormSchema(*LoadSchema("llama"));
  ASSERT_TRUE(qk.ok()) << qk.status().ToString();
  auto dense_qk = MapModel(ModelSpec{*qk, *ParseDims(kLlamaDims), DType::kF32, false});
  ASSERT_FALSE(dense_qk.ok());
  EXPECT_TRUE(Contains(dense_qk.status().message(), "Qwen3ForCausalLM")) << dense_qk.status().message();
}

// An exported model on disk, to import or to damage.
class HfFilesTest : public ::testing::Test {
 protected:
  const std::string kDims = "--schema llama --dims layers=2,hidden=32,heads=4,kv_heads=2,vocab=64,seq=16,ffn=48";
  void Run(const std::string& args) {
    auto [code, out] = Ptcfs(args);
    ASSERT_EQ(code, 0) << args << "\n" << out;
  }
  void SetUp() override {
    Run("synth " + kDims + " --dtype bf16 --optimizer adam --config tp=2,pp=2 " + tmp_ / "saved");
    Run("import " + kDims + " --config tp=2,pp=2 " + tmp_ / "saved " + tmp_ / "store");
    Run("export --format hf --shard-size 10KB " + tmp_ / "store " + tmp_ / "hf");
  }
  // `ptcfs import --format hf` of `dir` fails naming every part; no store is made.
  void Refused(const std::string& dir, const std::vector<std::string>& parts) {
    auto [code, out] = Ptcfs("import --format hf " + dir + " " + tmp_ / "new");
    EXPECT_NE(code, 0) << out;
    for (const std::string& part : parts) EXPECT_TRUE(Contains(out, part)) << part << " not in: " << out;
    EXPECT_FALSE(std::filesystem::exists(tmp_ / "new")) << out;
  }
  TempDir tmp_;
};

TEST_F(HfFilesTest, AnExportImportsBackBitForBitInAnyConfig) {
  const nlohmann::json index = nlohmann::json::parse(Slurp(tmp_ / "hf/model.safetensors.index.json"));
  std::set<std::string> files;
  for (const auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  EXPECT_GT(files.size(), 2u);
  for (const std::string& f : files) EXPECT_TRUE(std::filesystem::exists(tmp_ / ("hf/" + f))) << f;
  // Into a store in tp=2 (each HF tensor one piece), then out in tp=1,pp=2 and compared with synth's.
  Run("import --format hf --config tp=2 " + tmp_ / "hf " + tmp_ / "back");
  Run("export --config tp=1,pp=2 " + tmp_ / "back " + tmp_ / "got");
  Run("synth " + kDims + " --dtype bf16 --config tp=1,pp=2 " + tmp_ / "want");
  for (const char* rank : {"rank-00000", "rank-00001"}) {
    auto [code, out] =
        Sh("cmp " + tmp_ / "got/" + rank + "/model.safetensors " + tmp_ / "want/" + rank + "/model.safetensors 2>&1");
    EXPECT_EQ(code, 0) << rank << ": " << out;
  }
  EXPECT_FALSE(std::filesystem::exists(tmp_ / "got/rank-00000/optim.safetensors"));  // not carried
  // Exported again, the same files (the config carried from the import).
  Run("export --format hf --shard-size 10KB " + tmp_ / "back " + tmp_ / "again");
  for (const auto& e : std::filesystem::directory_iterator(tmp_ / "hf")) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(Slurp(e.path()), Slurp(tmp_ / ("again/" + name))) << name;
  }
  // Options that do not apply are refused.
  auto [code, out] = Ptcfs("export --format hf --config tp=2 " + tmp_ / "store " + tmp_ / "x");
  EXPECT_NE(code, 0);
  EXPECT_TRUE(Contains(out, "--config")) << out;
  std::tie(code, out) = Ptcfs("import --format hf " + kDims + " " + tmp_ / "hf " + tmp_ / "y");
  EXPECT_NE(code, 0);
  EXPECT_TRUE(Contains(out, "config.json gives its schema and dims")) << out;
}

// Issue 41, item 3: a directory with model.safetensors and an index (of other
// shards) is read as transformers reads it, the single file, not the index's
// shards: one directory, one model.
TEST_F(HfFilesTest, ASingleFileBesideAnIndexIsWhatTransformersReads) {
  Run("synth " + kDims + " --dtype bf16 --seed 7 --config tp=1 " + tmp_ / "saved7");
  Run("import " + kDims + " --config tp=1 " + tmp_ / "saved7 " + tmp_ / "store7");
  Run("export --format hf " + tmp_ / "store7 " + tmp_ / "hf7");
  ASSERT_TRUE(std::filesystem::exists(tmp_ / "hf7/model.safetensors"));
  ASSERT_FALSE(std::filesystem::exists(tmp_ / "hf7/model.safetensors.index.json"));
  ASSERT_EQ(Sh("cp -r " + tmp_ / "hf " + tmp_ / "both && cp " + tmp_ / "hf7/model.safetensors " + tmp_ / "both/").first,
            0);
  Run("import --format hf " + tmp_ / "both " + tmp_ / "back");
  Run("export --format hf " + tmp_ / "back " + tmp_ / "again");
  auto [code, out] = Sh("cmp " + tmp_ / "again/model.safetensors " + tmp_ / "hf7/model.safetensors 2>&1");
  EXPECT_EQ(code, 0) << "not the single file's model: " << out;
}

TEST_F(HfFilesTest, DamagedModelsAreRefusedNamingTheFileAndTensor) {
  const std::string index = Slurp(tmp_ / "hf/model.safetensors.index.json");
  auto copy = [&](const std::string& name) {
    const std::string dir = tmp_ / name;
    EXPECT_EQ(Sh("cp -r " + tmp_ / "hf " + dir).first, 0);
    return dir;
  };
  // A missing shard.
  std::string dir = copy("missing");
  std::filesystem::remove(dir + "/model-00002-of-00005.safetensors");
  Refused(dir, {"model-00002-of-00005.safetensors: missing", "puts"});
  // The index naming a tensor twice.
  dir = copy("twice");
  std::string text = index;
  const std::string entry = "\"model.norm.weight\": \"";
  const size_t at = text.find(entry);
  ASSERT_NE(at, std::string::npos);
  text.insert(at, "\"model.norm.weight\": \"model-00001-of-00005.safetensors\",\n    ");
  Spit(dir + "/model.safetensors.index.json", text);
  Refused(dir, {"model.safetensors.index.json", "names \"model.norm.weight\" twice"});
  // A shape that does not fit the config.
  dir = copy("shape");
  text = Slurp(dir + "/config.json");
  const size_t ffn = text.find("\"intermediate_size\": 48");
  ASSERT_NE(ffn, std::string::npos);
  text.replace(ffn, 23, "\"intermediate_size\": 24");
  Spit(dir + "/config.json", text);
  Refused(dir, {"tensor model.layers.0.mlp.", "; config.json gives it ["});
  // A tensor the model lacks: renamed in its shard's header and the index (same length).
  dir = copy("unknown");
  const nlohmann::json map = nlohmann::json::parse(index)["weight_map"];
  const std::string shard = dir + "/" + map["model.norm.weight"].get<std::string>();
  for (const std::string& file : {shard, dir + "/model.safetensors.index.json"}) {
    text = Slurp(file);
    const size_t n = text.find("model.norm.weight");
    ASSERT_NE(n, std::string::npos) << file;
    text.replace(n, 17, "model.nurm.weight");
    Spit(file, text);
  }
  Refused(dir, {shard, "tensor model.nurm.weight: LlamaForCausalLM", "has no such tensor"});
  // Nothing committed into an existing store either.
  const auto before = ::ptc::testing::Snapshot(tmp_ / "store");
  auto [code, out] = Ptcfs("import --format hf " + dir + " " + tmp_ / "store");
  EXPECT_NE(code, 0) << out;
  EXPECT_EQ(::ptc::testing::Snapshot(tmp_ / "store"), before);
  // No model at all.
  Refused(tmp_ / "saved", {"config.json"});
}

TEST_F(HfFilesTest, ShardFilesRenderWithoutAMount) {
  // The shard files view/hf_file.h renders are those export wrote (export reads them the same way).
  auto store = Store::Open(Env::Default(), tmp_ / "store");
  ASSERT_TRUE(store.ok());
  auto generation = (*store)->CurrentSnapshot();
  auto plan = ptcfs::PlanHf(*generation, 10'000);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  GenerationReader reader(**store, generation, /*verify=*/true);
  for (size_t i = 0; i < plan->shards.size(); ++i) {
    auto file = ptcfs::MakeHfShardFile(reader, *plan, i, 0);
    ASSERT_TRUE(file.ok());
    EXPECT_EQ((*file)->size(), *ptcfs::HfShardFileSize(*plan, i));
    std::string bytes((*file)->size(), '\0');
    auto n = (*file)->Read(0, bytes.size(), bytes.data(),
                           [](const ShardRecord&, uint64_t, uint64_t) { return Status::OK(); });
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(bytes, Slurp(tmp_ / ("hf/" + plan->shards[i].file))) << plan->shards[i].file;
  }
  EXPECT_EQ(plan->config_json, Slurp(tmp_ / "hf/config.json"));
}

TEST_F(HfFilesTest, TheFilesystemShowsHfAndSaysWhenASchemaHasNone) {
  ptcfs::MountOptions options;
  options.store = tmp_ / "store";
  options.hf = true;
  options.hf_shard_bytes = 10'000;
  auto fs = ptcfs::Filesystem::Create(options);
  ASSERT_TRUE(fs.ok()) << fs.status().ToString();
  auto hf = (*fs)->Lookup(ptcfs::kRootInode, "hf");
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  auto entries = (*fs)->ReadDir(hf->ino);
  ASSERT_TRUE(entries.ok());
  size_t files = 0;
  for (const ptcfs::DirEntry& e : *entries) {
    auto entry = (*fs)->Lookup(hf->ino, e.name);
    ASSERT_TRUE(entry.ok()) << e.name;
    const std::string want = Slurp(tmp_ / ("hf/" + e.name));  // export's
    EXPECT_EQ(static_cast<size_t>(entry->attr.st_size), want.size()) << e.name;
    auto open = (*fs)->Open(entry->ino, O_RDONLY);
    ASSERT_TRUE(open.ok()) << e.name << ": " << open.status().ToString();
    std::string got;
    while (got.size() < want.size()) {
      auto read = (*fs)->Read(open->fh, got.size(), 4096);
      ASSERT_TRUE(read.ok()) << e.name;
      if (read->fd_range.fd >= 0) {  // inside one stored piece: spliced from the shard file
        std::string part(read->fd_length, '\0');
        ASSERT_EQ(pread(read->fd_range.fd, part.data(), part.size(), static_cast<off_t>(read->fd_range.position)),
                  static_cast<ssize_t>(part.size()));
        got += part;
        continue;
      }
      if (read->bytes.empty()) break;
      got.append(read->bytes.data(), read->bytes.size());
    }
    (*fs)->Release(open->fh);
    EXPECT_EQ(got, want) << e.name;
    ++files;
  }
  EXPECT_EQ(files, std::distance(std::filesystem::directory_iterator(tmp_ / "hf"), {}));

  // A schema with a rule HF's Llama has no tensor for: no hf/, and the status says why.
  nlohmann::json schema = LoadSchema("llama")->ToJson();
  schema["name"] = "llama-qkv-bias";
  schema["tensors"].push_back(
      {{"name", "decoder.layers.{i}.self_attention.linear_qkv.bias"}, {"shape", {"hidden"}}, {"pp", "layer"}});
  Spit(tmp_ / "schema.json", schema.dump());
  const std::string model = "--schema " + tmp_ / "schema.json" + " --dims layers=2,hidden=32,heads=4,vocab=64,seq=16";
  Run("synth " + model + " --config tp=1 " + tmp_ / "qk");
  Run("import " + model + " --config tp=1 " + tmp_ / "qk " + tmp_ / "qk-store");
  options.store = tmp_ / "qk-store";
  auto other = ptcfs::Filesystem::Create(options);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  EXPECT_FALSE((*other)->Lookup(ptcfs::kRootInode, "hf").ok());
  const nlohmann::json status = nlohmann::json::parse((*other)->controller().StatusJson((*other)->snapshot()));
  EXPECT_TRUE(Contains(status["last_error"].get<std::string>(),
                       "hf/: schema llama-qkv-bias: rule 'decoder.layers.{i}.self_attention.linear_qkv.bias' has "
                       "no tensor in LlamaForCausalLM"))
      << status.dump();
  EXPECT_TRUE((*other)->Lookup(ptcfs::kRootInode, "model").ok());
}

}  // namespace
}  // namespace ptc::hf

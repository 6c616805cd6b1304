// DeepSeek-V3's multi-head latent attention in each format's names, against
// the real libraries' own module trees (tests/data/mla_names_golden.json,
// made by tests/mla_names_golden.py from transformers' DeepseekV3ForCausalLM
// save_pretrained, torchtitan's DeepSeekV3Model and Megatron-Core's GPTModel
// with MLASelfAttention): HF names and shapes both ways (config.json to a
// model and back), torchtitan's keys and shapes, Megatron-Core's local spec
// names in its registration order, and the refusals that name the rule.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/checkpoint/hf/hf.h"
#include "ptc/checkpoint/megatron/names.h"
#include "test_util.h"

namespace ptc {
namespace {

using namespace ::ptc::testing;  // the helpers of test_util.h
using Named = std::vector<std::pair<std::string, Shape>>;

const nlohmann::json& Golden() {
  static const nlohmann::json golden = [] {
    std::ifstream in(std::string(PTCFS_SOURCE_DIR) + "/tests/data/mla_names_golden.json");
    return nlohmann::json::parse(in);
  }();
  return golden;
}

Named GoldenList(const char* key) {
  Named out;
  for (const auto& e : Golden().at(key)) out.emplace_back(e[0].get<std::string>(), e[1].get<Shape>());
  return out;
}

Named Sorted(Named v) {
  std::sort(v.begin(), v.end());
  return v;
}

// The built-in llama with the router's bias (what an import of HF's DeepseekV3 makes).
ModelSpec DeepseekSpec(const std::string& dims) {
  ModelSpec spec = Spec("llama", dims);
  spec.schema = *hf::ExpertBiasSchema(spec.schema);
  return spec;
}

Named HfNames(const ModelSpec& spec) {
  auto model = hf::MapModel(spec);
  EXPECT_TRUE(model.ok()) << model.status().ToString();
  Named out;
  if (model.ok())
    for (const LocalTensor& t : model->tensors) out.emplace_back(t.name, t.shape);
  return out;
}

TEST(MlaHf, NamesAndShapesAreSavePretrainedsBothWays) {
  auto config = hf::ModelOfConfig(Golden().at("hf_config"), "config.json");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  EXPECT_EQ(config->arch, hf::Arch::kDeepseekV3);
  EXPECT_EQ(config->schema.name, "llama-eb");
  EXPECT_EQ(config->dims, *ParseDims(Golden().at("dims").get<std::string>()));
  const ModelSpec spec{config->schema, config->dims, DType::kF32, false};
  EXPECT_EQ(Sorted(HfNames(spec)), Sorted(GoldenList("hf")));
  EXPECT_EQ(Sorted(HfNames(DeepseekSpec(Golden().at("dims_no_q_lora")))), Sorted(GoldenList("hf_no_q_lora")));
  // The export's config.json is HF's for these sizes and imports as the same model.
  auto plan = hf::PlanExport(spec, hf::kDefaultShardBytes);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  const nlohmann::json written = nlohmann::json::parse(plan->config_json);
  for (const char* key : {"architectures", "model_type", "hidden_size", "intermediate_size", "moe_intermediate_size",
                          "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "n_shared_experts",
                          "n_routed_experts", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim",
                          "qk_nope_head_dim", "first_k_dense_replace", "vocab_size", "max_position_embeddings",
                          "rope_interleave", "n_group", "topk_group", "head_dim"}) {
    EXPECT_EQ(written.at(key), Golden().at("hf_config").at(key)) << key;
  }
  // top-k routing is a setting: kept from the import's config.json, else HF's default (at most every expert).
  EXPECT_EQ(written.at("num_experts_per_tok"), 4);
  auto kept = hf::PlanExport(spec, hf::kDefaultShardBytes, Golden().at("hf_config"));
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(nlohmann::json::parse(kept->config_json).at("num_experts_per_tok"), 2);
  auto again = hf::ModelOfConfig(written, "exported config.json");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->dims, config->dims);
  EXPECT_EQ(again->schema.ToJson(), config->schema.ToJson());
  // q_lora_rank null: one q projection.
  nlohmann::json plain = Golden().at("hf_config");
  plain["q_lora_rank"] = nullptr;
  EXPECT_EQ(hf::ModelOfConfig(plain, "c")->dims, *ParseDims(Golden().at("dims_no_q_lora").get<std::string>()));
}

TEST(MlaHf, RefusalsNameTheFieldOrRule) {
  auto refused = [](nlohmann::json c, const std::string& part) {
    auto r = hf::ModelOfConfig(c, "cfg.json");
    ASSERT_FALSE(r.ok()) << part;
    EXPECT_TRUE(Contains(r.status().message(), part)) << r.status().message();
  };
  auto with = [](const char* key, nlohmann::json v) {
    nlohmann::json c = Golden().at("hf_config");
    c[key] = std::move(v);
    return c;
  };
  refused(with("rope_interleave", false), "\"rope_interleave\" is false");
  refused(with("num_key_value_heads", 2), "\"num_key_value_heads\" 2 differs");
  refused(with("attention_bias", true), "\"attention_bias\" is true");
  refused(with("qk_rope_head_dim", 3), "qk_rope=3 is odd");
  refused(with("kv_lora_rank", -1), "\"kv_lora_rank\" must be a positive integer");
  refused(with("first_k_dense_replace", 3), "leave no MoE layer");
  // An export the architecture cannot say, named.
  auto export_error = [](const ModelSpec& spec) { return hf::MapModel(spec).status().ToString(); };
  const std::string dims = Golden().at("dims");
  EXPECT_TRUE(Contains(export_error(Spec("llama", dims)), "needs rule 'decoder.layers.{i}.mlp.router.expert_bias'"));
  EXPECT_TRUE(Contains(export_error(DeepseekSpec(dims + ",moe_every=2")), "not moe_every=2"));
  EXPECT_TRUE(Contains(export_error(DeepseekSpec("layers=2,hidden=16,heads=4,vocab=32,seq=8,kv_lora=6,qk_nope=4,"
                                                 "qk_rope=2,experts=4,moe_ffn=8,shared_ffn=12")),
                       "shared_ffn=12 is no positive multiple of moe_ffn=8"));
  EXPECT_TRUE(Contains(export_error(Spec("llama", "layers=2,hidden=16,heads=4,vocab=32,seq=8,kv_lora=6,qk_nope=4,"
                                                  "qk_rope=2")),
                       "a dense model with multi-head latent attention"));
}

Named TitanKeys(const ModelSpec& spec) {
  auto tensors = dcp::TorchtitanTensors(spec);
  EXPECT_TRUE(tensors.ok()) << tensors.status().ToString();
  std::map<std::string, Shape> keys;
  if (tensors.ok()) {
    for (const dcp::Tensor& t : *tensors) {
      Shape shape = t.shape;
      if (t.layer >= 0) shape.insert(shape.begin(), t.layers);
      keys[t.key] = shape;
    }
  }
  return Named(keys.begin(), keys.end());
}

// torchtitan's keys: its model's state_dict; the router's bias a tensor of a store that has it,
// else carried as saved (not a key of the model's tensors).
TEST(MlaTorchtitan, KeysAndShapesAreItsModels) {
  EXPECT_EQ(TitanKeys(DeepseekSpec(Golden().at("dims"))), Sorted(GoldenList("titan")));
  EXPECT_EQ(TitanKeys(DeepseekSpec(Golden().at("dims_no_q_lora"))), Sorted(GoldenList("titan_no_q_lora")));
  Named without;
  for (const auto& [key, shape] : Sorted(GoldenList("titan"))) {
    if (key.find("expert_bias_E") == std::string::npos) without.emplace_back(key, shape);
  }
  EXPECT_EQ(TitanKeys(Spec("llama", Golden().at("dims"))), without);
}

// Megatron-Core's local spec, in named_parameters() order (the golden's layers are all MoE:
// a single layer spec), and the tp split its down projections have that TE's lack, refused.
TEST(MlaMegatron, LocalNamesInRegistrationOrder) {
  ASSERT_FALSE(Golden().contains("mcore_error")) << Golden().at("mcore_error");
  std::string all_moe = Golden().at("dims");
  all_moe.replace(all_moe.find("dense_first=1"), 13, "dense_first=0");
  const ModelSpec spec = Spec("llama", all_moe);
  auto view = LayoutView(spec, *ParseConfig("tp=1"), 0);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  Named local;
  for (const LocalTensor& t : megatron::ViewInNameSet(*view, megatron::NameSet::kLocal).model) {
    local.emplace_back(t.name, t.shape);
  }
  EXPECT_EQ(local, GoldenList("mcore_local"));
  // The router's bias is the TopKRouter's expert_bias buffer.
  std::set<std::string> buffers;
  for (const auto& [name, shape] : GoldenList("mcore_buffers")) buffers.insert(name);
  EXPECT_TRUE(buffers.count("decoder.layers.1.mlp.router.expert_bias"));
  // A dense layer's q and kv norms come before its MLP's (fused in te) norm.
  auto dense = LayoutView(Spec("llama", Golden().at("dims")), *ParseConfig("tp=1"), 0);
  ASSERT_TRUE(dense.ok());
  std::vector<std::string> layer0;
  for (const LocalTensor& t : megatron::ViewInNameSet(*dense, megatron::NameSet::kLocal).model) {
    if (t.name.rfind("decoder.layers.0.", 0) == 0) layer0.push_back(t.name.substr(17));
  }
  EXPECT_EQ(layer0, (std::vector<std::string>{
                        "input_layernorm.weight", "self_attention.linear_proj.weight",
                        "self_attention.linear_q_down_proj.weight", "self_attention.linear_q_up_proj.weight",
                        "self_attention.linear_kv_down_proj.weight", "self_attention.linear_kv_up_proj.weight",
                        "self_attention.q_layernorm.weight", "self_attention.kv_layernorm.weight",
                        "pre_mlp_layernorm.weight", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight"}));
  auto split = LayoutView(spec, *ParseConfig("tp=2"), 0);
  ASSERT_TRUE(split.ok());
  const Status s = megatron::CheckNameSetSplits(megatron::NameSet::kLocal, 2, *split);
  EXPECT_TRUE(Contains(s.ToString(), "self_attention.linear_q_down_proj.weight: the local spec's MLASelfAttention "
                                     "splits it over tp=2"))
      << s.ToString();
  EXPECT_TRUE(megatron::CheckNameSetSplits(megatron::NameSet::kTe, 2, *split).ok());
}

// Megatron's legacy tree of an MLA model with experts through the tool: exported in TE's names
// at tp=2 (the up projections cut by heads) and in the local spec's at tp=1, each imported back
// into the same global tensors; the local spec's names at tp=2 are refused naming the tensor.
TEST(MlaMegatron, LegacyTreesExportAndImportBack) {
  TempDir tmp;
  const std::string dims = "--schema llama --dims " + Golden().at("dims").get<std::string>();
  const std::string grid = "tp=2,pp=1,dp=2,ep=2";
  auto run = [](const std::string& args) {
    auto [code, out] = Ptcfs(args);
    EXPECT_EQ(code, 0) << args << "\n" << out;
    return out;
  };
  run("synth " + dims + " --optimizer adam --config " + grid + " " + tmp / "src");
  run("import " + dims + " --config " + grid + " " + tmp / "src " + tmp / "store");
  run("export --config tp=1 " + tmp / "store " + tmp / "want");
  run("export --format megatron --config " + grid + " " + tmp / "store " + tmp / "te");
  run("export --format megatron --names local --config tp=1 " + tmp / "store " + tmp / "local");
  run("import --format megatron " + dims + " --config " + grid + " " + tmp / "te " + tmp / "from-te");
  run("import --format megatron " + dims + " " + tmp / "local " + tmp / "from-local");
  for (const char* back : {"from-te", "from-local"}) {
    run("export --config tp=1 " + tmp / back + " " + tmp / (std::string(back) + "-out"));
    const std::string out = run("diff " + tmp / "want " + tmp / (std::string(back) + "-out") + " " + dims +
                                " --config-a tp=1 --config-b tp=1");
    EXPECT_TRUE(Contains(out, "bit-identical")) << back << ": " << out;
  }
  auto [code, out] = Ptcfs("export --format megatron --names local --config " + grid + " " + tmp / "store " + tmp / "no");
  EXPECT_NE(code, 0);
  EXPECT_TRUE(Contains(out, "linear_q_down_proj.weight: the local spec's MLASelfAttention splits it over tp=2")) << out;
}

}  // namespace
}  // namespace ptc

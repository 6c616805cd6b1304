// Megatron-Core's two name sets (ptc/checkpoint/megatron/names.h): the rename of
// the fused norms, the local spec's registration order (against the order read from
// megatron-core's source, written out here), views in either set, and recognising a
// file's set.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "ptc/checkpoint/megatron/names.h"
#include "test_util.h"

namespace ptc::megatron {
namespace {

using ::ptc::testing::LayoutView;

using ::ptc::testing::Contains;

TEST(MegatronNameSet, ParsesItsTwoNames) {
  EXPECT_EQ(*ParseNameSet("te"), NameSet::kTe);
  EXPECT_EQ(*ParseNameSet("local"), NameSet::kLocal);
  EXPECT_EQ(NameSetName(NameSet::kLocal), "local");
  auto bad = ParseNameSet("TE");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(Contains(bad.status().message(), "names 'TE': te (")) << bad.status().message();
}

TEST(MegatronNameSet, RenamesTheFusedNormsOnly) {
  EXPECT_EQ(NameIn(NameSet::kLocal, "decoder.layers.3.self_attention.linear_qkv.layer_norm_weight"),
            "decoder.layers.3.input_layernorm.weight");
  EXPECT_EQ(NameIn(NameSet::kLocal, "decoder.layers.{i}.mlp.linear_fc1.layer_norm_weight"),
            "decoder.layers.{i}.pre_mlp_layernorm.weight");
  EXPECT_EQ(NameIn(NameSet::kLocal, "decoder.layers.0.self_attention.linear_qkv.layer_norm_bias"),
            "decoder.layers.0.input_layernorm.bias");
  EXPECT_EQ(NameIn(NameSet::kLocal, "decoder.layers.0.mlp.linear_fc1.layer_norm_bias"),
            "decoder.layers.0.pre_mlp_layernorm.bias");
  EXPECT_EQ(NameIn(NameSet::kTe, "decoder.layers.0.mlp.linear_fc1.layer_norm_weight"),
            "decoder.layers.0.mlp.linear_fc1.layer_norm_weight");
  for (const char* same : {"decoder.layers.0.self_attention.linear_qkv.weight", "decoder.final_layernorm.weight",
                           "decoder.layers.0.input_layernorm.weight", "layer_norm_weight",
                           "language_model.encoder.layers.0.input_layernorm.weight"}) {
    EXPECT_EQ(NameIn(NameSet::kLocal, same), same);
  }
}

// The llama schema's layer rules in te names and order, and what Megatron-Core's local spec
// registers (TransformerLayer.__init__: input_layernorm, self_attention (Attention builds
// linear_proj, SelfAttention then linear_qkv), pre_mlp_layernorm, mlp (linear_fc1, linear_fc2)).
const std::vector<std::string> kTeLayer = {
    "embedding.word_embeddings.weight",
    "decoder.layers.0.self_attention.linear_proj.weight",
    "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
    "decoder.layers.0.self_attention.linear_qkv.weight",
    "decoder.layers.0.mlp.linear_fc1.layer_norm_weight",
    "decoder.layers.0.mlp.linear_fc1.weight",
    "decoder.layers.0.mlp.linear_fc2.weight",
    "decoder.layers.1.self_attention.linear_proj.weight",
    "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight",
    "decoder.layers.1.self_attention.linear_qkv.weight",
    "decoder.layers.1.mlp.linear_fc1.layer_norm_weight",
    "decoder.layers.1.mlp.linear_fc1.weight",
    "decoder.layers.1.mlp.linear_fc2.weight",
    "decoder.final_layernorm.weight",
    "output_layer.weight",
};
const std::vector<std::string> kLocalLayer = {
    "embedding.word_embeddings.weight",
    "decoder.layers.0.input_layernorm.weight",
    "decoder.layers.0.self_attention.linear_proj.weight",
    "decoder.layers.0.self_attention.linear_qkv.weight",
    "decoder.layers.0.pre_mlp_layernorm.weight",
    "decoder.layers.0.mlp.linear_fc1.weight",
    "decoder.layers.0.mlp.linear_fc2.weight",
    "decoder.layers.1.input_layernorm.weight",
    "decoder.layers.1.self_attention.linear_proj.weight",
    "decoder.layers.1.self_attention.linear_qkv.weight",
    "decoder.layers.1.pre_mlp_layernorm.weight",
    "decoder.layers.1.mlp.linear_fc1.weight",
    "decoder.layers.1.mlp.linear_fc2.weight",
    "decoder.final_layernorm.weight",
    "output_layer.weight",
};

std::vector<std::string> Ordered(NameSet names, const std::vector<std::string>& te) {
  std::vector<std::string> out;
  for (size_t i : RegistrationOrder(names, te)) out.push_back(NameIn(names, te[i]));
  return out;
}

TEST(MegatronNameSet, LocalOrderIsTheLocalSpecsRegistrationOrder) {
  EXPECT_EQ(Ordered(NameSet::kTe, kTeLayer), kTeLayer);
  EXPECT_EQ(Ordered(NameSet::kLocal, kTeLayer), kLocalLayer);
  // With norm biases (LayerNorm): weight then bias, both before the attention / the MLP.
  const std::vector<std::string> te = {"d.l.0.self_attention.linear_proj.weight",
                                       "d.l.0.self_attention.linear_proj.bias",
                                       "d.l.0.self_attention.linear_qkv.layer_norm_weight",
                                       "d.l.0.self_attention.linear_qkv.layer_norm_bias",
                                       "d.l.0.self_attention.linear_qkv.weight",
                                       "d.l.0.mlp.linear_fc1.layer_norm_weight",
                                       "d.l.0.mlp.linear_fc1.layer_norm_bias",
                                       "d.l.0.mlp.linear_fc1.weight"};
  const std::vector<std::string> local = {"d.l.0.input_layernorm.weight",
                                          "d.l.0.input_layernorm.bias",
                                          "d.l.0.self_attention.linear_proj.weight",
                                          "d.l.0.self_attention.linear_proj.bias",
                                          "d.l.0.self_attention.linear_qkv.weight",
                                          "d.l.0.pre_mlp_layernorm.weight",
                                          "d.l.0.pre_mlp_layernorm.bias",
                                          "d.l.0.mlp.linear_fc1.weight"};
  EXPECT_EQ(Ordered(NameSet::kLocal, te), local);
  // A schema written in local names (or without fused norms) keeps its order and names.
  EXPECT_EQ(Ordered(NameSet::kLocal, kLocalLayer), kLocalLayer);
}

TEST(MegatronNameSet, ViewsRenameModelAndOptimizerStateAndKeepTheirSegments) {
  const ModelSpec spec =
      testing::Spec("llama", "layers=4,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=64,seq=16", DType::kBF16, true);
  const ParallelConfig config = *ParseConfig("tp=2,pp=2");
  const RankView view = *LayoutView(spec, config, config.RankOf(RankCoords{1, 0, 1}));  // tp 1, stage 1
  std::vector<size_t> from;
  const RankView local = ViewInNameSet(view, NameSet::kLocal, &from);
  ASSERT_EQ(local.model.size(), view.model.size());
  ASSERT_EQ(from.size(), view.model.size());
  // Stage 1 holds global layers 2 and 3 as local layers 0 and 1, then the final norm and output.
  std::vector<std::string> names;
  for (const LocalTensor& t : local.model) names.push_back(t.name);
  EXPECT_EQ(names, std::vector<std::string>(kLocalLayer.begin() + 1, kLocalLayer.end()));
  std::set<size_t> seen(from.begin(), from.end());
  EXPECT_EQ(seen.size(), from.size());
  for (size_t i = 0; i < from.size(); ++i) {
    const LocalTensor &got = local.model[i], &was = view.model[from[i]];
    EXPECT_EQ(got.name, NameIn(NameSet::kLocal, was.name));
    EXPECT_EQ(got.shape, was.shape);
    ASSERT_EQ(got.segments.size(), was.segments.size());
    EXPECT_EQ(got.segments[0].tensor, was.segments[0].tensor);  // global names stay the schema's
  }
  EXPECT_EQ(local.model[0].segments[0].tensor, "decoder.layers.2.self_attention.linear_qkv.layer_norm_weight");
  ASSERT_EQ(local.optim.size(), view.optim.size());
  for (size_t k = 0; k < local.optim.size(); ++k) {
    const std::string& was = view.optim[k].name;
    const size_t dot = was.rfind('.');
    EXPECT_EQ(local.optim[k].name, NameIn(NameSet::kLocal, was.substr(0, dot)) + was.substr(dot));
  }
  EXPECT_TRUE(std::any_of(local.optim.begin(), local.optim.end(), [](const LocalTensor& t) {
    return t.name == "decoder.layers.0.input_layernorm.weight.exp_avg_sq";
  }));
  // te: the view itself.
  const RankView te = ViewInNameSet(view, NameSet::kTe, &from);
  for (size_t i = 0; i < te.model.size(); ++i) {
    EXPECT_EQ(from[i], i);
    EXPECT_EQ(te.model[i].name, view.model[i].name);
  }
}

TEST(MegatronNameSet, RecognisesAFilesSetAndRefusesMixedOnes) {
  const ModelSpec spec = testing::Spec("llama", "layers=2,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=64,seq=16");
  const RankView view = *LayoutView(spec, *ParseConfig("tp=1"), 0);
  auto where = [](const std::string& name) { return "f.pt: model/" + name; };
  auto recognise = [&](const std::set<std::string>& file) {
    return RecogniseNameSet(
        view, [&](const std::string& n) { return file.count(n) > 0; }, where);
  };
  std::set<std::string> te(kTeLayer.begin(), kTeLayer.end()), local(kLocalLayer.begin(), kLocalLayer.end());
  EXPECT_EQ(*recognise(te), NameSet::kTe);
  EXPECT_EQ(*recognise(local), NameSet::kLocal);
  EXPECT_EQ(*recognise({}), NameSet::kTe);  // nothing to tell: te, and the look-ups name what is missing
  std::set<std::string> mixed = local;
  mixed.erase("decoder.layers.1.pre_mlp_layernorm.weight");
  mixed.insert("decoder.layers.1.mlp.linear_fc1.layer_norm_weight");
  auto m = recognise(mixed);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), Code::kInvalidArgument);
  EXPECT_TRUE(Contains(m.status().message(),
                       "f.pt: model/decoder.layers.1.mlp.linear_fc1.layer_norm_weight: in Transformer Engine's names "
                       "(te), but f.pt: model/decoder.layers.0.input_layernorm.weight is in the local spec's names "
                       "(local)"))
      << m.status().message();
  std::set<std::string> both = te;
  both.insert("decoder.layers.0.input_layernorm.weight");
  auto b = recognise(both);
  ASSERT_FALSE(b.ok());
  EXPECT_TRUE(Contains(b.status().message(),
                       "f.pt: model/decoder.layers.0.self_attention.linear_qkv.layer_norm_weight: also held as "
                       "f.pt: model/decoder.layers.0.input_layernorm.weight"))
      << b.status().message();
  // A schema without fused norms: te, whatever the file holds.
  const ModelSpec gpt = testing::Spec("megatron-gpt", "layers=2,hidden=32,heads=4,vocab=64,seq=16");
  const RankView gpt_view = *LayoutView(gpt, *ParseConfig("tp=1"), 0);
  EXPECT_EQ(*RecogniseNameSet(
                gpt_view, [](const std::string&) { return true; }, where),
            NameSet::kTe);
}

}  // namespace
}  // namespace ptc::megatron

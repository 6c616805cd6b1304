// Multi-head latent attention (DeepSeek-V3's MLA) in the model layer: the
// dims (q_lora, kv_lora, qk_nope, qk_rope, v_head) and each of their rules'
// messages, the llama schema's MLA rules (shapes from Megatron-Core's
// MLASelfAttention, the order its modules register them), their tp cuts (up
// projections by heads, down projections and norms whole) and a model
// without MLA keeping exactly its tensors.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "ptc/model/expr.h"
#include "test_util.h"

namespace ptc {
namespace {

using namespace ::ptc::testing;  // the helpers of test_util.h

// 3 layers, layer 0 dense; q compressed to 8, kv to 6; per head 4 + 2 q/k rows, 6 v rows.
constexpr const char* kMlaDims =
    "layers=3,hidden=16,heads=4,vocab=32,seq=8,ffn=24,q_lora=8,kv_lora=6,qk_nope=4,qk_rope=2,v_head=6,"
    "experts=4,moe_ffn=8,shared_ffn=8,dense_first=1";
constexpr const char* kAttn = "decoder.layers.1.self_attention.";

std::string Error(const Status& s) { return s.ok() ? "OK" : s.message(); }

void ExpectHas(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << text << "' lacks '" << part << "'";
}

TEST(MlaDims, ParseDefaultsAndText) {
  auto d = ParseDims("layers=2,hidden=16,heads=4,vocab=32,seq=8,kv_lora=6,qk_nope=4,qk_rope=2");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_TRUE(d->IsMla());
  EXPECT_EQ(d->q_lora, 0);   // no q compression: one q projection
  EXPECT_EQ(d->v_head, 4);   // qk_nope, as DeepSeek-V3 and torchtitan have them
  EXPECT_EQ(d->head_dim, 2); // qk_rope, as HF's DeepseekV3Config
  EXPECT_EQ(d->ToString(),
            "layers=2,hidden=16,heads=4,vocab=32,seq=8,ffn=64,kv_heads=4,head_dim=2,q_lora=0,kv_lora=6,qk_nope=4,"
            "qk_rope=2,v_head=4");
  EXPECT_EQ(*ParseDims(d->ToString()), *d);
  auto moe = ParseDims(kMlaDims);
  ASSERT_TRUE(moe.ok()) << moe.status().ToString();
  EXPECT_EQ(*ParseDims(moe->ToString()), *moe);
  // Without MLA the text is today's and formulas read v_head as head_dim.
  auto plain = ParseDims("layers=2,hidden=16,heads=4,vocab=32,seq=8,kv_lora=0");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->ToString(), "layers=2,hidden=16,heads=4,vocab=32,seq=8,ffn=64,kv_heads=4,head_dim=4");
  EXPECT_EQ(plain->Lookup("v_head"), 4);
  EXPECT_EQ(plain->Lookup("kv_lora"), 0);
}

TEST(MlaDims, EachRuleNamed) {
  auto error = [](const std::string& extra) {
    return Error(ParseDims("layers=4,hidden=16,heads=4,vocab=32,seq=8," + extra).status());
  };
  ExpectHas(error("q_lora=8"), "q_lora= needs kv_lora=");
  ExpectHas(error("kv_lora=0,qk_rope=2"), "qk_rope= needs kv_lora=");
  ExpectHas(error("v_head=4"), "v_head= needs kv_lora=");
  ExpectHas(error("kv_lora=6,qk_rope=2"), "missing qk_nope=");
  ExpectHas(error("kv_lora=6,qk_nope=4"), "missing qk_rope=");
  ExpectHas(error("kv_lora=6,qk_nope=4,qk_rope=3"), "qk_rope=3 is odd");
  ExpectHas(error("kv_lora=6,qk_nope=4,qk_rope=2,kv_heads=2"), "kv_heads=2 with kv_lora=");
  ExpectHas(error("kv_lora=6,qk_nope=4,qk_rope=2,head_dim=4"), "head_dim=4 with kv_lora=");
  ExpectHas(error("kv_lora=6,qk_nope=0,qk_rope=2"), "qk_nope");
  ExpectHas(error("kv_lora=-1"), "kv_lora");
  ExpectHas(error("kvlora=6"), "unknown key 'kvlora'");
  // MLA needs no hidden = heads * head_dim: DeepSeek-V3's heads are not hidden's blocks.
  EXPECT_TRUE(ParseDims("layers=4,hidden=18,heads=4,vocab=32,seq=8,kv_lora=6,qk_nope=4,qk_rope=2").ok());
}

TEST(MlaDims, NotInFormulas) {
  const ModelDims d = *ParseDims("layers=2,hidden=16,heads=4,vocab=32,seq=8,kv_lora=6,qk_nope=4,qk_rope=2,q_lora=0");
  auto eval = [&d](const char* f) { return EvalExpr(f, [&d](std::string_view n) { return d.Lookup(n); }); };
  EXPECT_EQ(*eval("!q_lora"), 1);
  EXPECT_EQ(*eval("kv_lora*!q_lora"), 6);  // "when": not 0
  EXPECT_EQ(*eval("!kv_lora"), 0);
  EXPECT_EQ(*eval("!!kv_lora"), 1);
  EXPECT_EQ(*eval("!(kv_lora-6)+1"), 2);
  ExpectHas(Error(eval("!").status()), "unexpected end");
}

std::map<std::string, Shape> Shapes(const ModelSpec& spec) {
  std::map<std::string, Shape> out;
  auto globals = GlobalTensors(spec);
  EXPECT_TRUE(globals.ok()) << globals.status().ToString();
  if (globals.ok())
    for (const GlobalTensor& g : *globals) out[g.name] = g.shape;
  return out;
}

// Shapes as Megatron-Core's MLASelfAttention builds them (multi_latent_attention.py).
TEST(MlaLayout, GlobalTensorsAndShapes) {
  auto shapes = Shapes(Spec("llama", kMlaDims));
  const std::string a = kAttn;
  EXPECT_EQ(shapes["decoder.layers.1.input_layernorm.weight"], (Shape{16}));
  EXPECT_EQ(shapes[a + "linear_q_down_proj.weight"], (Shape{8, 16}));
  EXPECT_EQ(shapes[a + "linear_q_up_proj.layer_norm_weight"], (Shape{8}));
  EXPECT_EQ(shapes[a + "linear_q_up_proj.weight"], (Shape{4 * (4 + 2), 8}));
  EXPECT_EQ(shapes[a + "linear_kv_down_proj.weight"], (Shape{6 + 2, 16}));
  EXPECT_EQ(shapes[a + "linear_kv_up_proj.layer_norm_weight"], (Shape{6}));
  EXPECT_EQ(shapes[a + "linear_kv_up_proj.weight"], (Shape{4 * (4 + 6), 6}));
  EXPECT_EQ(shapes[a + "linear_proj.weight"], (Shape{16, 4 * 6}));
  EXPECT_FALSE(shapes.count(a + "linear_qkv.weight"));
  EXPECT_FALSE(shapes.count(a + "linear_qkv.layer_norm_weight"));
  EXPECT_FALSE(shapes.count(a + "linear_q_proj.weight"));
  // Per layer: norm, linear_proj, 6 MLA tensors; dense layer 0: 3 MLP; MoE layers 1, 2: 1+1+8+2.
  EXPECT_EQ(shapes.size(), 2 + 3 * 8 + 3 + 2 * 12 + 1u);
  // q_lora=0: one q projection in place of the down and up projections and their norm.
  auto q = Shapes(Spec("llama", "layers=2,hidden=16,heads=4,vocab=32,seq=8,kv_lora=6,qk_nope=4,qk_rope=2"));
  EXPECT_EQ(q[std::string("decoder.layers.0.self_attention.linear_q_proj.weight")], (Shape{24, 16}));
  EXPECT_FALSE(q.count("decoder.layers.0.self_attention.linear_q_down_proj.weight"));
  EXPECT_FALSE(q.count("decoder.layers.0.self_attention.linear_q_up_proj.layer_norm_weight"));
  EXPECT_EQ(q.size(), 2 + 2 * 9 + 1u);
}

// Without kv_lora a llama has exactly the tensors it had before MLA.
TEST(MlaLayout, ModelWithoutMlaKeepsItsTensors) {
  auto shapes = Shapes(Spec("llama", "layers=2,hidden=16,heads=4,kv_heads=2,vocab=32,seq=8,ffn=24"));
  std::set<std::string> names;
  for (const auto& [name, shape] : shapes) names.insert(name.substr(0, 16) == "decoder.layers.0" ? name : "");
  names.erase("");
  EXPECT_EQ(names, (std::set<std::string>{"decoder.layers.0.self_attention.linear_proj.weight",
                                          "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight",
                                          "decoder.layers.0.self_attention.linear_qkv.weight",
                                          "decoder.layers.0.mlp.linear_fc1.layer_norm_weight",
                                          "decoder.layers.0.mlp.linear_fc1.weight",
                                          "decoder.layers.0.mlp.linear_fc2.weight"}));
  EXPECT_EQ(shapes["decoder.layers.0.self_attention.linear_proj.weight"], (Shape{16, 16}));
  EXPECT_EQ(shapes["decoder.layers.0.self_attention.linear_qkv.weight"], (Shape{32, 16}));
}

// A rank's attention in Megatron-Core's registration order, and its tp cuts:
// the up projections and linear_proj by heads, the down projections and norms whole.
TEST(MlaLayout, OrderAndTpCuts) {
  const ModelSpec spec = Spec("llama", kMlaDims);
  auto view = LayoutView(spec, *ParseConfig("tp=2,dp=1"), 1);
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  std::vector<std::string> order;
  std::map<std::string, std::string> boxes;
  for (const LocalTensor& t : view->model) {
    if (t.name.rfind("decoder.layers.1.", 0) != 0 || t.name.find(".mlp.") != std::string::npos) continue;
    order.push_back(t.name.substr(17));
    ASSERT_EQ(t.segments.size(), 1u) << t.name;
    boxes[t.name.substr(17)] = t.segments[0].box.ToString();
  }
  EXPECT_EQ(order, (std::vector<std::string>{
                       "input_layernorm.weight", "self_attention.linear_proj.weight",
                       "self_attention.linear_q_down_proj.weight", "self_attention.linear_q_up_proj.layer_norm_weight",
                       "self_attention.linear_q_up_proj.weight", "self_attention.linear_kv_down_proj.weight",
                       "self_attention.linear_kv_up_proj.layer_norm_weight", "self_attention.linear_kv_up_proj.weight",
                       "pre_mlp_layernorm.weight"}));
  EXPECT_EQ(boxes["self_attention.linear_proj.weight"], (Box{{0, 12}, {16, 24}}.ToString()));
  EXPECT_EQ(boxes["self_attention.linear_q_up_proj.weight"], (Box{{12, 0}, {24, 8}}.ToString()));
  EXPECT_EQ(boxes["self_attention.linear_kv_up_proj.weight"], (Box{{20, 0}, {40, 6}}.ToString()));
  EXPECT_EQ(boxes["self_attention.linear_q_down_proj.weight"], (Box{{0, 0}, {8, 16}}.ToString()));
  EXPECT_EQ(boxes["self_attention.linear_kv_down_proj.weight"], (Box{{0, 0}, {8, 16}}.ToString()));
  EXPECT_EQ(boxes["self_attention.linear_kv_up_proj.layer_norm_weight"], (Box{{0}, {6}}.ToString()));
}

// tp must divide heads: the first rule cut by heads is named, once.
TEST(MlaLayout, HeadsNotDividedByTpNamed) {
  const ModelSpec spec = Spec("llama", kMlaDims);
  ExpectHas(Error(ValidateConfig(spec, *ParseConfig("tp=8,dp=1"))),
            "rule 'decoder.layers.{i}.self_attention.linear_proj.weight': tp=8 does not divide heads=4");
  const ModelSpec q = Spec("llama", "layers=2,hidden=16,heads=6,vocab=36,seq=8,ffn=24,kv_lora=6,qk_nope=4,qk_rope=2");
  EXPECT_EQ(Error(ValidateConfig(q, *ParseConfig("tp=3,dp=1"))), "OK");
  ExpectHas(Error(ValidateConfig(q, *ParseConfig("tp=4,dp=1"))), "tp=4 does not divide heads=6");
  // ep, etp and pp act on the MoE and layer rules as without MLA.
  EXPECT_TRUE(ValidateConfig(spec, *ParseConfig("tp=2,pp=3,dp=2,ep=4,etp=1")).ok());
}

}  // namespace
}  // namespace ptc

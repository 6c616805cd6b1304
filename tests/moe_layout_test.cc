// Mixture of experts in the model layer: MoE dims, the cp/ep/etp config keys,
// the rank grids against Megatron-Core's own groups (tests/data/
// moe_grid_golden.json, made by tests/moe_grid_golden.py), every expert rule's
// message, and the views (experts whole per ep rank, split over etp, ZeRO-1
// over edp for experts and dp x cp for the rest).
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "ptc/model/rule_layers.h"
#include "test_util.h"

namespace ptc {
namespace {

using namespace ::ptc::testing;  // the helpers of test_util.h

// 4 layers, layer 0 dense (dense_first=1), 4 experts of ffn 8, shared experts of ffn 8.
constexpr const char* kMoeDims =
    "layers=4,hidden=16,heads=4,kv_heads=2,vocab=32,seq=8,ffn=24,experts=4,moe_ffn=8,shared_ffn=8,dense_first=1";

std::string Error(const Status& s) { return s.ok() ? "OK" : s.message(); }

void ExpectHas(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "'" << text << "' lacks '" << part << "'";
}

TEST(MoeDims, ParseDefaultsAndText) {
  auto d = ParseDims("layers=6,hidden=16,heads=4,vocab=32,seq=8,experts=8,moe_every=2");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->moe_ffn, d->ffn);  // as Megatron-Core's moe_ffn_hidden_size defaults
  EXPECT_EQ(d->shared_ffn, 0);
  EXPECT_EQ(d->MoeLayers(), 3);  // 0, 2, 4 (moe_layer_freq=2)
  EXPECT_TRUE(d->IsMoeLayer(0));
  EXPECT_FALSE(d->IsMoeLayer(1));
  EXPECT_EQ(*ParseDims(d->ToString()), *d);
  ExpectHas(d->ToString(), "experts=8,moe_ffn=64,shared_ffn=0,moe_every=2,dense_first=0");
  // DeepSeek-V3's first_k_dense_replace.
  auto k = ParseDims("layers=61,hidden=16,heads=4,vocab=32,seq=8,experts=8,dense_first=3");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->MoeLayers(), 58);
  EXPECT_FALSE(k->IsMoeLayer(2));
  EXPECT_TRUE(k->IsMoeLayer(3));
  // A dense model's text is today's, whether experts=0 is written or not.
  auto dense = ParseDims("layers=2,hidden=16,heads=4,vocab=32,seq=8,experts=0");
  ASSERT_TRUE(dense.ok());
  EXPECT_EQ(dense->ToString(), "layers=2,hidden=16,heads=4,vocab=32,seq=8,ffn=64,kv_heads=4,head_dim=4");
  EXPECT_EQ(dense->MoeLayers(), 0);
}

TEST(MoeDims, EachRuleNamed) {
  auto error = [](const std::string& extra) {
    return Error(ParseDims("layers=4,hidden=16,heads=4,vocab=32,seq=8," + extra).status());
  };
  ExpectHas(error("moe_ffn=8"), "moe_ffn= needs experts=");
  ExpectHas(error("experts=0,shared_ffn=4"), "shared_ffn= needs experts=");
  ExpectHas(error("experts=4,dense_first=4"), "leave no MoE layer among layers=4");
  ExpectHas(error("experts=4,dense_first=1,moe_every=5"), "leave no MoE layer");
  ExpectHas(error("experts=100000"), "exceeds the limit of 16384 experts");
  ExpectHas(error("experts=4,moe_every=0"), "moe_every");
  ExpectHas(error("experts=-1"), "experts");
  ExpectHas(error("expert=4"), "unknown key 'expert'");
}

TEST(MoeConfig, ParsePrintAndDefaults) {
  auto c = ParseConfig("tp=2,pp=2,dp=4,cp=2,ep=4,etp=1,zero=1");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->world_size(), 32);
  EXPECT_EQ(c->expert_tp(), 1);
  EXPECT_EQ(c->expert_dp(), 4);  // 2*2*4 / (1*4)
  EXPECT_EQ(c->dense_zero_ranks(), 8);
  EXPECT_EQ(c->ToString(), "tp=2,pp=2,dp=4,cp=2,ep=4,etp=1,zero=1,per_worker=8");
  EXPECT_EQ(*ParseConfig(c->ToString()), *c);
  // etp = tp is the default, written one way.
  auto same = ParseConfig("tp=2,dp=2,etp=2,ep=2");
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(same->etp, 0);
  EXPECT_EQ(same->expert_tp(), 2);
  EXPECT_EQ(same->ToString(), "tp=2,pp=1,dp=2,ep=2,per_worker=8");
  // Today's configs print as before.
  EXPECT_EQ(ParseConfig("tp=2,pp=2,dp=3")->ToString(), "tp=2,pp=2,dp=3,per_worker=8");
}

TEST(MoeConfig, GridRuleAndKeysNamed) {
  auto error = [](const char* text) { return Error(ParseConfig(text).status()); };
  ExpectHas(error("tp=2,dp=1,ep=4"), "tp*cp*dp = 2 is not a multiple of etp*ep = 8");
  ExpectHas(error("tp=2,dp=3,ep=2"), "tp*cp*dp = 6 is not a multiple of etp*ep = 4");
  ExpectHas(error("tp=1,dp=2,etp=4"), "tp*cp*dp = 2 is not a multiple of etp*ep = 4");
  ExpectHas(error("tp=1,cp=0"), "cp=0: must be a positive integer");
  ExpectHas(error("tp=1,xp=2"), "expected tp, pp, dp, cp, ep, etp,");
  ExpectHas(error("tp=64,cp=64,dp=64"), "tp*cp*pp*dp = 262144 ranks exceeds the limit");
  EXPECT_TRUE(ParseConfig("tp=2,cp=2,ep=4,etp=1").ok());  // the expert grid may take cp's ranks
}

// Today's numbering is kept: tp fastest, then dp, then pp.
TEST(MoeConfig, DenseNumberingUnchanged) {
  const ParallelConfig c = *ParseConfig("tp=2,pp=3,dp=4");
  for (int rank = 0; rank < c.world_size(); ++rank) {
    const RankCoords k = c.CoordsOf(rank);
    EXPECT_EQ(k.tp, rank % 2);
    EXPECT_EQ(k.dp, (rank / 2) % 4);
    EXPECT_EQ(k.pp, rank / 8);
    EXPECT_EQ(k.cp, 0);
    EXPECT_EQ(k.etp, k.tp);
    EXPECT_EQ(k.ep, 0);
    EXPECT_EQ(k.edp, k.dp);
    EXPECT_EQ(c.RankOf(k), rank);
  }
}

// The rank grids against the groups Megatron-Core's RankGenerator makes.
TEST(MoeConfig, GridsMatchMegatronCore) {
  std::ifstream in(std::string(PTCFS_SOURCE_DIR) + "/tests/data/moe_grid_golden.json");
  ASSERT_TRUE(in) << "tests/data/moe_grid_golden.json";
  const nlohmann::json golden = nlohmann::json::parse(in);
  ASSERT_GE(golden["grids"].size(), 12u);
  for (const nlohmann::json& g : golden["grids"]) {
    ParallelConfig c;
    c.tp = g["tp"], c.cp = g["cp"], c.ep = g["ep"], c.dp = g["dp"], c.pp = g["pp"];
    c.etp = g["etp"].get<int>() == c.tp ? 0 : g["etp"].get<int>();
    SCOPED_TRACE(c.ToString());
    ASSERT_TRUE(CheckExpertGrid(c).ok());
    ASSERT_EQ(c.expert_dp(), g["edp"].get<int>());
    // The coordinate a group varies, and this rank's index in it.
    const std::map<std::string, std::function<int(const RankCoords&)>> index = {
        {"tp", [](const RankCoords& k) { return k.tp; }},
        {"cp", [](const RankCoords& k) { return k.cp; }},
        {"dp", [](const RankCoords& k) { return k.dp; }},
        {"pp", [](const RankCoords& k) { return k.pp; }},
        {"dp-cp", [&](const RankCoords& k) { return ParallelConfig::DenseZeroIndex(k, c.cp); }},
        {"etp", [](const RankCoords& k) { return k.etp; }},
        {"ep", [](const RankCoords& k) { return k.ep; }},
        {"edp", [](const RankCoords& k) { return k.edp; }},
    };
    for (const auto& [token, of] : index) {
      const nlohmann::json& groups = g["groups"][token];
      std::set<int> seen;
      for (const nlohmann::json& group : groups) {
        for (size_t i = 0; i < group.size(); ++i) {
          const int rank = group[i];
          seen.insert(rank);
          EXPECT_EQ(of(c.CoordsOf(rank)), static_cast<int>(i)) << token << " group of rank " << rank;
          // Members differ only in the group's own coordinates: the rank at
          // index 0 with this rank's index is this rank.
          RankCoords a = c.CoordsOf(group[0].get<int>()), b = c.CoordsOf(rank);
          auto same_outside = [&](const std::string& t) {
            if (t == "tp" || t == "cp" || t == "dp" || t == "pp" || t == "dp-cp") {
              return (t == "tp" || a.tp == b.tp) && (t == "pp" || a.pp == b.pp) &&
                     (t == "cp" || t == "dp-cp" || a.cp == b.cp) && (t == "dp" || t == "dp-cp" || a.dp == b.dp);
            }
            return (t == "etp" || a.etp == b.etp) && (t == "ep" || a.ep == b.ep) && (t == "edp" || a.edp == b.edp) &&
                   a.pp == b.pp;
          };
          EXPECT_TRUE(same_outside(token)) << token << " group " << group.dump();
        }
      }
      EXPECT_EQ(static_cast<int>(seen.size()), c.world_size()) << token;
    }
  }
}

TEST(MoeSchema, RulesOfTheSchemaFileNamed) {
  auto error = [](const std::string& rule) {
    auto doc = nlohmann::json::parse(R"({"tensors": [)" + rule + "]}");
    return Error(ParseSchema("s.json", doc).status());
  };
  ExpectHas(error(R"({"name": "a.{e}.w", "shape": [2], "pp": "first"})"),
            "an expert rule ({e}) is per layer, on the MoE layers");
  ExpectHas(error(R"({"name": "a.{i}.{e}.w", "shape": [2], "layers": "dense"})"),
            "an expert rule ({e}) is per layer, on the MoE layers");
  ExpectHas(error(R"({"name": "a.{i}.{e}.{e}", "shape": [2]})"), "{e} (the expert id) may appear once");
  ExpectHas(error(R"({"name": "a.w", "shape": [2], "pp": "first", "layers": "moe"})"), "\"layers\" needs pp \"layer\"");
  ExpectHas(error(R"({"name": "a.{i}.w", "shape": [2], "layers": "some"})"), "layers must be \"all\", \"dense\" or \"moe\"");
  ExpectHas(error(R"({"name": "a.{i}.w", "shape": [2], "when": 3})"), "when must be a formula");
  ExpectHas(error(R"({"name": "a.{i}.w", "shape": [2], "color": 3})"), "unknown field 'color'");
  // A rule file can say what the built-in says, and prints back the same.
  auto llama = LoadSchema("llama");
  ASSERT_TRUE(llama.ok());
  auto again = ParseSchema("again", llama->ToJson());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->ToJson(), llama->ToJson());
  const TensorRule* fc1 = llama->Find("decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc1.weight");
  ASSERT_NE(fc1, nullptr);
  EXPECT_TRUE(fc1->expert);
  EXPECT_EQ(fc1->layers, LayerKind::kMoe);
}

TEST(MoeLayout, EachRuleNamed) {
  auto error = [](const std::string& schema, const std::string& dims, const std::string& config) {
    return Error(ValidateConfig(Spec(schema, dims), *ParseConfig(config)));
  };
  const std::string dense = "layers=4,hidden=16,heads=4,kv_heads=2,vocab=32,seq=8,ffn=24";
  ExpectHas(error("llama", dense, "tp=1,dp=2,ep=2"), "ep=2 needs a mixture-of-experts model (dims experts=)");
  ExpectHas(error("llama", dense, "tp=2,dp=2,etp=1"), "etp=1 needs a mixture-of-experts model");
  ExpectHas(error("llama", dense + ",experts=6", "tp=1,dp=4,ep=4"), "ep=4 does not divide experts=6");
  ExpectHas(error("llama", dense + ",experts=4,moe_ffn=6", "tp=1,dp=4,etp=4"),
            "rule 'decoder.layers.{i}.mlp.experts.local_experts.{e}.linear_fc1.weight': etp=4 does not divide "
            "(2*moe_ffn)/2=6");
  ExpectHas(error("llama", dense + ",experts=4,shared_ffn=3", "tp=2,dp=1"),
            "rule 'decoder.layers.{i}.mlp.shared_experts.linear_fc1.weight': tp=2 does not divide (2*shared_ffn)/2=3");
  ExpectHas(error("megatron-gpt", "layers=2,hidden=16,heads=4,vocab=32,seq=8,experts=4", "tp=1"),
            "schema 'megatron-gpt' has no expert rule ({e} in a name) for experts=4");
  // The grid rule holds for configs not made from text too.
  ParallelConfig c = *ParseConfig("tp=1,dp=2");
  c.ep = 4;
  ExpectHas(Error(ValidateConfig(Spec("llama", dense + ",experts=4"), c)), "is not a multiple of etp*ep = 4");
  // etp splits experts apart from tp: tp=4 cannot split moe_ffn=6, etp=2 can.
  EXPECT_TRUE(ValidateConfig(Spec("llama", dense + ",experts=4,moe_ffn=6"), *ParseConfig("tp=2,dp=2,etp=1,ep=4")).ok());
}

// The tensors of a dense llama are today's whether the dims say experts=0 or not.
TEST(MoeLayout, DenseModelHasTodaysTensors) {
  const std::string dense = "layers=3,hidden=16,heads=4,kv_heads=2,vocab=32,seq=8,ffn=24";
  auto a = GlobalTensors(Spec("llama", dense));
  auto b = GlobalTensors(Spec("llama", dense + ",experts=0"));
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), 2 + 3 * 6 + 1u);
  for (const GlobalTensor& t : *a) {
    EXPECT_EQ(t.name.find("expert"), std::string::npos) << t.name;
    EXPECT_EQ(t.name.find("router"), std::string::npos) << t.name;
  }
  ASSERT_EQ(a->size(), b->size());
}

TEST(MoeLayout, GlobalTensorsOfAnMoeModel) {
  const ModelSpec spec = Spec("llama", kMoeDims, DType::kF32, true);
  auto globals = GlobalTensors(spec);
  ASSERT_TRUE(globals.ok()) << globals.status().ToString();
  std::set<std::string> names;
  for (const GlobalTensor& g : *globals) names.insert(g.name);
  // Layer 0 dense; layers 1-3 MoE: norm, router, 4 x (fc1, fc2), shared fc1, fc2.
  const size_t params = 2 + 6 + 3 * (3 + 1 + 1 + 8 + 2) + 1;
  EXPECT_EQ(globals->size(), params * 4);
  EXPECT_TRUE(names.count("decoder.layers.0.mlp.linear_fc1.weight"));
  EXPECT_FALSE(names.count("decoder.layers.1.mlp.linear_fc1.weight"));
  EXPECT_FALSE(names.count("decoder.layers.0.mlp.router.weight"));
  EXPECT_TRUE(names.count("decoder.layers.1.mlp.router.weight"));
  EXPECT_TRUE(names.count("decoder.layers.3.mlp.experts.local_experts.3.linear_fc2.weight.exp_avg"));
  EXPECT_TRUE(names.count("decoder.layers.2.mlp.shared_experts.linear_fc1.weight"));
  EXPECT_TRUE(names.count("decoder.layers.2.pre_mlp_layernorm.weight"));
  std::map<std::string, Shape> shapes;
  for (const GlobalTensor& g : *globals) shapes[g.name] = g.shape;
  EXPECT_EQ(shapes["decoder.layers.1.mlp.router.weight"], (Shape{4, 16}));
  EXPECT_EQ(shapes["decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight"], (Shape{16, 16}));
  EXPECT_EQ(shapes["decoder.layers.1.mlp.experts.local_experts.2.linear_fc2.weight"], (Shape{16, 8}));
  // Without shared_ffn there are no shared experts.
  auto plain = GlobalTensors(Spec("llama", "layers=2,hidden=16,heads=4,vocab=32,seq=8,experts=2"));
  ASSERT_TRUE(plain.ok());
  for (const GlobalTensor& g : *plain) EXPECT_EQ(g.name.find("shared_experts"), std::string::npos);
}

// Each rank holds experts [r*E/ep, (r+1)*E/ep) whole, renumbered locally, split over etp.
TEST(MoeLayout, ExpertsWholePerEpRankSplitOverEtp) {
  const ModelSpec spec = Spec("llama", kMoeDims);
  const ParallelConfig c = *ParseConfig("tp=2,dp=2,ep=2,etp=1");  // edp = 2
  for (int rank = 0; rank < c.world_size(); ++rank) {
    auto view = LayoutView(spec, c, rank);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    const int ep = view->coords.ep;
    EXPECT_EQ(ep, (rank / 1) % 2);
    for (const LocalTensor& t : view->model) {
      if (t.name.rfind("decoder.layers.1.mlp.experts.local_experts.", 0) != 0) continue;
      ASSERT_EQ(t.segments.size(), 1u);  // etp=1: the whole [gate; up]
      const std::string& global = t.segments[0].tensor;
      const int local = t.name[43] - '0', id = global[43] - '0';
      EXPECT_EQ(id, ep * 2 + local) << t.name << " -> " << global;
      EXPECT_EQ(t.segments[0].box, Box::Full(t.shape));
    }
  }
  // The model order: each expert's fc1 then fc2, after the router.
  auto v = LayoutView(spec, *ParseConfig("tp=1,dp=2,ep=2"), 1);
  ASSERT_TRUE(v.ok());
  std::vector<std::string> layer1;
  for (const LocalTensor& t : v->model) {
    if (t.name.rfind("decoder.layers.1.mlp.", 0) == 0) layer1.push_back(t.name.substr(21));
  }
  EXPECT_EQ(layer1, (std::vector<std::string>{
                        "router.weight", "experts.local_experts.0.linear_fc1.weight",
                        "experts.local_experts.0.linear_fc2.weight", "experts.local_experts.1.linear_fc1.weight",
                        "experts.local_experts.1.linear_fc2.weight", "shared_experts.linear_fc1.weight",
                        "shared_experts.linear_fc2.weight"}));
  // etp=2 splits fc1 per segment (gate, up) and fc2 by columns, as tp splits a dense MLP.
  auto s = LayoutView(spec, *ParseConfig("tp=1,dp=2,etp=2"), 1);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  for (const LocalTensor& t : s->model) {
    if (t.name == "decoder.layers.1.mlp.experts.local_experts.0.linear_fc1.weight") {
      ASSERT_EQ(t.segments.size(), 2u);
      EXPECT_EQ(t.segments[0].box.ToString(), (Box{{4, 0}, {8, 16}}.ToString()));
      EXPECT_EQ(t.segments[1].box.ToString(), (Box{{12, 0}, {16, 16}}.ToString()));
    }
    if (t.name == "decoder.layers.1.mlp.experts.local_experts.0.linear_fc2.weight") {
      EXPECT_EQ(t.segments[0].box.ToString(), (Box{{0, 4}, {16, 8}}.ToString()));
    }
    if (t.name == "decoder.layers.1.mlp.shared_experts.linear_fc1.weight") {
      EXPECT_EQ(t.shape, (Shape{16, 16}));  // tp=1: whole
    }
  }
}

// cp replicates the weights: ranks differing in cp alone have the same tensors.
TEST(MoeLayout, ContextParallelRanksShareTheirWeights) {
  const ModelSpec spec = Spec("llama", kMoeDims, DType::kF32, true);
  const ParallelConfig c = *ParseConfig("tp=2,cp=2,dp=1,ep=2");  // ranks 0,1 cp 0; 2,3 cp 1
  auto a = LayoutView(spec, c, 1), b = LayoutView(spec, c, 3);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->coords.cp, 0);
  EXPECT_EQ(b->coords.cp, 1);
  EXPECT_EQ(a->model.size(), b->model.size());
  for (size_t i = 0; i < a->model.size() && i < b->model.size(); ++i) {
    if (a->model[i].name.find("experts.local") != std::string::npos) continue;  // ep differs: 0 vs 1
    EXPECT_EQ(a->model[i], b->model[i]);
  }
}

// ZeRO-1: dense state cut over dp x cp, expert state over edp, each element once.
TEST(MoeLayout, ZeroCutsDenseOverDpCpAndExpertsOverEdp) {
  const ModelSpec spec = Spec("llama", kMoeDims, DType::kBF16, true);
  for (const char* text : {"tp=1,cp=2,dp=2,ep=2,zero=1", "tp=2,dp=2,ep=4,etp=1,zero=1", "tp=2,dp=2,pp=2,zero=1",
                           "tp=1,dp=4,ep=2,etp=2,zero=1"}) {
    const ParallelConfig c = *ParseConfig(text);
    SCOPED_TRACE(text);
    const ModelLayout layout = FitLayout(spec, c);
    // Over all ranks: elements of each parameter in the model views, and of
    // its exp_avg in the ZeRO pieces. A ZeRO group (dp x cp for dense
    // parameters, edp for experts) holds its ranks' common shard once.
    std::map<std::string, Index> params, held;
    for (int rank = 0; rank < c.world_size(); ++rank) {
      auto view = layout.View(rank);
      ASSERT_TRUE(view.ok());
      ASSERT_EQ(view->optim.size(), 6u);
      EXPECT_EQ(view->optim[0].name, "optimizer.exp_avg");
      EXPECT_EQ(view->optim[3].name, "optimizer.experts.exp_avg");
      for (const LocalTensor& t : view->model) {
        for (const Segment& s : t.segments) params[s.tensor] += s.box.volume();
      }
      for (const LocalTensor& t : view->optim) {
        const bool experts = t.name.rfind("optimizer.experts.", 0) == 0;
        for (const Segment& s : t.segments) {
          EXPECT_EQ(experts, s.tensor.find("local_experts") != std::string::npos) << t.name << " holds " << s.tensor;
          held[s.tensor] += s.box.volume();
        }
      }
    }
    for (const auto& [name, n] : params) {
      const bool expert = name.find("local_experts") != std::string::npos;
      const int group = expert ? c.expert_dp() : c.dense_zero_ranks();
      EXPECT_EQ(held[name + ".exp_avg"] * group, n) << name;
      EXPECT_EQ(held[name + ".fp32"] * group, n) << name;
    }
  }
}

}  // namespace
}  // namespace ptc

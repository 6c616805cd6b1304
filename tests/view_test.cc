#include "ptc/model/view.h"

#include <gtest/gtest.h>

#include <map>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace ptc {
namespace {

using namespace ::ptc::testing;  // the helpers of test_util.h

constexpr const char* kGptDims = "layers=6,hidden=32,heads=4,vocab=256,seq=16";
constexpr const char* kLlamaDims = "layers=5,hidden=32,heads=8,kv_heads=4,vocab=128,seq=16,ffn=48";

TEST(Config, ParseAndPrintRoundTrip) {
  auto c = ParseConfig("tp=2, pp=4,dp=3,zero=1,pp_layers=5+6+6+7,per_worker=4");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->world_size(), 24);
  EXPECT_EQ(c->ToString(), "tp=2,pp=4,dp=3,zero=1,pp_layers=5+6+6+7,per_worker=4");
  EXPECT_EQ(*ParseConfig(c->ToString()), *c);
  EXPECT_EQ(c->num_workers(), 6);
}

TEST(Config, PlacementAndReplicas) {
  auto c = ParseConfig("tp=2,pp=2,dp=1,per_worker=1,workers=0+2+3+5,replicas=2");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->ToString(), "tp=2,pp=2,dp=1,per_worker=1,workers=0+2+3+5,replicas=2");
  EXPECT_EQ(*ParseConfig(c->ToString()), *c);
  EXPECT_EQ(c->num_workers(), 4);
  EXPECT_EQ(c->WorkerOf(1), 2);
  EXPECT_EQ(c->WorkerOf(3), 5);
  EXPECT_EQ(c->Workers(), (std::vector<int>{0, 2, 3, 5}));
  EXPECT_TRUE(c->HoldsRanks(3));
  EXPECT_FALSE(c->HoldsRanks(1));
  EXPECT_EQ(c->KeepersOfSlot(0), (std::vector<int>{0, 2}));
  EXPECT_EQ(c->KeepersOfSlot(3), (std::vector<int>{5, 0}));  // cyclic
  EXPECT_EQ(WorkersText(*c), "0, 2, 3, 5");
  // The default placement is written one way.
  auto plain = ParseConfig("tp=2,per_worker=1,workers=0+1");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->workers.empty());
  EXPECT_EQ(plain->ToString(), "tp=2,pp=1,dp=1,per_worker=1");
  auto error = [](const char* text) {
    auto r = ParseConfig(text);
    EXPECT_FALSE(r.ok()) << text << " parsed as " << r->ToString();
    return r.status().message();
  };
  EXPECT_NE(error("tp=2,per_worker=1,workers=0+1+2").find("lists 3 workers but the ranks fill 2"), std::string::npos);
  EXPECT_NE(error("tp=2,per_worker=1,workers=4+4").find("names a worker twice"), std::string::npos);
  EXPECT_NE(error("tp=2,per_worker=1,workers=0+-1").find("worker id"), std::string::npos);
  EXPECT_NE(error("tp=2,per_worker=2,replicas=2").find("replicas=2 exceeds the 1 workers"), std::string::npos);
  EXPECT_NE(error("tp=1048576,pp=1048576,dp=2").find("ranks exceeds the limit of 65536 ranks"), std::string::npos);
  EXPECT_NE(error("replicas=0").find("replicas=0"), std::string::npos);
}

TEST(Config, RankOrderIsMegatrons) {
  ParallelConfig c = *ParseConfig("tp=2,pp=3,dp=2");
  for (int r = 0; r < c.world_size(); ++r) {
    RankCoords x = c.CoordsOf(r);
    EXPECT_EQ(r, x.pp * (c.dp * c.tp) + x.dp * c.tp + x.tp);
    EXPECT_EQ(c.RankOf(x), r);
  }
}

TEST(Config, BadTextNamesTheKey) {
  EXPECT_NE(ParseConfig("tp=2,qq=1").status().message().find("unknown key 'qq'"), std::string::npos);
  EXPECT_NE(ParseConfig("tp=0").status().message().find("tp=0"), std::string::npos);
  EXPECT_NE(ParseConfig("tp=2,tp=2").status().message().find("twice"), std::string::npos);
  EXPECT_NE(ParseConfig("pp=2,pp_layers=1+2+3").status().message().find("3 stages"), std::string::npos);
  EXPECT_NE(ParseConfig("zero=2").status().message().find("zero must be 0 or 1"), std::string::npos);
  EXPECT_FALSE(ParseConfig("tp").ok());
}

// Found by text_fuzz (tests/fuzz/corpus/text_fuzz/regression-config-pp-layers-overflow): a
// stage's layer count past int was truncated, so the config printed as another one.
TEST(Config, PipelineStageLayerCountIsBounded) {
  for (const char* text : {"tp=1,pp_layers=057555555555554", "pp=2,pp_layers=1+4294967297", "pp_layers=1048577"}) {
    auto c = ParseConfig(text);
    ASSERT_FALSE(c.ok()) << text << " parsed as " << c->ToString();
    EXPECT_NE(c.status().message().find("positive layer count"), std::string::npos) << c.status().message();
  }
  auto c = ParseConfig("pp=2,pp_layers=1048576+1");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(*ParseConfig(c->ToString()), *c);
}

TEST(Dims, DefaultsAndErrors) {
  ModelDims d = *ParseDims("layers=4,hidden=64,heads=4,vocab=1024,seq=128");
  EXPECT_EQ(d.ffn, 256);
  EXPECT_EQ(d.kv_heads, 4);
  EXPECT_EQ(d.head_dim, 16);
  EXPECT_EQ(*ParseDims(d.ToString()), d);
  EXPECT_NE(ParseDims("layers=4,hidden=64,heads=4,vocab=8").status().message().find("missing seq="), std::string::npos);
  EXPECT_NE(ParseDims("layers=4,hidden=64,heads=6,kv_heads=4,vocab=8,seq=2").status().message().find("kv_heads=4"),
            std::string::npos);
}

TEST(Schema, BuiltinsParseAndRoundTripThroughJson) {
  for (const std::string& name : BuiltinSchemaNames()) {
    auto s = LoadSchema(name);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    auto again = ParseSchema("again", s->ToJson());
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->ToJson(), s->ToJson());
  }
  EXPECT_EQ(LoadSchema("no-such-schema").status().code(), Code::kNotFound);
}

TEST(Schema, BadRulesAreNamed) {
  auto bad = [](const char* text) { return ParseSchema("s.json", nlohmann::json::parse(text)).status().message(); };
  EXPECT_NE(bad(R"({"tensors":[{"name":"a.{i}","shape":["h"],"pp":"first"}]})").find("rule 'a.{i}'"),
            std::string::npos);
  EXPECT_NE(bad(R"({"tensors":[{"name":"a","shape":["h"],"pp":"middle"}]})").find("pp 'middle'"), std::string::npos);
  EXPECT_NE(bad(R"({"tensors":[{"name":"a","shape":["h"],"pp":"first","tp":{"dim":1}}]})").find("tp.dim 1"),
            std::string::npos);
  EXPECT_NE(bad(R"({"tensors":[{"name":"b","tied_to":"zz","pp":"last"}]})").find("tied_to 'zz'"), std::string::npos);
}

TEST(View, ConfigsThatDoNotDivideNameTheRule) {
  ModelSpec llama = Spec("llama", kLlamaDims);
  Status s = ValidateConfig(llama, *ParseConfig("tp=8"));
  EXPECT_NE(s.message().find("rule 'decoder.layers.{i}.self_attention.linear_qkv.weight'"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("kv_heads=4"), std::string::npos) << s.message();
  s = ValidateConfig(llama, *ParseConfig("pp=2"));
  EXPECT_NE(s.message().find("pp=2 does not divide layers=5"), std::string::npos) << s.message();
  ModelSpec gpt = Spec("megatron-gpt", "layers=2,hidden=24,heads=3,vocab=64,seq=8");
  s = ValidateConfig(gpt, *ParseConfig("tp=2"));
  EXPECT_NE(s.message().find("heads=3"), std::string::npos) << s.message();
}

TEST(View, MegatronLocalNamesAndTiedEmbedding) {
  ModelSpec gpt = Spec("megatron-gpt", kGptDims);
  ParallelConfig c = *ParseConfig("tp=2,pp=2,pp_layers=2+4");
  RankView last = *LayoutView(gpt, c, c.RankOf({1, 0, 1}));
  const LocalTensor* head = nullptr;
  bool has_layer3 = false;
  for (const LocalTensor& t : last.model) {
    if (t.name == "word_embeddings_for_head.weight") head = &t;
    if (t.name == "language_model.encoder.layers.3.mlp.dense_4h_to_h.weight") {
      has_layer3 = true;
      EXPECT_EQ(t.segments[0].tensor, "language_model.encoder.layers.5.mlp.dense_4h_to_h.weight");
      EXPECT_EQ(t.shape, (Shape{32, 64}));
      EXPECT_EQ(t.segments[0].box, (Box{{0, 64}, {32, 128}}));
    }
  }
  ASSERT_NE(head, nullptr);
  EXPECT_TRUE(has_layer3);
  EXPECT_EQ(head->segments[0].tensor, "language_model.embedding.word_embeddings.weight");
  EXPECT_EQ(head->segments[0].box, (Box{{128, 0}, {256, 32}}));
  // pp=1: the first stage is also the last; the tied copy is not repeated.
  RankView only = *LayoutView(gpt, *ParseConfig("tp=2"), 0);
  for (const LocalTensor& t : only.model) EXPECT_NE(t.name, "word_embeddings_for_head.weight");
}

TEST(View, SwiGluSegmentsHoldGateAndUpOfTheRank) {
  ModelSpec llama = Spec("llama", kLlamaDims);
  RankView v = *LayoutView(llama, *ParseConfig("tp=2"), 1);
  for (const LocalTensor& t : v.model) {
    if (t.name != "decoder.layers.0.mlp.linear_fc1.weight") continue;
    ASSERT_EQ(t.segments.size(), 2u);
    EXPECT_EQ(t.shape, (Shape{48, 32}));
    EXPECT_EQ(t.segments[0].box, (Box{{24, 0}, {48, 32}}));  // gate rows of rank 1
    EXPECT_EQ(t.segments[1].box, (Box{{72, 0}, {96, 32}}));  // up rows of rank 1
    EXPECT_EQ(t.segments[1].layout.offset, 24 * 32);
    return;
  }
  FAIL() << "fc1 not in view";
}

// Property: over all ranks, every element of every global tensor is covered
// the same number of times, and that number is the tensor's replica count.
void CheckCoverage(const ModelSpec& spec, const ParallelConfig& c) {
  std::map<std::string, std::vector<int>> count;
  std::map<std::string, Shape> shapes;
  const std::vector<GlobalTensor> globals = *GlobalTensors(spec);
  for (const GlobalTensor& g : globals) {
    count[g.name].assign(NumElements(g.shape), 0);
    shapes[g.name] = g.shape;
  }
  std::map<std::string, int> placements;  // distinct (tp-rank-independent) placements per tensor
  const ModelLayout layout = FitLayout(spec, c);
  for (int r = 0; r < c.world_size(); ++r) {
    auto view = layout.View(r);
    ASSERT_TRUE(view.ok()) << view.status().ToString();
    for (const auto* list : {&view->model, &view->optim}) {
      for (const LocalTensor& t : *list) {
        std::vector<int> local_hits(NumElements(t.shape), 0);
        for (const Segment& s : t.segments) {
          ASSERT_TRUE(count.count(s.tensor)) << "unknown global tensor " << s.tensor;
          const Shape& shape = shapes[s.tensor];
          ASSERT_TRUE(Contains(Box::Full(shape), s.box)) << s.tensor << " " << s.box.ToString();
          ForEachRun(s.box, Box::Full(shape), DenseLayout(Box::Full(shape)), s.box, s.layout,
                     [&](Index g, Index l, Index n) {
                       for (Index k = 0; k < n; ++k) {
                         count[s.tensor][g + k]++;
                         ASSERT_LT(l + k, static_cast<Index>(local_hits.size()));
                         local_hits[l + k]++;
                       }
                     });
        }
        for (int h : local_hits) ASSERT_LE(h, 1) << "segments of " << t.name << " overlap";
      }
    }
  }
  for (auto& [name, hits] : count) {
    ASSERT_FALSE(hits.empty());
    const int c0 = hits[0];
    ASSERT_GE(c0, 1) << name << " element 0 not covered in " << c.ToString();
    for (size_t i = 0; i < hits.size(); ++i) {
      ASSERT_EQ(hits[i], c0) << name << " element " << i << " in " << c.ToString();
    }
  }
}

TEST(View, ShardsCoverEveryGlobalTensorExactlyForRandomConfigs) {
  std::mt19937_64 rng(TestSeed());
  const std::vector<ModelSpec> specs = {
      Spec("megatron-gpt", kGptDims, DType::kBF16, true),
      Spec("llama", kLlamaDims, DType::kF32, true),
      Spec("megatron-gpt", "layers=3,hidden=16,heads=2,vocab=32,seq=4,ffn=24"),
  };
  for (int iter = 0; iter < 60; ++iter) {
    const ModelSpec& spec = specs[iter % specs.size()];
    ParallelConfig c = RandomConfig(rng, spec);
    SCOPED_TRACE(spec.schema.name + " " + c.ToString());
    CheckCoverage(spec, c);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(View, ZeroPiecesAreEqualAndPadded) {
  ModelSpec spec = Spec("llama", kLlamaDims, DType::kBF16, true);
  ParallelConfig c = *ParseConfig("tp=2,pp=1,dp=3,zero=1");
  const ModelLayout layout = FitLayout(spec, c);
  Index total = 0;
  const RankView first = *layout.View(0);
  for (const LocalTensor& t : first.model) total += NumElements(t.shape);
  for (int r = 0; r < c.world_size(); ++r) {
    RankView v = *layout.View(r);
    ASSERT_EQ(v.optim.size(), 3u);
    EXPECT_EQ(v.optim[0].name, "optimizer.exp_avg");
    EXPECT_EQ(v.optim[0].shape, (Shape{(total + 2) / 3}));
    EXPECT_EQ(v.optim[0].dtype, DType::kF32);
  }
}

// A layout checks its config once, when made, and names the rule as ValidateConfig does.
TEST(Layout, IsMadeOnlyForAConfigThatPartitionsTheModel) {
  const ModelSpec llama = Spec("llama", kLlamaDims);
  auto bad = ModelLayout::Make(llama, *ParseConfig("tp=8"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), ValidateConfig(llama, *ParseConfig("tp=8")).message());
  const ModelLayout layout = FitLayout(llama, *ParseConfig("tp=2,dp=2"));
  auto outside = layout.View(4);
  ASSERT_FALSE(outside.ok());
  EXPECT_EQ(outside.status().message(), "rank 4 is outside world size 4 of config tp=2,pp=1,dp=2,per_worker=8");
  EXPECT_FALSE(layout.View(-1).ok());
}

// The kept views (one body per (tp, pp), and per dp under ZeRO) are the views
// computed afresh for every rank, on a copy of the layout and from threads too.
TEST(Layout, KeptViewsEqualViewsComputedAfresh) {
  for (const char* text : {"tp=2,pp=5,dp=3", "tp=2,pp=1,dp=3,zero=1", "tp=1,pp=2,dp=2,pp_layers=2+3",
                           "tp=4,pp=1,dp=2,per_worker=3,replicas=2"}) {
    SCOPED_TRACE(text);
    const ModelSpec spec = Spec("llama", kLlamaDims, DType::kBF16, /*optimizer=*/true);
    const ParallelConfig config = *ParseConfig(text);
    const ModelLayout layout = FitLayout(spec, config);
    const ModelLayout copy = layout;
    std::vector<RankView> from_threads(static_cast<size_t>(config.world_size()));
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (int r = t; r < config.world_size(); r += 4) from_threads[static_cast<size_t>(r)] = *copy.View(r);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int r = 0; r < config.world_size(); ++r) {
      auto afresh = internal::ComputeCheckedView(spec, config, r);
      ASSERT_TRUE(afresh.ok()) << afresh.status().ToString();
      EXPECT_EQ(*layout.View(r), *afresh) << "rank " << r;
      EXPECT_EQ(from_threads[static_cast<size_t>(r)], *afresh) << "rank " << r;
    }
  }
}

}  // namespace
}  // namespace ptc

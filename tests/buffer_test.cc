// Model buffers: a schema rule marked "buffer" (docs/schema_format.md) is
// model state without optimizer state. The MoE router's expert bias of
// llama-eb (what an import of HF's DeepSeek-V3 makes) is one, as it is a
// persistent buffer in Megatron-Core, torchtitan and transformers: in every
// view and format of the model and moved like any tensor, but no Adam state,
// no place in ZeRO-1's flat buffers, Megatron's param groups or its DDP
// buffer, no optimizer key in DCP; a save that brings state for it is refused
// naming it. A store made before the mark (its schema, kept in its manifest,
// without it) keeps its bias's Adam state and renders as before.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/checkpoint/dcp/read.h"
#include "ptc/checkpoint/hf/hf.h"
#include "ptc/checkpoint/megatron/dist_optimizer.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/checkpoint/megatron/optimizer.h"
#include "ptc/model/limits.h"
#include "synth_store.h"
#include "test_util.h"
#include "transform/execute.h"
#include "view/export.h"

namespace ptc {
namespace {

using namespace ::ptc::testing;  // the helpers of test_util.h and synth_store.h

// DeepSeek-V3's shape, small: MLA, layer 0 dense, layers 1-2 MoE (4 experts, a shared one).
constexpr const char* kDims =
    "layers=3,hidden=16,heads=4,vocab=32,seq=8,ffn=24,q_lora=8,kv_lora=6,qk_nope=4,qk_rope=2,v_head=6,"
    "experts=4,moe_ffn=8,shared_ffn=8,dense_first=1";
constexpr const char* kBiasRule = "decoder.layers.{i}.mlp.router.expert_bias";

std::string Bias(int layer) { return "decoder.layers." + std::to_string(layer) + ".mlp.router.expert_bias"; }
bool IsBias(const std::string& name) { return name.find(".mlp.router.expert_bias") != std::string::npos; }
bool IsBiasState(const std::string& name) { return IsBias(name) && !name.ends_with(".expert_bias"); }

// llama-eb (the built-in llama with the router's bias, marked) or, `marked`
// false, the same schema as a store made before the mark keeps it.
ModelSpec BiasSpec(bool marked, DType dtype = DType::kF32, bool optimizer = true) {
  ModelSpec spec = Spec("llama", kDims, dtype, optimizer);
  nlohmann::json doc = hf::ExpertBiasSchema(spec.schema)->ToJson();
  if (!marked) {
    for (nlohmann::json& rule : doc["tensors"]) rule.erase("buffer");
  }
  spec.schema = *ParseSchema("llama-eb", doc);
  return spec;
}

std::set<std::string> Names(const std::vector<GlobalTensor>& tensors) {
  std::set<std::string> out;
  for (const GlobalTensor& t : tensors) out.insert(t.name);
  return out;
}

TEST(BufferSchema, TheMarkIsParsedPrintedAndRefusedWhenMalformed) {
  auto parse = [](const std::string& rules) {
    return ParseSchema("s.json", nlohmann::json::parse(R"({"tensors": [)" + rules + "]}"));
  };
  auto schema = parse(R"({"name": "a.{i}.bias", "shape": [2], "buffer": true},
                         {"name": "a.{i}.w", "shape": [2], "buffer": false}, {"name": "a.{i}.v", "shape": [2]})");
  ASSERT_TRUE(schema.ok()) << schema.status().ToString();
  EXPECT_FALSE(HasOptimizerState(schema->rules[0]));
  EXPECT_TRUE(HasOptimizerState(schema->rules[1]));
  EXPECT_TRUE(HasOptimizerState(schema->rules[2]));
  const nlohmann::json printed = schema->ToJson();
  EXPECT_EQ(printed["tensors"][0]["buffer"], true);
  EXPECT_FALSE(printed["tensors"][1].contains("buffer"));  // a parameter's rule prints as it did before the mark
  EXPECT_EQ(ParseSchema("again", printed)->ToJson(), printed);
  auto error = [&](const std::string& rules) { return parse(rules).status().ToString(); };
  EXPECT_TRUE(Contains(error(R"({"name": "a.{i}.bias", "shape": [2], "buffer": "yes"})"),
                       "s.json: rule 'a.{i}.bias': buffer must be true or false"));
  EXPECT_TRUE(Contains(error(R"({"name": "a.{i}.bias", "shape": [2], "buffer": 1})"),
                       "rule 'a.{i}.bias': buffer must be true or false"));
  for (const char* rules : {R"({"name": "emb", "shape": [4, 2], "pp": "first", "buffer": true},
                              {"name": "out", "tied_to": "emb", "pp": "last"})",
                            R"({"name": "emb", "shape": [4, 2], "pp": "first"},
                              {"name": "out", "tied_to": "emb", "pp": "last", "buffer": true})"}) {
    EXPECT_TRUE(Contains(error(rules), "rule 'out': a tied rule and its target take no \"buffer\"")) << error(rules);
  }
  // llama-eb marks its bias and nothing else; the built-ins mark nothing.
  const ModelSpec eb = BiasSpec(true);
  for (const TensorRule& r : eb.schema.rules) EXPECT_EQ(r.buffer, r.name == kBiasRule) << r.name;
  for (const char* name : {"llama", "megatron-gpt"}) {
    const Schema builtin = *LoadSchema(name);
    for (const TensorRule& r : builtin.rules) EXPECT_FALSE(r.buffer) << r.name;
  }
}

// GlobalTensors has no exp_avg, exp_avg_sq or fp32 of a buffer; the same
// schema without the mark (a store made before it) has them, and otherwise
// the same tensors in the same order. The limits count them so.
TEST(BufferLayout, NoOptimizerTensorsForABufferAndAStoreMadeBeforeTheMarkKeepsItsState) {
  auto marked = GlobalTensors(BiasSpec(true));
  auto before = GlobalTensors(BiasSpec(false));
  ASSERT_TRUE(marked.ok() && before.ok());
  const std::set<std::string> m = Names(*marked), b = Names(*before);
  for (int layer : {1, 2}) {
    EXPECT_TRUE(m.count(Bias(layer)));
    EXPECT_TRUE(m.count("decoder.layers." + std::to_string(layer) + ".mlp.router.weight.exp_avg"));
    for (const char* kind : kOptimizerKinds) {
      EXPECT_FALSE(m.count(Bias(layer) + "." + kind)) << kind;
      EXPECT_TRUE(b.count(Bias(layer) + "." + kind)) << kind;
    }
  }
  EXPECT_FALSE(m.count(Bias(0)));  // layer 0 is dense
  for (const GlobalTensor& t : *marked) EXPECT_EQ(t.buffer, t.name == Bias(1) || t.name == Bias(2)) << t.name;
  std::vector<std::string> rest;
  for (const GlobalTensor& t : *before) {
    if (!IsBiasState(t.name)) rest.push_back(t.name);
  }
  std::vector<std::string> in_order;
  for (const GlobalTensor& t : *marked) in_order.push_back(t.name);
  EXPECT_EQ(rest, in_order);
  EXPECT_EQ(before->size(), marked->size() + 2 * 3);
  auto limits = CheckModelLimits(BiasSpec(true)), limits_before = CheckModelLimits(BiasSpec(false));
  ASSERT_TRUE(limits.ok() && limits_before.ok());
  EXPECT_EQ(limits_before->tensors - limits->tensors, 2u * 3);
  EXPECT_EQ(limits_before->model_bytes - limits->model_bytes, 2u * 4 * 12);  // 2 biases of 4: exp_avg, exp_avg_sq, fp32
}

// Every rank's files hold the bias (marked a buffer) where they held it
// before; its optimizer files hold no state of it: per parameter (zero=0) or
// in ZeRO-1's flat buffers (zero=1, the dense one cut over dp x cp, the
// experts' over edp), which are the rank's parameters but the bias, padded.
TEST(BufferLayout, ViewsHoldTheBiasWithoutStateAndTheZeroFlatBuffersLeaveItOut) {
  const ModelSpec marked = BiasSpec(true, DType::kBF16), before = BiasSpec(false, DType::kBF16);
  for (const char* text : {"tp=2,dp=2,ep=2", "tp=1,pp=3,dp=2,ep=2", "tp=1,dp=4,ep=2,zero=1",
                           "tp=2,cp=2,dp=1,ep=4,etp=1,zero=1", "tp=1,pp=3,dp=2,ep=2,zero=1"}) {
    SCOPED_TRACE(text);
    const ParallelConfig c = *ParseConfig(text);
    for (int rank = 0; rank < c.world_size(); ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      auto view = LayoutView(marked, c, rank), old = LayoutView(before, c, rank);
      ASSERT_TRUE(view.ok() && old.ok()) << view.status().ToString();
      ASSERT_EQ(view->model.size(), old->model.size());
      int biases = 0;
      Index dense = 0, experts = 0;  // the parameters' elements of each flat buffer
      for (size_t i = 0; i < view->model.size(); ++i) {
        const LocalTensor& t = view->model[i];
        EXPECT_EQ(t.name, old->model[i].name);
        EXPECT_EQ(t.segments, old->model[i].segments);
        EXPECT_EQ(t.buffer, IsBias(t.name)) << t.name;
        EXPECT_FALSE(old->model[i].buffer);
        biases += t.buffer ? 1 : 0;
        if (!HasOptimizerState(t)) continue;
        (t.name.find(".local_experts.") != std::string::npos ? experts : dense) += NumElements(t.shape);
      }
      for (const LocalTensor& t : view->optim) {
        for (const Segment& s : t.segments) EXPECT_FALSE(IsBias(s.tensor)) << t.name << " holds " << s.tensor;
      }
      const int stage_moe_layers = c.pp == 3 ? (view->coords.pp > 0 ? 1 : 0) : 2;
      EXPECT_EQ(biases, stage_moe_layers);
      if (!c.zero) {
        EXPECT_EQ(view->optim.size() + 3u * biases, old->optim.size());
        continue;
      }
      auto piece = [](Index elements, int ranks) { return (elements + ranks - 1) / ranks; };
      const int group = c.dense_zero_ranks();
      ASSERT_GE(view->optim.size(), 3u);
      EXPECT_EQ(view->optim[0].shape, (Shape{piece(dense, group)}));
      EXPECT_EQ(old->optim[0].shape, (Shape{piece(dense + biases * 4, group)}));  // the bias's 4 elements in it before
      if (experts > 0) {
        ASSERT_EQ(view->optim.size(), 6u);
        EXPECT_EQ(view->optim[3].name, "optimizer.experts.exp_avg");
        EXPECT_EQ(view->optim[3].shape, (Shape{piece(experts, c.expert_dp())}));
        EXPECT_EQ(view->optim[3], old->optim[3]);
      }
    }
  }
}

// A store of each schema, synth's values, moved through ep, pp, tp and ZeRO-1
// changes: every layout's export equals synth of that layout, the bias's
// values bit for bit (and, before the mark, its Adam state too).
TEST(BufferLayout, TransformsMoveTheBiasBitExact) {
  for (bool marked : {true, false}) {
    SCOPED_TRACE(marked ? "marked" : "before the mark");
    const ModelSpec spec = BiasSpec(marked, DType::kBF16);
    TempDir tmp;
    MakeStore(tmp, spec, *ParseConfig("tp=1,dp=2,ep=2"), 17);
    for (const char* text : {"tp=1,dp=4,ep=4,zero=1", "tp=1,pp=3,dp=2,ep=2", "tp=2,dp=2,ep=1,etp=1,zero=1",
                             "tp=1,dp=2,ep=2"}) {
      SCOPED_TRACE(text);
      const ParallelConfig to = *ParseConfig(text);
      auto store = Store::Open(Env::Default(), tmp / "store");
      ASSERT_TRUE(store.ok());
      transform::ExecuteOptions options;
      options.threads = 2;
      auto r = transform::Transform(**store, to, options);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->bytes_written, 0u);  // one worker: nothing copied
      ExpectStoreHolds(tmp, spec, to, 17);
      if (HasFatalFailure()) return;
    }
  }
}

// Megatron's legacy rank file: the model dict holds the bias, the optimizer
// (ChainedOptimizer at ep=2) numbers every parameter but the bias, and the
// file reads back; a file that numbers the bias too (a store's before the
// mark) is refused naming it. The distributed optimizer's DDP buffer leaves
// the bias out.
TEST(BufferMegatron, TheOptimizerNumbersEveryParameterButTheBias) {
  using namespace megatron;
  const ModelSpec spec = BiasSpec(true, DType::kBF16);
  const ParallelConfig config = *ParseConfig("tp=1,dp=2,ep=2");
  const RankView view = *LayoutView(spec, config, 0);
  auto state = BuildRankState(spec, config, view, MegatronState{}, NameSet::kLocal);
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  const pickle::Value* model = state->root.Find("model");
  ASSERT_NE(model, nullptr);
  EXPECT_NE(model->Find(Bias(1)), nullptr);
  size_t numbered = 0;
  for (const pickle::Value& chained : state->root.Find("optimizer")->items()) {
    for (const pickle::Value& g : chained.Find("optimizer")->Find("param_groups")->items()) {
      numbered += g.Find("params")->items().size();
    }
  }
  size_t params = 0;
  for (const LocalTensor& t : view.model) params += HasOptimizerState(t) ? 1 : 0;
  EXPECT_EQ(numbered, params);
  EXPECT_EQ(params + 2, view.model.size());
  auto root = pickle::Unpickle(pickle::Pickle(state->root), "test");
  ASSERT_TRUE(root.ok());
  auto found = FindRankTensors(spec, config, view, *root, "f.pt");
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  EXPECT_EQ(found->size(), view.model.size() + view.optim.size());
  // A file whose optimizer numbers the bias.
  const ModelSpec old_spec = BiasSpec(false, DType::kBF16);
  const RankView old_view = *LayoutView(old_spec, config, 0);
  auto old = BuildRankState(old_spec, config, old_view, MegatronState{}, NameSet::kLocal);
  ASSERT_TRUE(old.ok());
  auto refused = ReadOptimizerLayout(view, *old->root.Find("optimizer"), "f.pt");
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(Contains(refused.status().message(), "2 buffers, " + Bias(1) + " ..., have no optimizer state"))
      << refused.status().message();
  // The DDP buffer of the distributed optimizer (zero=1): no bias in its bucket states.
  for (bool marked : {true, false}) {
    const ModelSpec s = BiasSpec(marked, DType::kBF16);
    for (const char* text : {"tp=1,dp=2,zero=1", "tp=1,dp=4,ep=2,zero=1"}) {
      auto dist = PlanDpReshardable(FitLayout(s, *ParseConfig(text)), NameSet::kLocal, MegatronState{});
      ASSERT_TRUE(dist.ok()) << dist.status().ToString();
      bool bias = false;
      for (const LocalTensor& t : dist->tensors) {
        for (const Segment& seg : t.segments) bias = bias || IsBias(seg.tensor);
      }
      EXPECT_EQ(bias, !marked) << text;
    }
  }
}

// DCP's keys (torch's, torchtitan's, Megatron-Core's) hold the bias as a model
// key and no optimizer key of it; a store's DCP export loads back; a save
// whose optimizer state holds the bias (a store's before the mark) is refused
// naming it, and nothing is read of it.
TEST(BufferDcp, NoOptimizerKeyForTheBiasAndASaveWithOneIsRefusedNamingIt) {
  const ModelSpec marked = BiasSpec(true), before = BiasSpec(false);
  auto titan = dcp::TorchtitanTensors(marked), titan_before = dcp::TorchtitanTensors(before);
  ASSERT_TRUE(titan.ok() && titan_before.ok()) << titan.status().ToString();
  auto keys = [](const std::vector<dcp::Tensor>& tensors) {
    std::set<std::string> out;
    for (const dcp::Tensor& t : tensors) out.insert(t.key);
    return out;
  };
  EXPECT_TRUE(keys(*titan).count("layers.1.moe.expert_bias_E"));
  EXPECT_FALSE(keys(*titan).count("optimizer.state.layers.1.moe.expert_bias_E.exp_avg"));
  EXPECT_TRUE(keys(*titan_before).count("optimizer.state.layers.1.moe.expert_bias_E.exp_avg"));
  std::vector<TensorRecord> records;
  const std::vector<GlobalTensor> globals = *GlobalTensors(marked);
  for (const GlobalTensor& g : globals) records.push_back({g.name, g.dtype, g.shape});
  const std::set<std::string> torch = keys(dcp::NameTensors(records, dcp::Keys::kTorch));
  EXPECT_TRUE(torch.count("model." + Bias(1)));
  EXPECT_FALSE(torch.count("optim.state." + Bias(1) + ".exp_avg"));
  for (const std::string& k : keys(dcp::NameTensors(records, dcp::Keys::kMegatronCore, true))) {
    EXPECT_FALSE(k.find("optimizer.") != std::string::npos && IsBias(k)) << k;
  }
  Env* env = Env::Default();
  const ParallelConfig config = *ParseConfig("tp=1,dp=2,ep=2");
  for (dcp::Keys k : {dcp::Keys::kTorch, dcp::Keys::kTorchtitan, dcp::Keys::kMegatronCore}) {
    SCOPED_TRACE(static_cast<int>(k));
    for (bool mark : {true, false}) {
      TempDir tmp;
      MakeStore(tmp, mark ? marked : before, config, 3);
      auto store = Store::Open(env, tmp / "store");
      ASSERT_TRUE(store.ok());
      ASSERT_TRUE(ptcfs::ExportDcp(env, **store, (*store)->CurrentSnapshot(), tmp / "dcp", {}, k).ok());
      auto source = dcp::OpenDcp(env, tmp / "dcp", marked.schema, marked.dims, config, k);
      if (!mark) {  // the bias's state in the save, read against llama-eb
        ASSERT_FALSE(source.ok());
        EXPECT_TRUE(Contains(source.status().message(),
                             "optimizer state of " + Bias(1) + ", a buffer"))
            << source.status().message();
        continue;
      }
      ASSERT_TRUE(source.ok()) << source.status().ToString();
      std::set<std::string> read;
      for (const dcp::DcpSource::Chunk& c : source->chunks) read.insert(c.tensor);
      EXPECT_TRUE(read.count(Bias(1)) && read.count(Bias(2)));
      for (const std::string& t : read) EXPECT_FALSE(IsBiasState(t)) << t;
      EXPECT_TRUE(read.count("decoder.layers.1.mlp.router.weight.exp_avg"));
    }
  }
}

}  // namespace
}  // namespace ptc

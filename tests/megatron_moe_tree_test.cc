// A mixture-of-experts model's legacy Megatron tree (mp_rank_TT[_PPP]_EEE/model_optim_rng.pt)
// written here with torch's layout, imported (OpenMegatronCheckpoint, and a save's parts through
// EncodeKeptRank / DecodeKeptRank / FoldRanks as a cluster job settles them) and rendered on
// other grids: each (tp, pp, ep) rank's own rng_state (megatron-core seeds its expert-parallel
// rng tracker per ep rank), bit for bit, and the record a rank new to the grid gets; TEGroupedMLP's
// `_extra_state` (one per layer, matrix and ep rank) renumbered with its layer across pp changes
// and given to each ep rank from the saved ep rank that held its first expert; the expert-parallel
// optimizer's group settings kept from a file with experts when the first stage has none.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <tuple>

#include "ptc/checkpoint/megatron/extra.h"
#include "ptc/checkpoint/megatron/import.h"
#include "ptc/checkpoint/megatron/optimizer.h"
#include "ptc/format/torch_file.h"
#include "test_util.h"

namespace ptc::megatron {
namespace {

using pickle::Value;
using ::ptc::testing::LayoutView;

// 4 layers, every one MoE: 4 experts of ffn 8, a shared expert.
constexpr const char* kDims =
    "layers=4,hidden=16,heads=4,kv_heads=2,vocab=32,seq=8,ffn=24,experts=4,moe_ffn=8,shared_ffn=8";
constexpr const char* kDir = "/ckpt";

// The args Namespace of a save of grid tp x pp x ep, as argparse pickles it.
Value Args(int tp, int pp, int ep) {
  pickle::Object o;
  o.callable = {"argparse", "Namespace"};
  o.build = pickle::Object::Build::kNewObj;
  Value state = Value::Dict();
  state.Set("tensor_model_parallel_size", Value::Int(tp));
  state.Set("pipeline_model_parallel_size", Value::Int(pp));
  state.Set("expert_model_parallel_size", Value::Int(ep));
  o.state = pickle::Boxed<Value>(std::move(state));
  return Value::FromObject(std::move(o));
}

// A uint8 tensor of `bytes` in storage `key` of its own, kept as `out`.
Value ByteTensor(const std::string& key, const std::string& bytes, std::vector<CarriedTensor>* out) {
  pickle::Tensor t;
  t.dtype = DType::kU8;
  t.shape = {static_cast<int64_t>(bytes.size())};
  PointAtOwnStorage(key, t);
  out->push_back({key, DType::kU8, bytes.size(), bytes});
  return Value::FromTensor(std::move(t));
}

// rng_state as Megatron-LM's get_rng_state saves it (one entry without
// --data-parallel-random-init): the generators' states, each tracker's CUDA
// state; every byte names the rank (`tag`).
RankRng Rng(const std::string& tag) {
  RankRng r;
  Value state = Value::Dict();
  state.Set("random_rng_state", Value::Str("random " + tag));
  state.Set("torch_rng_state", ByteTensor("r0", "torch " + tag, &r.tensors));
  state.Set("cuda_rng_state", ByteTensor("r1", "cuda " + tag, &r.tensors));
  Value trackers = Value::Dict();
  trackers.Set("model-parallel-rng", ByteTensor("r2", "tp tracker " + tag, &r.tensors));
  trackers.Set("expert-parallel-rng", ByteTensor("r3", "ep tracker " + tag, &r.tensors));
  state.Set("rng_tracker_states", std::move(trackers));
  r.value = Value::List({std::move(state)});
  return r;
}

std::string Tag(int tp, int pp, int ep) {
  return "tp" + std::to_string(tp) + " pp" + std::to_string(pp) + " ep" + std::to_string(ep);
}

std::string RankPath(const ParallelConfig& c, int tp, int pp, int ep, const std::string& dir = kDir) {
  return dir + "/" + IterationDirName(7) + "/" + RankDirName(tp, pp, c.pp, ep, c.ep) + "/" +
         std::string(kRankFile);
}

// torch.save's file of `state` at `path`: carried storages their bytes, the
// rank's tensors each its storage index repeated.
void WriteRank(Env* env, const std::string& path, const RankState& state) {
  ASSERT_TRUE(env->CreateDirs(path.substr(0, path.rfind('/'))).ok());
  std::vector<TorchStorageSpec> specs;
  for (const auto& s : state.storages) {
    const uint64_t numel = s.tensor != nullptr ? NumElements(s.tensor->shape) : s.carried->numel;
    specs.push_back({s.key, s.tensor != nullptr ? s.tensor->dtype : s.carried->dtype, numel, 0});
  }
  auto out = env->OpenWrite(path);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const Status w = WriteTorchFile(
      **out, "model_optim_rng", state.root, specs,
      [&](size_t i, uint64_t offset, size_t n, void* dst) {
        const RankState::Storage& s = state.storages[i];
        if (s.carried != nullptr) {
          std::memcpy(dst, s.carried->bytes.data() + offset, n);
        } else {
          std::memset(dst, static_cast<int>(i & 0xff), n);
        }
        return Status::OK();
      },
      path);
  ASSERT_TRUE(w.ok()) << w.ToString();
  ASSERT_TRUE((*out)->Close().ok());
}

// A rank file's root before it is written (the rank's own state dict, its view, its ep rank).
using EditRoot = std::function<void(const RankState&, int ep, Value* root)>;

// Writes the tree of `saved` into `env` under `dir`: each rank file the state `from` renders, or
// (without) its own rng_state, tagged; `edit` changes each root first.
void WriteTree(Env* env, const ModelSpec& spec, const ParallelConfig& saved, NameSet names,
               const std::string& dir = kDir, const MegatronState* from = nullptr, const EditRoot& edit = {}) {
  for (int pp = 0; pp < saved.pp; ++pp) {
    for (int ep = 0; ep < saved.ep; ++ep) {
      for (int tp = 0; tp < saved.tp; ++tp) {
        const RankView view = *LayoutView(spec, saved, *LegacySaveRank(saved, tp, pp, ep));
        MegatronState state{7, Value::Dict(), {}};
        state.carried.Set("args", Args(saved.tp, saved.pp, saved.ep));
        state.rng_tp = state.rng_pp = 1;
        state.rng.push_back(Rng(Tag(tp, pp, ep)));
        auto rank = BuildRankState(spec, saved, view, from != nullptr ? *from : state, names);
        ASSERT_TRUE(rank.ok()) << rank.status().ToString();
        if (edit) edit(*rank, ep, &rank->root);
        WriteRank(env, RankPath(saved, tp, pp, ep, dir), *rank);
      }
    }
  }
  auto latest = env->OpenWrite(dir + "/" + std::string(kLatestFile));
  ASSERT_TRUE(latest.ok());
  ASSERT_TRUE((*latest)->Append("7", 1).ok());
  ASSERT_TRUE((*latest)->Close().ok());
}

// The rng_state `root` holds, pickled, with the bytes of its tensors' storages in `storages`.
std::string RngBytes(const RankState& state) {
  const Value* rng = state.root.Find("rng_state");
  if (rng == nullptr) return "none";
  std::string out = pickle::Pickle(*rng);
  pickle::ForEachTensor(*rng, [&](const std::string&, const pickle::Tensor& t) {
    for (const auto& s : state.storages) {
      if (s.key == t.storage_key && s.carried != nullptr) out += "|" + s.carried->bytes;
    }
  });
  return out;
}

TEST(MegatronMoeTreeRng, EachEpRankKeepsItsOwnRngStateThroughImportAndRenders) {
  const ModelSpec spec = testing::Spec("llama", kDims, DType::kBF16, /*optimizer=*/false);
  const ParallelConfig saved = *ParseConfig("tp=2,pp=2,dp=2,ep=2");
  const std::unique_ptr<Env> env = NewMemEnv();
  WriteTree(env.get(), spec, saved, NameSet::kLocal);
  // What each saved rank's rng_state is, rendered alone (an independent reference: the record
  // as written, not as imported).
  std::map<std::tuple<int, int, int>, std::string> want;
  for (int pp = 0; pp < 2; ++pp) {
    for (int ep = 0; ep < 2; ++ep) {
      for (int tp = 0; tp < 2; ++tp) {
        MegatronState one{7, Value::Dict(), {}};
        one.rng_tp = one.rng_pp = 1;
        one.rng.push_back(Rng(Tag(tp, pp, ep)));
        const RankView view = *LayoutView(spec, saved, *LegacySaveRank(saved, tp, pp, ep));
        want[{tp, pp, ep}] = RngBytes(*BuildRankState(spec, saved, view, one, NameSet::kLocal));
      }
    }
  }
  ASSERT_NE(want[std::make_tuple(0, 0, 0)], want[std::make_tuple(0, 0, 1)]);
  auto source = OpenMegatronCheckpoint(env.get(), {kDir, spec.schema, spec.dims, std::nullopt, std::nullopt});
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  auto state = LoadMegatronState(source->extra, "import");  // through the manifest's JSON
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  EXPECT_EQ(state->rng.size(), 8u);
  EXPECT_EQ(state->rng_ep, 2);
  // A save's parts as a cluster job settles them: each kept rank through its JSON, folded.
  auto part = OpenMegatronSavePart(env.get(), {kDir, spec.schema, spec.dims, 7, saved});
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  std::vector<KeptRank> kept;
  for (const KeptRank& k : part->kept) {
    auto again = DecodeKeptRank(EncodeKeptRank(k), "part");
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    kept.push_back(std::move(again).value());
  }
  auto folded = FoldRanks(7, 2, 2, std::move(kept), 2);
  ASSERT_TRUE(folded.ok()) << folded.status().ToString();
  EXPECT_EQ(EncodeMegatronState(*folded), source->extra[std::string(kManifestKey)]);
  // Rendered on the saved grid, each rank its own; after an ep change ep rank e gets the
  // record of ep e mod 2 (the saved grid's), its tp and pp its own.
  for (const char* target : {"tp=2,pp=2,dp=2,ep=2", "tp=2,pp=2,dp=4,ep=4", "tp=2,pp=2,dp=1,ep=1", "tp=1,pp=4,dp=2,ep=2"}) {
    const ParallelConfig config = *ParseConfig(target);
    for (int pp = 0; pp < config.pp; ++pp) {
      for (int ep = 0; ep < config.ep; ++ep) {
        for (int tp = 0; tp < config.tp; ++tp) {
          SCOPED_TRACE(std::string(target) + " " + Tag(tp, pp, ep));
          const RankView view = *LayoutView(spec, config, *LegacySaveRank(config, tp, pp, ep));
          auto rank = BuildRankState(spec, config, view, *state, NameSet::kLocal);
          ASSERT_TRUE(rank.ok()) << rank.status().ToString();
          EXPECT_EQ(RngBytes(*rank), want[std::make_tuple(tp % 2, pp % 2, ep % 2)]);
        }
      }
    }
  }
  // A manifest whose records miss an ep rank is refused naming the field.
  nlohmann::json bad = source->extra;
  bad[std::string(kManifestKey)]["rng"]["ranks"].erase(7);
  auto refused = LoadMegatronState(bad, "manifest");
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(testing::Contains(refused.status().message(), "extra.megatron.rng: a 2 x 2 x 2 grid needs"))
      << refused.status().message();
}

// --- TEGroupedMLP's extra state ------------------------------------------------

// The value a save gives a module's extra state: its global layer, its module, for the grouped
// linears the saving ep rank (TE's FP8 metadata differs per rank), as TE's io.BytesIO would hold it.
Value ExtraValue(int layer, const std::string& module, int ep) {
  return Value::Bytes("layer " + std::to_string(layer) + " " + module + (ep >= 0 ? " ep " + std::to_string(ep) : ""));
}

// The global layer of the rank's local layer `local` (te names).
int GlobalLayer(const RankView& view, int local) {
  const std::string name = "decoder.layers." + std::to_string(local) + ".self_attention.linear_proj.weight";
  for (const LocalTensor& t : view.model) {
    if (t.name == name) return std::stoi(t.segments[0].tensor.substr(std::string("decoder.layers.").size()));
  }
  return -1;
}

// Puts the `_extra_state` entries of TEGroupedMLP's linear_fc1 and linear_fc2 (valued by
// `ep_of_layer`'s saving ep rank) and of linear_proj into the model dict of `root`, right after
// each module's last tensor, where torch's state_dict() puts them: written out here, not by ptcfs.
void AddExtras(const RankView& view, const std::function<int(int layer)>& ep_of, Value* root) {
  Value& model = *root->Find("model");
  pickle::Pairs out;
  const auto& pairs = model.pairs();
  for (size_t i = 0; i < pairs.size(); ++i) {
    out.push_back(pairs[i]);
    const std::string& key = pairs[i].first.as_str();
    const std::string next = i + 1 < pairs.size() ? pairs[i + 1].first.as_str() : "";
    const auto module = [](const std::string& k) { return k.substr(0, k.rfind('.')); };
    if (module(key) == module(next) || !key.starts_with("decoder.layers.")) continue;
    const int local = std::stoi(key.substr(std::string("decoder.layers.").size()));
    const int layer = GlobalLayer(view, local);
    for (const char* m : {"mlp.experts.linear_fc1", "mlp.experts.linear_fc2", "self_attention.linear_proj"}) {
      const std::string mod = "decoder.layers." + std::to_string(local) + "." + m;
      if (module(key) != mod) continue;
      const bool grouped = std::string(m).starts_with("mlp.experts");
      out.emplace_back(Value::Str(mod + "._extra_state"), ExtraValue(layer, m, grouped ? ep_of(layer) : -1));
    }
  }
  model.pairs() = std::move(out);
}

// The model dict of `state` as "key=value" lines, extra values pickled (bit for bit).
std::vector<std::string> ModelLines(const Value& root) {
  std::vector<std::string> out;
  for (const auto& [k, v] : root.Find("model")->pairs()) {
    out.push_back(k.as_str() + (IsExtraStateKey(k.as_str()) ? "=" + pickle::Pickle(v) : ""));
  }
  return out;
}

TEST(MegatronMoeTreeExtra, TeGroupedMlpExtraStateFollowsItsLayerAcrossPpAndItsExpertsAcrossEp) {
  const ModelSpec spec = testing::Spec("llama", kDims, DType::kBF16, /*optimizer=*/false);
  const std::unique_ptr<Env> env = NewMemEnv();
  // Each layer's grouped linears as the saving ep rank e had them.
  auto import = [&](const std::string& dir) {
    auto source = OpenMegatronCheckpoint(env.get(), {dir, spec.schema, spec.dims, std::nullopt, std::nullopt});
    EXPECT_TRUE(source.ok()) << source.status().ToString();
    auto state = LoadMegatronState(source.ok() ? source->extra : nlohmann::json::object(), dir);
    EXPECT_TRUE(state.ok()) << state.status().ToString();
    return state.ok() ? *state : MegatronState{};
  };
  // Every rank of `target` renders the entries a save at ep=2 made: each layer's own (its local
  // number on the rank's stage), the grouped linears' of the saved ep rank that held the rank's
  // first expert (global expert ep*4/ep_target; saved ep rank 2 experts each).
  auto check = [&](const MegatronState& state, const char* target) {
    const ParallelConfig config = *ParseConfig(target);
    for (int pp = 0; pp < config.pp; ++pp) {
      for (int ep = 0; ep < config.ep; ++ep) {
        SCOPED_TRACE(std::string(target) + " pp " + std::to_string(pp) + " ep " + std::to_string(ep));
        const RankView view = *LayoutView(spec, config, *LegacySaveRank(config, 0, pp, ep));
        auto got = BuildRankState(spec, config, view, state, NameSet::kTe);
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        RankState want = *BuildRankState(spec, config, view, MegatronState{}, NameSet::kTe);
        const int saved_ep = ep * 4 / config.ep / 2;
        AddExtras(*want.view, [&](int) { return saved_ep; }, &want.root);
        EXPECT_EQ(ModelLines(got->root), ModelLines(want.root));
      }
    }
  };
  // pp=2, ep=2: layers 0-1 on stage 0, 2-3 on stage 1, each saved as local layers 0 and 1.
  const ParallelConfig pp2 = *ParseConfig("tp=1,pp=2,dp=2,ep=2");
  WriteTree(env.get(), spec, pp2, NameSet::kTe, "/pp2", nullptr, [&](const RankState& rank, int ep, Value* root) {
    AddExtras(*rank.view, [&](int) { return ep; }, root);
  });
  const MegatronState from_pp2 = import("/pp2");
  EXPECT_EQ(from_pp2.extra.size(), 4u * 2 * 2 + 4u);  // per layer: fc1 and fc2 of each ep rank, linear_proj once
  check(from_pp2, "tp=1,pp=2,dp=2,ep=2");
  check(from_pp2, "tp=1,pp=1,dp=2,ep=2");
  // Rendered at pp=1, saved so, imported again, rendered at pp=4 (one layer a stage), and at
  // ep=4 and ep=1.
  WriteTree(env.get(), spec, *ParseConfig("tp=1,pp=1,dp=2,ep=2"), NameSet::kTe, "/pp1", &from_pp2);
  const MegatronState from_pp1 = import("/pp1");
  EXPECT_EQ(EncodeMegatronState(from_pp1)["extra_state"], EncodeMegatronState(from_pp2)["extra_state"]);
  check(from_pp1, "tp=1,pp=4,dp=2,ep=2");
  check(from_pp1, "tp=1,pp=4,dp=4,ep=4");
  check(from_pp1, "tp=1,pp=1,dp=1,ep=1");
}

// --- The expert-parallel optimizer's groups with a dense first stage ---------------

TEST(MegatronMoeTreeOptimizer, TheExpertGroupsSettingsComeFromAFileWithExpertsWhenTheFirstStageHasNone) {
  // dense_first=2 at pp=2: stage 0 has no MoE layer, its files' expert-parallel optimizer one
  // group without parameters (megatron-core makes it from the other ranks' group keys); the
  // files of stage 1 hold the experts and their group's own lr.
  const ModelSpec spec = testing::Spec("llama", std::string(kDims) + ",dense_first=2", DType::kBF16, true);
  const ParallelConfig saved = *ParseConfig("tp=1,pp=2,dp=2,ep=2");
  const std::unique_ptr<Env> env = NewMemEnv();
  auto lr_of = [](const Value& chain) {
    return chain.items()[1].Find("optimizer")->Find("param_groups")->items()[0].Find("lr")->as_float();
  };
  WriteTree(env.get(), spec, saved, NameSet::kLocal, kDir, nullptr, [&](const RankState& rank, int, Value* root) {
    const bool experts = std::any_of(rank.view->model.begin(), rank.view->model.end(), IsExpertParameter);
    ASSERT_EQ(experts, rank.view->coords.pp == 1);
    Value& group = root->Find("optimizer")->items()[1].Find("optimizer")->Find("param_groups")->items()[0];
    ASSERT_EQ(group.Find("params")->items().empty(), !experts);
    group.Set("lr", Value::Float(experts ? 7e-4 : 1e-3));
  });
  auto source = OpenMegatronCheckpoint(env.get(), {kDir, spec.schema, spec.dims, std::nullopt, std::nullopt});
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  auto state = LoadMegatronState(source->extra, "import");
  ASSERT_TRUE(state.ok()) << state.status().ToString();
  ASSERT_EQ(state->optimizer.expert_groups.items().size(), 2u);
  EXPECT_EQ(state->optimizer.expert_groups.items()[0].Find("lr")->as_float(), 7e-4);
  // The same from the save's parts (a cluster job's: each rank through its JSON).
  auto part = OpenMegatronSavePart(env.get(), {kDir, spec.schema, spec.dims, 7, saved});
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  std::vector<KeptRank> kept;
  for (const KeptRank& k : part->kept) kept.push_back(*DecodeKeptRank(EncodeKeptRank(k), "part"));
  auto folded = FoldRanks(7, 1, 2, std::move(kept), 2);
  ASSERT_TRUE(folded.ok()) << folded.status().ToString();
  EXPECT_EQ(EncodeMegatronState(*folded), source->extra[std::string(kManifestKey)]);
  // Every rank renders the experts' lr, the dense stage's empty group too; pp=1 alike.
  for (const char* target : {"tp=1,pp=2,dp=2,ep=2", "tp=1,pp=1,dp=2,ep=2", "tp=1,pp=4,dp=4,ep=4"}) {
    const ParallelConfig config = *ParseConfig(target);
    for (int pp = 0; pp < config.pp; ++pp) {
      SCOPED_TRACE(std::string(target) + " pp " + std::to_string(pp));
      const RankView view = *LayoutView(spec, config, *LegacySaveRank(config, 0, pp, 1));
      auto rank = BuildRankState(spec, config, view, *state, NameSet::kLocal);
      ASSERT_TRUE(rank.ok()) << rank.status().ToString();
      EXPECT_EQ(lr_of(*rank->root.Find("optimizer")), 7e-4);
    }
  }
}

}  // namespace
}  // namespace ptc::megatron

// A mixture-of-experts model's legacy Megatron tree (mp_rank_TT[_PPP]_EEE/model_optim_rng.pt)
// written here with torch's layout, imported (OpenMegatronCheckpoint, and a save's parts through
// EncodeKeptRank / DecodeKeptRank / FoldRanks as a cluster job settles them) and rendered on
// other grids: each (tp, pp, ep) rank's own rng_state (megatron-core seeds its expert-parallel
// rng tracker per ep rank), bit for bit, and the record a rank new to the grid gets.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <tuple>

#include "ptc/checkpoint/megatron/import.h"
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

std::string RankPath(const ParallelConfig& c, int tp, int pp, int ep) {
  return std::string(kDir) + "/" + IterationDirName(7) + "/" + RankDirName(tp, pp, c.pp, ep, c.ep) + "/" +
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

// Writes the tree of `saved` (each rank file its own rng_state, tagged) into `env`.
void WriteTree(Env* env, const ModelSpec& spec, const ParallelConfig& saved, NameSet names) {
  for (int pp = 0; pp < saved.pp; ++pp) {
    for (int ep = 0; ep < saved.ep; ++ep) {
      for (int tp = 0; tp < saved.tp; ++tp) {
        const RankView view = *LayoutView(spec, saved, *LegacySaveRank(saved, tp, pp, ep));
        MegatronState state{7, Value::Dict(), {}};
        state.carried.Set("args", Args(saved.tp, saved.pp, saved.ep));
        state.rng_tp = state.rng_pp = 1;
        state.rng.push_back(Rng(Tag(tp, pp, ep)));
        auto rank = BuildRankState(spec, saved, view, state, names);
        ASSERT_TRUE(rank.ok()) << rank.status().ToString();
        WriteRank(env, RankPath(saved, tp, pp, ep), *rank);
      }
    }
  }
  auto latest = env->OpenWrite(std::string(kDir) + "/" + std::string(kLatestFile));
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

}  // namespace
}  // namespace ptc::megatron

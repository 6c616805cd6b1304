// libFuzzer entry point for the optimizer entry of a Megatron-Core torch_dist
// save's common.pt (ptc::megatron::ReadMcoreOptimizerCommon), given as the
// pickle torch.save wraps (the zip around it is torch_fuzz's): it must never
// crash; what it accepts (one optimizer's part, or a ChainedOptimizer's
// {0: ..., 1: ...}) has one or two dict groups without 'params' and one step
// for the parameters, and renders back (McoreOptimizerCommon, also chained)
// and reads back to the same groups and step; kept in the manifest
// (Encode/LoadMegatronState) it decodes to the same groups, the experts' too.
// The same pickle is also every ShardedObject of a DistributedOptimizer's
// dp_reshardable save (DpReshardableSave, DpReshardableSavedCommon): what
// those accept reads as such an entry too.
// Build: cmake -DPTCFS_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ (tests/fuzz/CMakeLists.txt);
// run:   ./mcore_common_fuzz -max_total_time=60 -max_len=4096 [corpus dir]
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ptc/checkpoint/megatron/dist_optimizer.h"
#include "ptc/checkpoint/megatron/dp_reshardable_save.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/checkpoint/megatron/optimizer.h"
#include "ptc/format/torch_file.h"

namespace {

using ptc::pickle::Value;

// A tensor's bytes: zeros of its size, refused past 64 bytes.
ptc::Result<std::string> Zeros(const ptc::pickle::Tensor& t) {
  const uint64_t n = ptc::TensorNumBytes(t);
  if (n > 64) return ptc::InvalidArgumentError("fuzz: a large tensor");
  return std::string(n, '\0');
}

// The dp_reshardable form of a small model (dense, and a ChainedOptimizer's).
const ptc::megatron::DpReshardableLayout& Form(bool chained) {
  static const auto make = [](const char* dims, const char* config) {
    ptc::ModelSpec spec;
    spec.schema = *ptc::LoadSchema("llama");
    spec.dims = *ptc::ParseDims(dims);
    spec.dtype = ptc::DType::kBF16;
    spec.optimizer = true;
    const ptc::ModelLayout layout = *ptc::ModelLayout::Make(spec, *ptc::ParseConfig(config));
    return *ptc::megatron::LayOutDpReshardable(layout, ptc::megatron::NameSet::kLocal);
  };
  static const ptc::megatron::DpReshardableLayout dense = make("layers=2,hidden=64,heads=4,vocab=256", "tp=2,dp=2");
  static const ptc::megatron::DpReshardableLayout moe =
      make("layers=2,hidden=64,heads=4,vocab=256,experts=4,moe_ffn=32", "tp=1,dp=4,ep=2");
  return chained ? moe : dense;
}

// The fuzzed value as a dp_reshardable save's common.pt entry, and as every
// optimizer object of one (every per_bucket_numel the layout's, once as well
// the fuzzed value): one or two groups it accepts read as a common.pt entry.
void DpReshardable(const Value& root) {
  (void)ptc::megatron::DpReshardableSave(root, "fuzz");
  for (const bool chained : {false, true}) {
    const ptc::megatron::DpReshardableLayout& form = Form(chained);
    for (const bool sizes : {true, false}) {
      auto object = [&](const std::string& key) -> ptc::Result<std::optional<Value>> {
        for (const ptc::megatron::DpDomain& d : form.domains) {
          if (!sizes) break;
          if (key == d.prefix + "per_bucket_numel/shard_0_1")
            return std::optional(ptc::megatron::PerBucketNumel(d, true));
          if (key == d.prefix + "per_bucket_numel_unpadded/shard_0_1") {
            return std::optional(ptc::megatron::PerBucketNumel(d, false));
          }
        }
        return std::optional<Value>(root);
      };
      auto common = ptc::megatron::DpReshardableSavedCommon(form, object, "fuzz", "fuzz");
      if (!common.ok()) continue;
      if (!sizes) __builtin_trap();  // a value both the groups and the bucket sizes
      auto read = [](const ptc::pickle::Tensor&) -> ptc::Result<std::string> {
        return ptc::InvalidArgumentError("fuzz: the common part holds no tensor");
      };
      if (root.Find("param_groups")->items().size() <= 2 &&
          !ptc::megatron::ReadMcoreOptimizerCommon(*common, {"a"}, read, "fuzz").ok()) {
        __builtin_trap();
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto root = ptc::pickle::Unpickle(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!root.ok()) return 0;
  DpReshardable(*root);
  const Value* optimizer = root->Find("optimizer");
  if (optimizer == nullptr) return 0;
  const std::vector<std::string> params{"a", "b"};
  auto part = ptc::megatron::ReadMcoreOptimizerCommon(*optimizer, params, Zeros, "fuzz");
  if (!part.ok()) return 0;
  const ptc::pickle::Items& groups = part->meta.groups.items();
  if (groups.empty() || groups.size() > 2 || part->meta.steps.size() != 1) __builtin_trap();
  for (const Value& g : groups) {
    if (!g.is_dict() || g.Find("params") != nullptr) __builtin_trap();
  }
  if (part->meta.steps[0].params != params) __builtin_trap();
  // Rendered and read back: the same groups (two, as rendered) and step; also
  // as ChainedOptimizer's {0: dense, 1: expert-parallel} (a model with experts at
  // ep > 1), whose dense part gives them.
  ptc::megatron::MegatronState state;
  state.optimizer = part->meta;
  // Kept in the manifest (extra.megatron.optimizer, a chain's expert_groups included): the same back.
  const nlohmann::json extra = {{std::string(ptc::megatron::kManifestKey), ptc::megatron::EncodeMegatronState(state)}};
  auto loaded = ptc::megatron::LoadMegatronState(extra, "fuzz");
  if (!loaded.ok() || !(loaded->optimizer.groups == state.optimizer.groups) ||
      !(loaded->optimizer.expert_groups == state.optimizer.expert_groups)) {
    __builtin_trap();
  }
  for (const std::vector<size_t>& expert_groups : {std::vector<size_t>{}, std::vector<size_t>{0}}) {
    std::vector<ptc::megatron::CarriedTensor> storages;
    auto common = ptc::megatron::McoreOptimizerCommon(state, /*masters=*/true, &storages, expert_groups);
    if (!common.ok()) __builtin_trap();
    std::map<std::string, std::string> bytes;
    for (const auto& c : storages) bytes[c.key] = c.bytes;
    auto read = [&](const ptc::pickle::Tensor& t) -> ptc::Result<std::string> {
      const auto it = bytes.find(t.storage_key);
      if (it == bytes.end()) return ptc::InvalidArgumentError("fuzz: no storage " + t.storage_key);
      return it->second;
    };
    auto back = ptc::megatron::ReadMcoreOptimizerCommon(*common, params, read, "fuzz");
    if (!back.ok() || back->meta.steps.size() != 1 || !(back->meta.steps[0].value == part->meta.steps[0].value)) {
      __builtin_trap();
    }
    if (groups.size() == 2 && back->meta.groups != part->meta.groups) __builtin_trap();
  }
  return 0;
}

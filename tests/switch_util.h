// The independent reference for layout switching (transform/device): every
// rank's buffers in a layout, filled from the synthetic global tensors
// (ptc/model/synth.h) through the views (ptc/model/view.h) and box copies
// (ptc/model/box.h), without the switch planner. Shared by switch_*_test.cc.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "ptc/model/synth.h"
#include "ptc/model/view.h"
#include "test_util.h"
#include "transform/device/switch_plan.h"

namespace ptc::testing {

// Bytes no segment covers (ZeRO padding) hold this in every buffer.
inline constexpr unsigned char kSwitchFill = 0xA5;

// One rank's buffers in one layout: the names and bytes the reference expects.
struct RankBytes {
  std::vector<std::string> names;
  std::vector<std::vector<unsigned char>> data;
};

// Global tensors' bytes by name, synthesised once.
class GlobalValues {
 public:
  explicit GlobalValues(uint64_t seed) : seed_(seed) {}
  // `param_dtype`: the parameters' dtype (the values of master copies).
  const std::vector<unsigned char>& Get(const std::string& name, DType dtype, const Shape& shape, DType param_dtype) {
    auto key = name + "/" + std::string(DTypeName(dtype)) + "/" + std::string(DTypeName(param_dtype));
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    std::vector<unsigned char> v(NumElements(shape) * DTypeSize(dtype));
    SynthValues(name, seed_, dtype, 0, NumElements(shape), v.data(), param_dtype);
    return cache_.emplace(key, std::move(v)).first->second;
  }

 private:
  uint64_t seed_;
  std::map<std::string, std::vector<unsigned char>> cache_;
};

// The buffers of `rank` in `config`: parameters (the view's model tensors, in
// contents.param_dtype), their gradients (".grad", values of the global
// tensor "P.grad"), then the optimizer tensors when contents.optimizer.
inline RankBytes ReferenceRank(const ModelSpec& base, const ParallelConfig& config, int rank,
                               const transform::device::SwitchContents& contents, GlobalValues& values) {
  RankBytes out;
  if (rank >= config.world_size()) return out;
  ModelSpec spec = base;
  spec.dtype = contents.param_dtype;
  spec.optimizer = contents.optimizer;
  auto globals = GlobalTensors(spec);
  EXPECT_TRUE(globals.ok());
  std::map<std::string, Shape> shapes;
  for (const GlobalTensor& g : *globals) shapes[g.name] = g.shape;
  auto view = LayoutView(spec, config, rank);
  EXPECT_TRUE(view.ok()) << view.status().ToString();
  auto add = [&](const LocalTensor& t, DType dtype, const std::string& suffix) {
    out.names.push_back(t.name + suffix);
    std::vector<unsigned char> buf(NumElements(t.shape) * DTypeSize(dtype), kSwitchFill);
    for (const Segment& s : t.segments) {
      const Shape& shape = shapes.at(s.tensor);
      const auto& global = values.Get(s.tensor + suffix, dtype, shape, contents.param_dtype);
      const Box full = Box::Full(shape);
      CopyRegion(s.box, global.data(), full, DenseLayout(full), buf.data(), s.box, s.layout, DTypeSize(dtype));
    }
    out.data.push_back(std::move(buf));
  };
  for (const LocalTensor& t : view->model) add(t, contents.param_dtype, "");
  if (contents.grads) {
    for (const LocalTensor& t : view->model) add(t, contents.grad_dtype, ".grad");
  }
  for (const LocalTensor& t : view->optim) add(t, DType::kF32, "");
  return out;
}

inline std::vector<RankBytes> ReferenceLayout(const ModelSpec& spec, const ParallelConfig& config, int world,
                                              const transform::device::SwitchContents& contents, GlobalValues& values) {
  std::vector<RankBytes> out;
  for (int r = 0; r < world; ++r) out.push_back(ReferenceRank(spec, config, r, contents, values));
  return out;
}

// Same names, in the same order, as the plan's buffers.
inline void ExpectSameBuffers(const std::vector<LocalTensor>& plan, const RankBytes& ref, const std::string& what) {
  ASSERT_EQ(plan.size(), ref.names.size()) << what;
  for (size_t i = 0; i < plan.size(); ++i) {
    ASSERT_EQ(plan[i].name, ref.names[i]) << what;
    ASSERT_EQ(transform::device::BufferBytes(plan[i]), ref.data[i].size()) << what << " " << plan[i].name;
  }
}

struct SwitchCase {
  std::string schema, dims, from, to;
  bool optimizer = false;
};

// Layout pairs that change each of tp, pp, dp and ZeRO, with even and uneven
// pipelines and different world sizes.
inline const std::vector<SwitchCase>& SwitchCases() {
  static const std::vector<SwitchCase> cases = {
      {"llama", "layers=4,hidden=64,heads=8,kv_heads=4,vocab=256,seq=64,ffn=128", "tp=2,pp=2,dp=2", "tp=4,pp=1,dp=2"},
      {"llama", "layers=4,hidden=64,heads=8,kv_heads=4,vocab=256,seq=64,ffn=128", "dp=8", "tp=4,pp=2"},
      {"llama", "layers=4,hidden=64,heads=8,kv_heads=4,vocab=256,seq=64,ffn=128", "tp=4,pp=2", "tp=2,pp=2,dp=2"},
      {"llama", "layers=4,hidden=64,heads=8,kv_heads=4,vocab=256,seq=64,ffn=128", "tp=2,pp=2,dp=2",
       "tp=2,pp=2,dp=2,pp_layers=1+3"},
      {"llama", "layers=4,hidden=64,heads=8,kv_heads=4,vocab=256,seq=64,ffn=128", "tp=2,pp=3,pp_layers=2+1+1",
       "tp=1,pp=2,dp=3,pp_layers=3+1"},
      {"llama", "layers=4,hidden=64,heads=8,kv_heads=4,vocab=256,seq=64,ffn=128", "tp=2,pp=2", "dp=8"},
      {"llama", "layers=4,hidden=32,heads=4,kv_heads=2,vocab=64,seq=16,ffn=48", "tp=2,dp=4,zero=1",
       "tp=1,pp=2,dp=4,zero=1", true},
      {"llama", "layers=4,hidden=32,heads=4,kv_heads=2,vocab=64,seq=16,ffn=48", "tp=2,dp=2", "tp=2,dp=2,zero=1", true},
      {"megatron-gpt", "layers=4,hidden=32,heads=4,vocab=64,seq=16", "tp=2,pp=2", "tp=4,pp=1,dp=1"},
      {"megatron-gpt", "layers=4,hidden=32,heads=4,vocab=64,seq=16", "tp=1,pp=4,dp=2", "tp=2,pp=2,dp=2,pp_layers=3+1"},
  };
  return cases;
}

inline transform::device::SwitchRequest MakeRequest(const SwitchCase& c, DType dtype, uint64_t budget) {
  transform::device::SwitchRequest r;
  r.spec = Spec(c.schema, c.dims);
  r.from = *ParseConfig(c.from);
  r.to = *ParseConfig(c.to);
  r.contents.param_dtype = dtype;
  r.contents.grad_dtype = dtype;
  r.contents.optimizer = c.optimizer;
  r.ranks_per_host = 4;
  r.budget_bytes = budget;
  return r;
}

}  // namespace ptc::testing

// libFuzzer entry point for Adam's steps and the param groups of a DCP save
// (ptc::dcp::SavedOptimizer), given as a pickled dict {DCP key: value} whose
// entries become the save's (a tensor a 0-dim tensor chunk, anything else a
// pickled object; the zip around each is torch_fuzz's): it must never crash;
// what it accepts has one or two dict groups without 'params' and each
// parameter's step at most once, renders back (OptimizerObjects) and reads
// back to the same groups and steps.
// Build: cmake -DPTCFS_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ (tests/fuzz/CMakeLists.txt);
// run:   ./dcp_optimizer_fuzz -max_total_time=60 -max_len=4096 [corpus dir]
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/checkpoint/dcp/read.h"
#include "ptc/format/torch_file.h"

namespace {

using ptc::pickle::Value;

// A file of entries, each a torch.save, and the save's records of them.
struct Save {
  ptc::dcp::SavedCheckpoint saved;
  std::string file;
  bool Add(const std::string& key, const Value& value, const std::vector<ptc::megatron::CarriedTensor>& storages,
           bool tensor) {
    auto bytes = ptc::dcp::TorchSaveBytes(value, storages);
    if (!bytes.ok()) return false;
    const ptc::dcp::SavedChunk c{ptc::Box{}, "__0_0.distcp", file.size(), bytes->size()};
    file += *bytes;
    if (tensor) {
      saved.tensors.push_back(ptc::dcp::SavedTensor{key, ptc::DType::kF32, {}, {c}});
    } else {
      saved.bytes.push_back(ptc::dcp::SavedBytes{key, c.file, c.offset, c.length});
    }
    return true;
  }
};

class StringFile final : public ptc::RandomAccessFile {
 public:
  explicit StringFile(const std::string& s) : s_(s) {}
  ptc::Status Read(uint64_t offset, size_t n, void* dst) const override {
    if (offset > s_.size() || n > s_.size() - offset) return ptc::CorruptionError("fuzz: read past the end");
    s_.copy(static_cast<char*>(dst), n, offset);
    return ptc::Status::OK();
  }
  uint64_t Size() const override { return s_.size(); }
  const std::string& path() const override { return path_; }

 private:
  const std::string& s_;
  const std::string path_ = "__0_0.distcp";
};

ptc::Result<std::optional<ptc::megatron::OptimizerMeta>> Read(const Save& save,
                                                              const std::vector<ptc::dcp::Tensor>& model) {
  const StringFile file(save.file);
  return ptc::dcp::SavedOptimizer(
      save.saved, model, ptc::dcp::Keys::kTorch,
      [&](const std::string&) -> ptc::Result<const ptc::RandomAccessFile*> { return &file; }, "fuzz");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto root = ptc::pickle::Unpickle(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  if (!root.ok() || !root->is_dict()) return 0;
  const std::vector<ptc::dcp::Tensor> model = ptc::dcp::NameTensors({{"w", ptc::DType::kF32, {2, 2}},
                                                                     {"b", ptc::DType::kF32, {2}},
                                                                     {"w.exp_avg", ptc::DType::kF32, {2, 2}},
                                                                     {"b.exp_avg", ptc::DType::kF32, {2}}},
                                                                    ptc::dcp::Keys::kTorch);
  Save save;
  for (const auto& [k, v] : root->pairs()) {
    if (k.kind() != ptc::pickle::Kind::kStr) return 0;
    std::vector<ptc::megatron::CarriedTensor> storages;  // zeros of each storage, at most 64 bytes
    std::set<std::string> seen;
    bool small = true;
    ptc::pickle::ForEachTensor(v, [&](const std::string&, const ptc::pickle::Tensor& t) {
      if (!seen.insert(t.storage_key).second) return;
      const uint64_t bytes = t.storage_numel * ptc::DTypeSize(t.dtype);
      if (bytes > 64) small = false;
      storages.push_back({t.storage_key, t.dtype, t.storage_numel, std::string(small ? bytes : 0, '\0')});
    });
    if (!small || !save.Add(k.as_str(), v, storages, v.is_tensor())) return 0;
  }
  auto meta = Read(save, model);
  if (!meta.ok() || !meta->has_value()) return 0;
  const ptc::megatron::OptimizerMeta& m = **meta;
  const ptc::pickle::Items& groups = m.groups.items();
  if (groups.size() > 2) __builtin_trap();
  for (const Value& g : groups) {
    if (!g.is_dict() || g.Find("params") != nullptr) __builtin_trap();
  }
  std::set<std::string> stepped;
  for (const ptc::megatron::StepValue& s : m.steps) {
    for (const std::string& p : s.params) {
      if ((p != "w" && p != "b") || !stepped.insert(p).second) __builtin_trap();
    }
  }
  // Rendered (as dcp/ renders the store's) and read back: the same groups and steps.
  auto objects = ptc::dcp::OptimizerObjects(model, ptc::dcp::Keys::kTorch, m, 3);
  if (!objects.ok()) __builtin_trap();
  Save again;
  for (const ptc::dcp::Object& o : *objects) {
    const ptc::dcp::SavedChunk c{ptc::Box{}, "__0_0.distcp", again.file.size(), o.bytes.size()};
    again.file += o.bytes;
    if (o.scalar) {
      again.saved.tensors.push_back(ptc::dcp::SavedTensor{o.key, o.dtype, {}, {c}});
    } else {
      again.saved.bytes.push_back(ptc::dcp::SavedBytes{o.key, c.file, c.offset, c.length});
    }
  }
  auto back = Read(again, model);
  if (!back.ok() || !back->has_value()) __builtin_trap();
  if ((*back)->groups.items().size() != (groups.empty() ? 2 : groups.size())) __builtin_trap();
  // Every parameter has a step now (the kept one, or the default); the kept ones are kept.
  auto same = [](const ptc::megatron::StepValue& a, const ptc::megatron::StepValue& b) {
    if (a.value.is_tensor() != b.value.is_tensor() || a.tensors.size() != b.tensors.size()) return false;
    for (size_t i = 0; i < a.tensors.size(); ++i) {
      if (a.tensors[i].bytes != b.tensors[i].bytes || a.tensors[i].dtype != b.tensors[i].dtype) return false;
    }
    return a.value.is_tensor() || ptc::pickle::Pickle(a.value) == ptc::pickle::Pickle(b.value);
  };
  std::set<std::string> after;
  for (const ptc::megatron::StepValue& s : (*back)->steps) {
    for (const std::string& p : s.params) after.insert(p);
    for (const ptc::megatron::StepValue& k : m.steps) {
      for (const std::string& p : k.params) {
        if (std::find(s.params.begin(), s.params.end(), p) != s.params.end() && !same(k, s)) __builtin_trap();
      }
    }
  }
  if (after != std::set<std::string>{"w", "b"}) __builtin_trap();
  return 0;
}

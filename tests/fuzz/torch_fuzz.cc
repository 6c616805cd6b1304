// libFuzzer entry point for the torch file readers: pickle::Unpickle,
// ReadZipDirectory and ReadTorchFile must never crash, and what they accept
// must be consistent (a pickle re-pickles to an equal tree; accepted members
// lie inside the file; accepted tensors can be gathered).
// Build: cmake -DPTCFS_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ (tests/fuzz/CMakeLists.txt);
// run:   ./torch_fuzz -max_total_time=60 -max_len=4096 [corpus dir]
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <string_view>

#include "ptc/format/pickle.h"
#include "ptc/format/torch_file.h"
#include "ptc/format/zip_reader.h"

namespace {

class StringFile final : public ptc::RandomAccessFile {
 public:
  explicit StringFile(std::string_view data) : data_(data) {}
  ptc::Status Read(uint64_t offset, size_t n, void* dst) const override {
    if (offset > data_.size() || n > data_.size() - offset) return ptc::CorruptionError("fuzz: read past the end");
    if (n > 0) std::memcpy(dst, data_.data() + offset, n);
    return ptc::Status::OK();
  }
  uint64_t Size() const override { return data_.size(); }
  const std::string& path() const override { return path_; }

 private:
  std::string_view data_;
  std::string path_ = "fuzz";
};

constexpr ptc::pickle::UnpickleLimits kLimits{64, 100000};

// DictIndex answers as Value::Find for every key of every dict of the tree,
// and no dict holds a key twice (a key set again replaced its value, as in
// Python).
void CheckDictIndex(const ptc::pickle::Value& v, ptc::pickle::DictIndex& index) {
  if (v.is_dict()) {
    std::set<std::string> keys;
    for (const auto& [key, value] : v.pairs()) {
      if (!keys.insert(key.DebugString()).second) __builtin_trap();
      if (index.Find(v, key) != v.Find(key)) __builtin_trap();
      CheckDictIndex(value, index);
    }
  } else if (v.is_sequence()) {
    for (const ptc::pickle::Value& item : v.items()) CheckDictIndex(item, index);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  auto v = ptc::pickle::Unpickle(input, "fuzz", kLimits);
  if (v.ok()) {
    (void)v->DebugString();
    ptc::pickle::DictIndex index;
    CheckDictIndex(*v, index);
    auto again = ptc::pickle::Unpickle(ptc::pickle::Pickle(*v), "again");
    if (!again.ok() || !(*again == *v)) __builtin_trap();
  }
  StringFile file(input);
  auto zip = ptc::ReadZipDirectory(file, "fuzz");
  if (zip.ok()) {
    for (const ptc::ZipEntry& e : zip->members) {
      if (e.data_offset > size || e.size > size - e.data_offset) __builtin_trap();
      (void)ptc::VerifyMemberCrc(file, e, "fuzz");
    }
  }
  auto tf = ptc::ReadTorchFile(file, "fuzz");
  if (tf.ok()) {
    for (const ptc::TorchStorage& s : tf->storages) {
      if (tf->FindStorage(s.key) != &s) __builtin_trap();  // the index
    }
    ptc::pickle::ForEachTensor(tf->root, [&](const std::string&, const ptc::pickle::Tensor& t) {
      if (ptc::TensorNumBytes(t) > (1u << 20)) return;
      auto bytes = ptc::ReadTensorBytes(file, *tf, t, "fuzz");
      if (!bytes.ok()) __builtin_trap();
    });
  }
  return 0;
}

#include "ptc/checkpoint/dcp/entries.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <string_view>
#include <utility>

#include "ptc/base/hex.h"

namespace ptc::dcp {
namespace {

Status Bad(const std::string& where, const std::string& what) { return InvalidArgumentError(where + ": " + what); }

bool StartsWith(const std::string& s, std::string_view prefix) { return s.rfind(prefix, 0) == 0; }

// The bytes of a file that EntryBytes of it carry, and its size; a read of
// anything else fails.
class CarriedBytesFile final : public RandomAccessFile {
 public:
  CarriedBytesFile(std::string path, uint64_t size) : path_(std::move(path)), size_(size) {}
  void Add(const EntryBytes* e) { entries_.push_back(e); }
  Status Read(uint64_t offset, size_t n, void* dst) const override {
    for (const EntryBytes* e : entries_) {
      if (offset >= e->offset && offset - e->offset <= e->bytes.size() && n <= e->bytes.size() - (offset - e->offset)) {
        std::memcpy(dst, e->bytes.data() + (offset - e->offset), n);
        return Status::OK();
      }
    }
    return InvalidArgumentError(path_ + ": no worker's part carries bytes " + std::to_string(offset) + "+" +
                                std::to_string(n));
  }
  uint64_t Size() const override { return size_; }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  uint64_t size_;
  std::vector<const EntryBytes*> entries_;
};

// The bytes of entry `key` at `file` bytes offset+length, read through `open`.
Result<std::string> ReadEntry(const OpenFileFn& open, const std::string& what, const std::string& key,
                              const std::string& file, uint64_t offset, uint64_t length) {
  const std::string where =
      what + ": key " + key + " (" + file + " bytes " + std::to_string(offset) + "+" + std::to_string(length) + ")";
  if (file.empty()) return Bad(what + ": key " + key, "has no storage record");
  if (length > kMaxEntryBytes) return Bad(where, "is larger than " + std::to_string(kMaxEntryBytes) + " bytes");
  PTC_ASSIGN_OR_RETURN(const RandomAccessFile* f, open(file), where);
  if (offset > f->Size() || length > f->Size() - offset) return Bad(where, "lies past the end of the file");
  std::string bytes(length, '\0');
  PTC_RETURN_IF_ERROR(f->Read(offset, bytes.size(), bytes.data()), where);
  return bytes;
}

}  // namespace

bool CarriedObjectKey(const std::string& key, Keys keys) {
  return keys != Keys::kMegatronCore && !OptimizerEntryKey(key);
}

bool CarriedTensorKey(const std::string& key, Keys keys) {
  return keys == Keys::kTorchtitan && (StartsWith(key, "train_state.") || StartsWith(key, "lr_scheduler.") ||
                                       StartsWith(key, "dataloader.") || ExpertBiasKey(key));
}

bool ExpertBiasKey(const std::string& key) {
  constexpr std::string_view kSuffix = ".moe.expert_bias_E";
  return StartsWith(key, "layers.") && key.size() > kSuffix.size() &&
         key.compare(key.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0;
}

Result<std::vector<CarriedEntry>> SavedEntries(const SavedCheckpoint& saved, const std::vector<Tensor>& model,
                                               Keys keys, const OpenFileFn& open, const std::string& what) {
  std::set<std::string> model_keys;
  for (const Tensor& t : model) model_keys.insert(t.key);
  std::vector<CarriedEntry> out;
  for (const SavedTensor& t : saved.tensors) {
    if (!CarriedTensorKey(t.key, keys) || model_keys.count(t.key) != 0) continue;
    const bool whole = t.chunks.size() == 1 && t.chunks.front().box == Box::Full(t.shape);
    if ((!t.shape.empty() && !ExpertBiasKey(t.key)) || !whole) {
      return Bad(what, "key " + t.key + " is a tensor of " + ShapeToString(t.shape) + " in " +
                           std::to_string(t.chunks.size()) + " chunks; ptcfs carries one-element (0-dim) tensors, " +
                           "torchtitan's expert_bias_E in one chunk, and objects beside the model " +
                           "(docs/dcp_format.md)");
    }
    const SavedChunk& c = t.chunks.front();
    PTC_ASSIGN_OR_RETURN(std::string bytes, ReadEntry(open, what, t.key, c.file, c.offset, c.length));
    out.push_back(CarriedEntry{t.key, /*scalar=*/true, t.dtype, std::move(bytes), t.shape});
  }
  for (const SavedBytes& b : saved.bytes) {
    if (!CarriedObjectKey(b.key, keys)) continue;
    PTC_ASSIGN_OR_RETURN(std::string bytes, ReadEntry(open, what, b.key, b.file, b.offset, b.length));
    out.push_back(CarriedEntry{b.key, /*scalar=*/false, DType::kF32, std::move(bytes)});
  }
  return out;
}

Result<EntriesFiles> EntriesFiles::Make(const std::vector<EntryBytes>& entries, const std::string& what) {
  EntriesFiles out;
  std::map<std::string, std::shared_ptr<CarriedBytesFile>> files;
  for (const EntryBytes& e : entries) {
    auto [it, inserted] = files.try_emplace(e.file);
    if (inserted) it->second = std::make_shared<CarriedBytesFile>(e.file, e.file_size);
    if (it->second->Size() != e.file_size) {
      return InvalidArgumentError(what + ": two parts give " + e.file + " different sizes");
    }
    it->second->Add(&e);
  }
  for (auto& [name, file] : files) out.files_.emplace(name, std::move(file));
  return out;
}

Result<const RandomAccessFile*> EntriesFiles::Open(const std::string& file) const {
  auto it = files_.find(file);
  if (it == files_.end()) return InvalidArgumentError("no worker's part holds " + file);
  return it->second.get();
}

Result<std::vector<CarriedEntry>> PartsEntries(const OptimizerPart& part, const std::vector<EntryBytes>& entries,
                                               const std::string& what) {
  PTC_ASSIGN_OR_RETURN(const EntriesFiles files, EntriesFiles::Make(entries, what));
  return SavedEntries(
      *part.saved, part.model, part.keys, [&](const std::string& f) { return files.Open(f); }, what);
}

void SetSavedEntries(const std::vector<CarriedEntry>& entries, const std::string& save, nlohmann::json* extra) {
  ForgetSavedEntries(extra);
  if (!save.empty()) (*extra)[kSaveNameKey] = save;
  if (entries.empty()) return;
  nlohmann::json list = nlohmann::json::array();
  for (const CarriedEntry& e : entries) {
    nlohmann::json j = {{"key", e.key}, {"bytes", Hex(e.bytes)}};
    if (e.scalar) j["scalar"] = std::string(DTypeName(e.dtype));
    if (!e.shape.empty()) j["shape"] = e.shape;
    list.push_back(std::move(j));
  }
  (*extra)[kEntriesKey] = std::move(list);
}

void ForgetSavedEntries(nlohmann::json* extra) {
  if (!extra->is_object()) return;
  extra->erase(kEntriesKey);
  extra->erase(kSaveNameKey);
}

Result<std::vector<CarriedEntry>> EntriesOf(const nlohmann::json& extra, const std::string& what) {
  std::vector<CarriedEntry> out;
  if (!extra.is_object() || !extra.contains(kEntriesKey)) return out;
  const nlohmann::json& list = extra[kEntriesKey];
  const std::string where = what + ": " + kEntriesKey;
  if (!list.is_array()) return Bad(where, "is not a list");
  for (const nlohmann::json& j : list) {
    if (!j.is_object() || !j.contains("key") || !j["key"].is_string() || !j.contains("bytes") ||
        !j["bytes"].is_string()) {
      return Bad(where, "an entry without its key and bytes");
    }
    CarriedEntry e;
    e.key = j["key"].get<std::string>();
    PTC_ASSIGN_OR_RETURN(e.bytes, Unhex(j["bytes"].get<std::string>(), where + " " + e.key));
    if (j.contains("scalar")) {
      if (!j["scalar"].is_string()) return Bad(where + " " + e.key, "scalar is not a dtype name");
      e.scalar = true;
      PTC_ASSIGN_OR_RETURN(e.dtype, ParseDType(j["scalar"].get<std::string>()), where + " " + e.key);
    }
    if (j.contains("shape")) {
      const nlohmann::json& shape = j["shape"];
      const bool dims =
          e.scalar && shape.is_array() && std::all_of(shape.begin(), shape.end(), [](const auto& d) {
            return d.is_number_integer() && d.template get<int64_t>() >= 0 && d.template get<int64_t>() <= (1LL << 40);
          });
      if (!dims) return Bad(where + " " + e.key, "shape is not a tensor's list of sizes");
      e.shape = shape.get<Shape>();
    }
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<Object> EntryObjects(const std::vector<CarriedEntry>& entries) {
  std::vector<Object> out;
  for (const CarriedEntry& e : entries) {
    pickle::Items path;
    for (size_t start = 0;;) {
      const size_t dot = e.key.find('.', start);
      path.push_back(pickle::Value::Str(e.key.substr(start, dot == std::string::npos ? dot : dot - start)));
      if (dot == std::string::npos) break;
      start = dot + 1;
    }
    out.push_back(Object{e.key, e.bytes, e.scalar, e.dtype, std::move(path), e.shape});
  }
  return out;
}

Result<std::vector<Object>> ExpertBiasObjects(const std::vector<Tensor>& tensors,
                                              const std::vector<CarriedEntry>& carried) {
  constexpr std::string_view kExperts = ".moe.routed_experts.inner_experts.w1_EFD";
  std::set<std::string> have;  // carried, or a tensor of the model (DeepSeek-V3's router bias, hf::ExpertBiasSchema)
  for (const CarriedEntry& e : carried) have.insert(e.key);
  for (const Tensor& t : tensors) have.insert(t.key);
  std::vector<Object> out;
  for (const Tensor& t : tensors) {
    if (t.layer != 0 || t.key.size() <= kExperts.size() ||
        t.key.compare(t.key.size() - kExperts.size(), kExperts.size(), kExperts) != 0) {
      continue;
    }
    const std::string key = t.key.substr(0, t.key.size() - kExperts.size()) + ".moe.expert_bias_E";
    if (have.count(key) != 0) continue;
    pickle::Tensor zeros;
    zeros.storage_key = "0";
    zeros.dtype = DType::kF32;
    zeros.shape = {t.layers};
    zeros.storage_numel = static_cast<uint64_t>(t.layers);
    zeros.stride = {1};
    const std::string bytes(static_cast<size_t>(t.layers) * 4, '\0');
    PTC_ASSIGN_OR_RETURN(
        std::string saved,
        TorchSaveBytes(pickle::Value::FromTensor(std::move(zeros)),
                       {megatron::CarriedTensor{"0", DType::kF32, static_cast<uint64_t>(t.layers), bytes}}));
    CarriedEntry e{key, /*scalar=*/true, DType::kF32, std::move(saved), Shape{t.layers}};
    for (Object& o : EntryObjects({e})) out.push_back(std::move(o));
  }
  return out;
}

}  // namespace ptc::dcp

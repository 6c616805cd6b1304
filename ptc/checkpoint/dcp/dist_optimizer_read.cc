#include "ptc/checkpoint/dcp/dist_optimizer_read.h"

#include <algorithm>
#include <map>

#include "ptc/base/file_range.h"
#include "ptc/checkpoint/megatron/dp_reshardable_save.h"
#include "ptc/format/torch_file.h"
#include "ptc/model/model_layout.h"

namespace ptc::dcp {
namespace {

constexpr std::string_view kDistributed = "optimizer.distributed.";

// Why `key` is no bucket of `layout` (whose config `config` names).
std::string NoBucket(const std::string& key, const std::string& config) {
  const std::string rule = " (" + config + ": one buffer of one dtype, one bucket, per domain)";
  for (const auto& [part, why] : {std::pair<const char*, const char*>{".bucket_idx_",
                                                                      "a bucket past the first: several buckets "
                                                                      "(--overlap-grad-reduce's bucket size), which "
                                                                      "ptcfs does not take"},
                                  {".gbuf_idx_",
                                   "a gradient buffer past the first: parameters of several dtypes, "
                                   "which ptcfs does not take"}}) {
    const size_t at = key.find(part);
    if (at != std::string::npos && key.compare(at + std::string_view(part).size(), 2, "0.") != 0) return why + rule;
  }
  return "names no bucket state of the layout" + rule;
}

}  // namespace

bool DistributedOptimizerKey(std::string_view key) { return WithoutChainedPrefix(key).first.starts_with(kDistributed); }

Status AddBucketChunks(const std::vector<SavedTensor>& buckets, const megatron::DpReshardableLayout& layout,
                       const std::string& config, const ChunkBytesFn& bytes, const std::string& what,
                       DcpSource* source) {
  const std::vector<LocalTensor> states = megatron::SavedBucketStates(layout);
  std::map<std::string, const SavedTensor*> saved;
  for (const SavedTensor& t : buckets) saved[t.key] = &t;
  for (const SavedTensor& t : buckets) {
    if (std::none_of(states.begin(), states.end(), [&](const LocalTensor& s) { return s.name == t.key; })) {
      return InvalidArgumentError(what + ": key " + t.key + ": " + NoBucket(t.key, config));
    }
  }
  for (const LocalTensor& state : states) {
    auto it = saved.find(state.name);
    if (it == saved.end()) {
      return InvalidArgumentError(what + ": key " + state.name +
                                  ": missing (a bucket state of the distributed "
                                  "optimizer's dp_reshardable form in " +
                                  config + ")");
    }
    const SavedTensor& t = *it->second;
    const Index n = state.shape.at(0);
    if (t.dtype != DType::kF32 || t.shape != state.shape) {
      return InvalidArgumentError(what + ": key " + t.key + " is " + std::string(DTypeName(t.dtype)) + " " +
                                  ShapeToString(t.shape) + ", the layout's bucket (" + config + ") is float32 " +
                                  ShapeToString(state.shape));
    }
    std::vector<const SavedChunk*> chunks;
    for (const SavedChunk& c : t.chunks) {
      if (c.box.volume() > 0) chunks.push_back(&c);
    }
    std::sort(chunks.begin(), chunks.end(),
              [](const SavedChunk* a, const SavedChunk* b) { return a->box.begin[0] < b->box.begin[0]; });
    Index next = 0;  // the chunks tile [0, n)
    for (const SavedChunk* c : chunks) {
      if (c->box.begin[0] != next) {
        return InvalidArgumentError(what + ": key " + t.key + ": " +
                                    (c->box.begin[0] > next ? "elements [" + std::to_string(next) + ", " +
                                                                  std::to_string(c->box.begin[0]) + ") are in no chunk"
                                                            : "chunk " + c->box.ToString() + " overlaps another"));
      }
      next = c->box.end[0];
    }
    if (next != n) {
      return InvalidArgumentError(what + ": key " + t.key + ": elements [" + std::to_string(next) + ", " +
                                  std::to_string(n) + ") are in no chunk");
    }
    for (const SavedChunk* c : chunks) {
      PTC_ASSIGN_OR_RETURN(const auto where, bytes(t, *c));
      if (!where) continue;  // another worker's
      const Index begin = c->box.begin[0];
      for (const megatron::BucketRun& run : megatron::BucketRuns(state, begin, c->box.end[0])) {
        source->chunks.push_back(DcpSource::Chunk{run.tensor, DType::kF32, run.box, where->first,
                                                  where->second + static_cast<uint64_t>(run.at - begin) * 4,
                                                  static_cast<uint64_t>(run.box.volume()) * 4});
      }
    }
  }
  return Status::OK();
}

Result<pickle::Value> ReadDpReshardableCommon(Env* env, const std::string& dir, const ModelSpec& spec,
                                              const ParallelConfig& config, megatron::NameSet names) {
  const std::string metadata_path = JoinPath(dir, kMetadataFile);
  PTC_ASSIGN_OR_RETURN(const std::string metadata, ReadMetadata(env, dir));
  PTC_ASSIGN_OR_RETURN(const SavedCheckpoint saved, ParseMetadata(metadata, metadata_path));
  ModelSpec with_state = spec;  // the save's: optimizer state, and its parameters' dtype (OpenDcp checks them all)
  with_state.optimizer = true;
  for (const SavedTensor& t : saved.tensors) {
    if (!WithoutChainedPrefix(t.key).first.starts_with("optimizer.")) {
      with_state.dtype = t.dtype;
      break;
    }
  }
  const std::string text =
      "config " + config.ToString() + " in " + std::string(megatron::NameSetName(names)) + " names";
  PTC_ASSIGN_OR_RETURN(const ModelLayout layout, ModelLayout::Make(with_state, config), metadata_path);
  PTC_ASSIGN_OR_RETURN(const megatron::DpReshardableLayout form, megatron::LayOutDpReshardable(layout, names),
                       metadata_path + ": the distributed optimizer's dp_reshardable save in " + text);
  std::map<std::string, const SavedBytes*> objects;
  for (const SavedBytes& b : saved.bytes) objects.emplace(b.key, &b);
  auto object = [&](const std::string& key) -> Result<std::optional<pickle::Value>> {
    const std::string where = metadata_path + ": key " + key;
    auto found = objects.find(key);
    if (found == objects.end()) {
      return InvalidArgumentError(
          where + ": missing (an object of the distributed optimizer's dp_reshardable form in " + text + ")");
    }
    const SavedBytes* it = found->second;
    if (it->file.empty()) return InvalidArgumentError(where + ": has no storage record");
    const std::string path = JoinPath(dir, it->file);
    if (!env->Exists(path)) return std::nullopt;  // another worker's
    PTC_ASSIGN_OR_RETURN(auto file, env->OpenRead(path), where);
    if (it->offset > file->Size() || it->length > file->Size() - it->offset || it->length > kMaxTorchPickleSize) {
      return InvalidArgumentError(where + " (" + it->file + " bytes " + std::to_string(it->offset) + "+" +
                                  std::to_string(it->length) + "): lies past the end of the file or is too large");
    }
    FileRange range(*file, it->offset, it->length, where);
    PTC_ASSIGN_OR_RETURN(TorchFile tf, ReadTorchFile(range, where));
    if (tf.root.kind() != pickle::Kind::kList || tf.root.items().size() != 1) {
      return InvalidArgumentError(where + ": holds a " + std::string(pickle::KindName(tf.root.kind())) +
                                  ", not Megatron-Core's torch.save([object]) of a ShardedObject");
    }
    return std::optional<pickle::Value>(tf.root.items()[0]);
  };
  return megatron::DpReshardableSavedCommon(form, object, text, metadata_path);
}

}  // namespace ptc::dcp

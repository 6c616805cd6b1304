// The dataset state record: JSON, position arithmetic and the store commit.
// Importing and fingerprinting a source is in dataset_import.cc.
#include "ptc/dataset/state.h"

#include "ptc/base/checksum.h"
#include "ptc/base/json_fields.h"
#include "ptc/dataset/order.h"
#include "ptc/store/generation_writer.h"
#include "ptc/store/manifest.h"

namespace ptc {
namespace {

using json = nlohmann::json;

std::string U(uint64_t v) { return std::to_string(v); }

Result<std::vector<DatasetFile>> DecodeFiles(const JsonFields& f, const std::string& where, DatasetFormat format) {
  PTC_ASSIGN_OR_RETURN(const json* files, f.Get("files"));
  const size_t want = format == DatasetFormat::kMegatron ? 2 : 1;
  if (!files->is_array() || files->size() != want) {
    return f.Error("files", "must be an array of " + U(want) + " {path, size} objects");
  }
  std::vector<DatasetFile> out;
  for (size_t i = 0; i < files->size(); ++i) {
    const json& e = (*files)[i];
    if (!e.is_object()) return f.Error("files", "entry " + U(i) + " must be an object");
    JsonFields g(e, where + ": files[" + U(i) + "]");
    DatasetFile file;
    PTC_ASSIGN_OR_RETURN(file.path, g.String("path"));
    if (file.path.empty()) return g.Error("path", "must not be empty");
    PTC_ASSIGN_OR_RETURN(file.size, g.Unsigned("size"));
    out.push_back(std::move(file));
  }
  return out;
}

Result<std::vector<uint64_t>> DecodeBuckets(const JsonFields& f) {
  std::vector<uint64_t> out;
  const json* b = f.Find("length_buckets");
  if (b == nullptr) return out;
  if (!b->is_array()) return f.Error("length_buckets", "must be an array of positive integers");
  for (const json& e : *b) {
    if (!IsNonNegativeInteger(e)) return f.Error("length_buckets", "must be an array of positive integers");
    out.push_back(e.get<uint64_t>());
  }
  Status s = CheckLengthBounds(out);
  if (!s.ok()) return f.Error("length_buckets", "is invalid: " + s.message());
  return out;
}

Status DecodeSource(const JsonFields& f, DatasetState& s) {
  PTC_ASSIGN_OR_RETURN(std::string format, f.String("format"));
  Result<DatasetFormat> parsed = ParseDatasetFormat(format);
  if (!parsed.ok()) return f.Error("format", "is '" + format + "', expected 'megatron' or 'jsonl'");
  s.format = *parsed;
  PTC_ASSIGN_OR_RETURN(s.source, f.String("source"));
  if (s.source.empty()) return f.Error("source", "must not be empty");
  if (s.format == DatasetFormat::kJsonl) {
    PTC_ASSIGN_OR_RETURN(s.index, f.String("index"));
    if (!IsSafeRelativePath(s.index)) return f.Error("index", "must be a relative path inside the store");
  }
  PTC_ASSIGN_OR_RETURN(std::string checksum, f.String("index_checksum"));
  Result<uint64_t> sum = ParseChecksum(checksum);
  if (!sum.ok()) return f.Error("index_checksum", "is malformed: " + sum.status().message());
  s.index_checksum = *sum;
  return Status::OK();
}

Status DecodePosition(const JsonFields& f, DatasetState& s) {
  PTC_ASSIGN_OR_RETURN(s.num_samples, f.Unsigned("samples"));
  if (s.num_samples == 0) return f.Error("samples", "must be at least 1");
  PTC_ASSIGN_OR_RETURN(s.global_batch, f.Unsigned("global_batch"));
  if (s.global_batch == 0) return f.Error("global_batch", "must be at least 1");
  PTC_ASSIGN_OR_RETURN(s.seed, f.Unsigned("seed"));
  PTC_ASSIGN_OR_RETURN(s.epoch, f.Unsigned("epoch"));
  PTC_ASSIGN_OR_RETURN(s.consumed, f.Unsigned("consumed"));
  if (s.consumed > s.num_samples) return f.Error("consumed", "exceeds samples (" + U(s.num_samples) + ")");
  if (s.consumed % s.global_batch != 0 && s.consumed != s.num_samples) {
    return f.Error("consumed", "is not a multiple of global_batch (" + U(s.global_batch) + ") nor samples");
  }
  return Status::OK();
}

}  // namespace

json EncodeDatasetState(const DatasetState& s) {
  json j;
  j["format"] = std::string(DatasetFormatName(s.format));
  j["source"] = s.source;
  if (s.format == DatasetFormat::kJsonl) j["index"] = s.index;
  j["files"] = json::array();
  for (const DatasetFile& f : s.files) j["files"].push_back({{"path", f.path}, {"size", f.size}});
  j["index_checksum"] = ChecksumToString(s.index_checksum);
  j["samples"] = s.num_samples;
  j["global_batch"] = s.global_batch;
  j["seed"] = s.seed;
  j["epoch"] = s.epoch;
  j["consumed"] = s.consumed;
  if (!s.length_buckets.empty()) j["length_buckets"] = s.length_buckets;
  return j;
}

Result<DatasetState> DecodeDatasetState(std::string_view label, const json& j) {
  const std::string where = std::string(label) + ": dataset";
  if (!j.is_object()) return CorruptionError(where + ": must be a JSON object");
  JsonFields f(j, where);
  DatasetState s;
  PTC_RETURN_IF_ERROR(DecodeSource(f, s));
  PTC_ASSIGN_OR_RETURN(s.files, DecodeFiles(f, where, s.format));
  PTC_RETURN_IF_ERROR(DecodePosition(f, s));
  PTC_ASSIGN_OR_RETURN(s.length_buckets, DecodeBuckets(f));
  if (!s.length_buckets.empty() && s.format != DatasetFormat::kMegatron) {
    return f.Error("length_buckets", "are only supported for megatron datasets");
  }
  return s;
}

Result<DatasetState> DecodeDatasetStateText(std::string_view label, std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return CorruptionError(std::string(label) + ": dataset state is not valid JSON");
  return DecodeDatasetState(label, j);
}

Result<std::optional<DatasetState>> LoadDatasetState(const Store& store) {
  std::shared_ptr<const GenerationManifest> m = store.CurrentSnapshot();
  if (m == nullptr) return std::optional<DatasetState>();
  auto it = m->extra.find("dataset");
  if (it == m->extra.end()) return std::optional<DatasetState>();
  const std::string label = store.ManifestPath(m->generation);
  PTC_ASSIGN_OR_RETURN(DatasetState s, DecodeDatasetState(label, *it));
  return std::optional<DatasetState>(std::move(s));
}

Result<DatasetState> StateAtStep(const DatasetState& s, uint64_t step, std::optional<uint64_t> epoch) {
  const uint64_t e = epoch.value_or(s.epoch);
  if (step > s.steps_per_epoch()) {
    return InvalidArgumentError("step " + U(step) + " is beyond the end of epoch " + U(e) + ", which has " +
                                U(s.steps_per_epoch()) + " steps (" + U(s.num_samples) + " samples, global batch " +
                                U(s.global_batch) + "); start the next epoch with epoch " + U(e + 1) + ", step 0");
  }
  DatasetState out = s;
  out.epoch = e;
  out.consumed = std::min(s.num_samples, step * s.global_batch);
  return out;
}

Status CommitDatasetState(Store& store, const DatasetState& s) {
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<GenerationWriter> writer, store.BeginGeneration());
  std::shared_ptr<const GenerationManifest> current = store.CurrentSnapshot();
  GenerationManifest meta = current ? *current : GenerationManifest{};
  for (const ShardRecord& shard : meta.shards) writer->AddShard(shard);
  meta.extra["dataset"] = EncodeDatasetState(s);
  return writer->Commit(std::move(meta));
}

}  // namespace ptc

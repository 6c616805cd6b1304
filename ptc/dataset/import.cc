// Importing a dataset into a store: fingerprinting the source, comparing it
// with what the store holds, writing a JSONL index, committing the state.
#include <filesystem>
#include <vector>

#include "ptc/base/checksum.h"
#include "ptc/dataset/order.h"
#include "ptc/dataset/state.h"

namespace ptc {
namespace {

constexpr const char* kIndexDir = "dataset";

std::string U(uint64_t v) { return std::to_string(v); }

std::string Absolute(const std::string& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  return ec ? path : p.lexically_normal().string();
}

// Fingerprint and sample count of a Megatron source (validating the .idx).
Result<DatasetState> FingerprintMegatron(Env* env, const std::string& prefix) {
  DatasetState s;
  s.format = DatasetFormat::kMegatron;
  s.source = prefix;
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<DatasetSource> source, OpenMegatronSource(env, prefix));
  s.num_samples = source->num_samples();
  for (const char* ext : {".idx", ".bin"}) {
    PTC_ASSIGN_OR_RETURN(uint64_t size, env->FileSize(prefix + ext));
    s.files.push_back({prefix + ext, size});
  }
  s.index_checksum = source->IndexChecksum();
  return s;
}

// Fingerprint of a JSONL source; with `write_index`, writes its index into the
// store under a content-addressed name and sets s.index.
Result<DatasetState> FingerprintJsonl(Env* env, const Store& store, const std::string& path, bool write_index,
                                      const std::function<void(uint64_t)>& progress) {
  DatasetState s;
  s.format = DatasetFormat::kJsonl;
  s.source = path;
  const std::string tmp_rel = std::string(kIndexDir) + "/import.index";
  if (write_index) PTC_RETURN_IF_ERROR(env->CreateDirs(store.AbsPath(kIndexDir)));
  PTC_ASSIGN_OR_RETURN(JsonlScan scan, ScanJsonl(env, path, write_index ? store.AbsPath(tmp_rel) : "", progress));
  s.num_samples = scan.num_samples;
  s.files.push_back({path, scan.source_size});
  s.index_checksum = scan.checksum;
  if (write_index) {
    s.index = std::string(kIndexDir) + "/jsonl-" + ChecksumToString(scan.checksum).substr(6) + ".index";
    PTC_RETURN_IF_ERROR(env->Rename(store.AbsPath(tmp_rel), store.AbsPath(s.index)));
  }
  return s;
}

std::string DescribeFingerprint(const DatasetState& s) {
  std::string out = "samples " + U(s.num_samples);
  for (const DatasetFile& f : s.files) out += ", " + f.path + " " + U(f.size) + " bytes";
  return out + ", index " + ChecksumToString(s.index_checksum);
}

bool SameFingerprint(const DatasetState& a, const DatasetState& b) {
  if (a.format != b.format || a.num_samples != b.num_samples || a.index_checksum != b.index_checksum) return false;
  if (a.files.size() != b.files.size()) return false;
  for (size_t i = 0; i < a.files.size(); ++i) {
    if (a.files[i].size != b.files[i].size) return false;
  }
  return true;
}

Status MismatchError(const std::string& store, const DatasetState& had, const DatasetState& now) {
  return FailedPreconditionError("dataset fingerprint mismatch: " + store + " holds the state of " +
                                 std::string(DatasetFormatName(had.format)) + " dataset " + had.source + " (" +
                                 DescribeFingerprint(had) + "), but " + now.source + " is (" +
                                 DescribeFingerprint(now) + "); nothing was changed");
}

// Same dataset again: fine when the settings agree, else an error.
Status CheckSameSettings(const DatasetState& had, const DatasetImportOptions& o) {
  if (had.global_batch != o.global_batch) {
    return FailedPreconditionError("the dataset is already imported with global batch " + U(had.global_batch) +
                                   "; the global batch stays constant (asked for " + U(o.global_batch) + ")");
  }
  if (had.seed != o.seed) {
    return FailedPreconditionError("the dataset is already imported with seed " + U(had.seed) + " (asked for " +
                                   U(o.seed) + ")");
  }
  if (had.length_buckets != o.length_buckets) {
    return FailedPreconditionError("the dataset is already imported with other length buckets");
  }
  return Status::OK();
}

Status CheckOptions(const DatasetImportOptions& o) {
  if (o.global_batch == 0) return InvalidArgumentError("--global-batch must be at least 1");
  if (!o.length_buckets.empty()) {
    PTC_RETURN_IF_ERROR(CheckLengthBounds(o.length_buckets));
    if (o.format != DatasetFormat::kMegatron) {
      return InvalidArgumentError("length buckets need token lengths: only megatron datasets support them");
    }
  }
  return Status::OK();
}

Status CheckSize(Env* env, const DatasetFile& f, const DatasetState& s) {
  PTC_ASSIGN_OR_RETURN(uint64_t size, env->FileSize(f.path));
  if (size == f.size) return Status::OK();
  return FailedPreconditionError("dataset fingerprint mismatch: " + f.path + " has " + U(size) + " bytes, " +
                                 U(f.size) + " when imported into the store; re-import it into a new store");
}

}  // namespace

Result<DatasetImportResult> ImportDataset(Store& store, const DatasetImportOptions& options,
                                          const std::function<void(uint64_t)>& progress) {
  PTC_RETURN_IF_ERROR(CheckOptions(options));
  Env* env = store.env();
  PTC_ASSIGN_OR_RETURN(std::optional<DatasetState> had, LoadDatasetState(store));
  const std::string source = Absolute(options.source);
  const bool jsonl = options.format == DatasetFormat::kJsonl;
  const bool made_dir = jsonl && !had && !env->Exists(store.AbsPath(kIndexDir));
  Result<DatasetState> fp =
      jsonl ? FingerprintJsonl(env, store, source, !had.has_value(), progress) : FingerprintMegatron(env, source);
  if (!fp.ok() && made_dir) (void)env->RemoveTree(store.AbsPath(kIndexDir));
  PTC_RETURN_IF_ERROR(fp.status());
  DatasetState s = std::move(fp).value();
  if (had) {
    if (!SameFingerprint(*had, s)) return MismatchError(store.root(), *had, s);
    PTC_RETURN_IF_ERROR(CheckSameSettings(*had, options));
    return DatasetImportResult{*had, false};
  }
  Status st = s.num_samples == 0 ? InvalidArgumentError(source + ": the dataset has no samples") : Status::OK();
  s.global_batch = options.global_batch;
  s.seed = options.seed;
  s.length_buckets = options.length_buckets;
  if (st.ok()) st = CommitDatasetState(store, s);
  if (!st.ok() && jsonl) {
    (void)env->Remove(store.AbsPath(s.index));
    if (made_dir) (void)env->RemoveTree(store.AbsPath(kIndexDir));
  }
  PTC_RETURN_IF_ERROR(st);
  return DatasetImportResult{s, true};
}

Result<std::unique_ptr<DatasetSource>> OpenDatasetSource(Env* env, const Store& store, const DatasetState& s) {
  for (const DatasetFile& f : s.files) PTC_RETURN_IF_ERROR(CheckSize(env, f, s));
  std::unique_ptr<DatasetSource> source;
  if (s.format == DatasetFormat::kMegatron) {
    PTC_ASSIGN_OR_RETURN(source, OpenMegatronSource(env, s.source));
  } else {
    PTC_ASSIGN_OR_RETURN(source, OpenJsonlSource(env, s.source, store.AbsPath(s.index)));
  }
  const uint64_t checksum = source->IndexChecksum();
  if (checksum != s.index_checksum || source->num_samples() != s.num_samples) {
    return FailedPreconditionError("dataset fingerprint mismatch: the index of " + s.source + " has checksum " +
                                   ChecksumToString(checksum) + " and " + U(source->num_samples()) +
                                   " samples; the store recorded " + ChecksumToString(s.index_checksum) + " and " +
                                   U(s.num_samples));
  }
  return source;
}

}  // namespace ptc

#include "ptc/dataset/source.h"

#include <algorithm>
#include <cstring>

#include "ptc/base/checksum.h"

namespace ptc {
namespace {

class MegatronSource : public DatasetSource {
 public:
  MegatronSource(std::unique_ptr<IdxFile> idx, std::unique_ptr<RandomAccessFile> bin)
      : idx_(std::move(idx)), bin_(std::move(bin)) {}
  DatasetFormat format() const override { return DatasetFormat::kMegatron; }
  uint64_t num_samples() const override { return idx_->view().num_sequences(); }
  uint64_t SampleBytes(uint64_t id) const override { return idx_->view().nbytes(id); }
  uint64_t SampleLength(uint64_t id) const override { return static_cast<uint64_t>(idx_->view().length(id)); }
  Status ReadSample(uint64_t id, uint64_t offset, size_t n, char* dst) const override {
    return bin_->Read(static_cast<uint64_t>(idx_->view().offset(id)) + offset, n, dst);
  }
  uint8_t dtype_code() const override { return idx_->view().dtype_code(); }
  uint64_t IndexChecksum() const override { return Xxh64(idx_->bytes().data(), idx_->bytes().size()); }

 private:
  std::unique_ptr<IdxFile> idx_;
  std::unique_ptr<RandomAccessFile> bin_;
};

class JsonlSource : public DatasetSource {
 public:
  JsonlSource(std::unique_ptr<JsonlIndex> index, std::unique_ptr<RandomAccessFile> file)
      : index_(std::move(index)), file_(std::move(file)) {}
  DatasetFormat format() const override { return DatasetFormat::kJsonl; }
  uint64_t num_samples() const override { return index_->view().num_samples(); }
  uint64_t SampleBytes(uint64_t id) const override { return SampleLength(id) + 1; }
  uint64_t SampleLength(uint64_t id) const override { return index_->view().end(id) - index_->view().start(id); }
  // The line's bytes, then the "\n" that ends it in samples.jsonl.
  Status ReadSample(uint64_t id, uint64_t offset, size_t n, char* dst) const override {
    const uint64_t len = SampleLength(id);
    const size_t from_file = offset < len ? std::min<uint64_t>(n, len - offset) : 0;
    if (from_file > 0) PTC_RETURN_IF_ERROR(file_->Read(index_->view().start(id) + offset, from_file, dst));
    if (from_file < n) dst[from_file] = '\n';
    return Status::OK();
  }
  uint8_t dtype_code() const override { return 0; }
  uint64_t IndexChecksum() const override { return index_->view().checksum(); }

 private:
  std::unique_ptr<JsonlIndex> index_;
  std::unique_ptr<RandomAccessFile> file_;
};

}  // namespace

std::string_view DatasetFormatName(DatasetFormat f) { return f == DatasetFormat::kMegatron ? "megatron" : "jsonl"; }

Result<DatasetFormat> ParseDatasetFormat(std::string_view name) {
  if (name == "megatron") return DatasetFormat::kMegatron;
  if (name == "jsonl") return DatasetFormat::kJsonl;
  return InvalidArgumentError("unknown dataset format '" + std::string(name) + "' (megatron or jsonl)");
}

Result<std::unique_ptr<DatasetSource>> OpenMegatronSource(Env* env, const std::string& prefix) {
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> bin, env->OpenRead(prefix + ".bin"));
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<IdxFile> idx, IdxFile::Open(env, prefix + ".idx", bin->Size()));
  return std::unique_ptr<DatasetSource>(new MegatronSource(std::move(idx), std::move(bin)));
}

Result<std::unique_ptr<DatasetSource>> OpenJsonlSource(Env* env, const std::string& jsonl_path,
                                                       const std::string& index_path) {
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->OpenRead(jsonl_path));
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<JsonlIndex> index, JsonlIndex::Open(env, index_path, file->Size()));
  return std::unique_ptr<DatasetSource>(new JsonlSource(std::move(index), std::move(file)));
}

}  // namespace ptc

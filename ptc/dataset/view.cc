#include "ptc/dataset/view.h"

#include <algorithm>
#include <cstring>

#include "ptc/dataset/idx.h"

namespace ptc {
namespace {

constexpr uint64_t kBlock = 1024;  // items per entry of the offset table

std::string U(uint64_t v) { return std::to_string(v); }

// Writes `id` zero-padded to `width` digits, then '\n'.
void FormatId(uint64_t id, int width, char* out) {
  out[width] = '\n';
  for (int i = width - 1; i >= 0; --i) {
    out[i] = static_cast<char>('0' + id % 10);
    id /= 10;
  }
}

}  // namespace

std::string_view ViewFileName(ViewFile f) {
  switch (f) {
    case ViewFile::kIds:
      return "ids.txt";
    case ViewFile::kIdx:
      return "samples.idx";
    case ViewFile::kBin:
      return "samples.bin";
    case ViewFile::kJsonl:
      return "samples.jsonl";
  }
  return "?";
}

Result<ViewFile> ParseViewFile(std::string_view name) {
  for (ViewFile f : {ViewFile::kIds, ViewFile::kIdx, ViewFile::kBin, ViewFile::kJsonl}) {
    if (name == ViewFileName(f)) return f;
  }
  return InvalidArgumentError("unknown view file '" + std::string(name) +
                              "' (ids.txt, samples.idx, samples.bin, samples.jsonl)");
}

std::vector<ViewFile> ViewFiles(DatasetFormat format) {
  if (format == DatasetFormat::kMegatron) return {ViewFile::kIds, ViewFile::kIdx, ViewFile::kBin};
  return {ViewFile::kIds, ViewFile::kJsonl};
}

int IdWidth(uint64_t num_samples) {
  int w = 1;
  for (uint64_t v = num_samples > 0 ? num_samples - 1 : 0; v >= 10; v /= 10) ++w;
  return w;
}

Result<std::shared_ptr<const SampleSequence>> RankSamplesFor(const DatasetState& state,
                                                             std::shared_ptr<const DatasetSource> source, int dp,
                                                             int dp_rank, std::optional<size_t> group) {
  const BatchGeometry g{state.num_samples, state.global_batch};
  const Permutation perm(state.num_samples, state.seed, state.epoch);
  if (state.length_buckets.empty()) {
    if (group) return InvalidArgumentError("the dataset has no length buckets; do not name a group");
    PTC_ASSIGN_OR_RETURN(RankStream stream, RankStream::Create(g, state.consumed, dp, dp_rank));
    return std::shared_ptr<const SampleSequence>(std::make_shared<RankSamples>(perm, stream));
  }
  if (!group) {
    return InvalidArgumentError("the dataset has " + U(state.length_buckets.size()) +
                                " length groups; name the group (0-based)");
  }
  LengthFn length = [source](uint64_t id) { return source->SampleLength(id); };
  PTC_ASSIGN_OR_RETURN(
      std::unique_ptr<GroupedRankStream> s,
      GroupedRankStream::Create(g, perm, std::move(length), state.length_buckets, state.consumed, *group, dp, dp_rank));
  return std::shared_ptr<const SampleSequence>(std::move(s));
}

// ---------------------------------------------------------------- RankDataView

// samples.idx as an IdxSource: lengths from the source, offsets from the table.
class RankDataView::IdxAdapter : public IdxSource {
 public:
  explicit IdxAdapter(const RankDataView& v) : v_(v) {}
  IdxLayout layout() const override { return {v_.num_samples(), v_.num_samples() + 1}; }
  uint8_t dtype_code() const override { return v_.source_->dtype_code(); }
  Status Lengths(uint64_t first, uint64_t count, int32_t* out) const override {
    for (uint64_t t = 0; t < count; ++t)
      out[t] = static_cast<int32_t>(v_.source_->SampleLength(v_.samples_->At(first + t)));
    return Status::OK();
  }
  Status Offsets(uint64_t first, uint64_t count, int64_t* out) const override {
    uint64_t off = v_.DataOffset(first);
    for (uint64_t t = 0; t < count; ++t) {
      out[t] = static_cast<int64_t>(off);
      off += v_.source_->SampleBytes(v_.samples_->At(first + t));
    }
    return Status::OK();
  }
  Status Documents(uint64_t first, uint64_t count, int64_t* out) const override {
    for (uint64_t t = 0; t < count; ++t) out[t] = static_cast<int64_t>(first + t);
    return Status::OK();
  }

 private:
  const RankDataView& v_;
};

RankDataView::RankDataView(std::shared_ptr<const DatasetSource> source, std::shared_ptr<const SampleSequence> samples)
    : source_(std::move(source)), samples_(std::move(samples)), width_(IdWidth(source_->num_samples())) {}

bool RankDataView::Offers(ViewFile f) const {
  const std::vector<ViewFile> files = ViewFiles(source_->format());
  return std::find(files.begin(), files.end(), f) != files.end();
}

void RankDataView::BuildTable() const {
  std::call_once(table_once_, [this] {
    const uint64_t n = samples_->size();
    table_.reserve(n / kBlock + 2);
    uint64_t off = 0;
    for (uint64_t j = 0; j < n; ++j) {
      if (j % kBlock == 0) table_.push_back(off);
      off += source_->SampleBytes(samples_->At(j));
    }
    if (n % kBlock == 0) table_.push_back(off);  // the entry of item n
    table_.push_back(off);                       // the total
  });
}

uint64_t RankDataView::DataOffset(uint64_t j) const {
  BuildTable();
  uint64_t off = table_[j / kBlock];
  for (uint64_t i = j - j % kBlock; i < j; ++i) off += source_->SampleBytes(samples_->At(i));
  return off;
}

std::pair<uint64_t, uint64_t> RankDataView::LocateData(uint64_t offset) const {
  BuildTable();
  // The last block whose start is <= offset (the final entry is the total).
  const auto it = std::upper_bound(table_.begin(), table_.end() - 1, offset);
  uint64_t j = static_cast<uint64_t>(it - table_.begin() - 1) * kBlock;
  uint64_t start = *(it - 1);
  while (true) {
    const uint64_t bytes = source_->SampleBytes(samples_->At(j));
    if (offset < start + bytes) return {j, offset - start};
    start += bytes;
    ++j;
  }
}

Result<uint64_t> RankDataView::FileSize(ViewFile f) const {
  if (!Offers(f)) {
    return InvalidArgumentError("a view of a " + std::string(DatasetFormatName(source_->format())) +
                                " dataset has no " + std::string(ViewFileName(f)));
  }
  switch (f) {
    case ViewFile::kIds:
      return num_samples() * static_cast<uint64_t>(width_ + 1);
    case ViewFile::kIdx:
      return IdxLayout{num_samples(), num_samples() + 1}.total_size();
    case ViewFile::kBin:
    case ViewFile::kJsonl:
      BuildTable();
      return table_.back();
  }
  return InternalError("unknown view file");
}

Status RankDataView::ReadIds(uint64_t offset, size_t n, char* dst) const {
  const uint64_t line = width_ + 1;
  char buf[32];
  for (uint64_t j = offset / line; n > 0; ++j) {
    FormatId(samples_->At(j), width_, buf);
    const uint64_t skip = offset - j * line;
    const size_t c = std::min<uint64_t>(n, line - skip);
    std::memcpy(dst, buf + skip, c);
    dst += c, offset += c, n -= c;
  }
  return Status::OK();
}

Status RankDataView::ReadData(uint64_t offset, size_t n, char* dst) const {
  if (n == 0) return Status::OK();
  auto [j, skip] = LocateData(offset);
  for (; n > 0; ++j, skip = 0) {
    const uint64_t id = samples_->At(j);
    const size_t c = std::min<uint64_t>(n, source_->SampleBytes(id) - skip);
    PTC_RETURN_IF_ERROR(source_->ReadSample(id, skip, c, dst), "sample " + U(id));
    dst += c, n -= c;
  }
  return Status::OK();
}

Result<size_t> RankDataView::Read(ViewFile f, uint64_t offset, size_t n, char* dst) const {
  PTC_ASSIGN_OR_RETURN(uint64_t size, FileSize(f));
  if (offset >= size) return size_t{0};
  n = std::min<uint64_t>(n, size - offset);
  switch (f) {
    case ViewFile::kIds:
      PTC_RETURN_IF_ERROR(ReadIds(offset, n, dst));
      break;
    case ViewFile::kIdx:
      PTC_RETURN_IF_ERROR(RenderIdx(IdxAdapter(*this), offset, n, dst));
      break;
    case ViewFile::kBin:
    case ViewFile::kJsonl:
      PTC_RETURN_IF_ERROR(ReadData(offset, n, dst));
      break;
  }
  return n;
}

}  // namespace ptc

#include "ptc/dataset/jsonl.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "ptc/base/checksum.h"

namespace ptc {
namespace {

constexpr size_t kScanChunk = 4 << 20;

std::string U(uint64_t v) { return std::to_string(v); }

uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// Collects (start, end) pairs, hashing them and writing them in chunks.
class PairSink {
 public:
  explicit PairSink(WritableFile* out) : out_(out) {}
  Status Add(uint64_t start, uint64_t end) {
    buf_.push_back(start);
    buf_.push_back(end);
    ++count_;
    return buf_.size() >= 1 << 16 ? Flush() : Status::OK();
  }
  Status Flush() {
    hash_.Update(buf_.data(), 8 * buf_.size());
    if (out_ != nullptr) PTC_RETURN_IF_ERROR(out_->Append(buf_.data(), 8 * buf_.size()));
    buf_.clear();
    return Status::OK();
  }
  uint64_t count() const { return count_; }
  uint64_t digest() const { return hash_.Digest(); }

 private:
  WritableFile* out_;
  std::vector<uint64_t> buf_;
  Xxh64Stream hash_;
  uint64_t count_ = 0;
};

bool IsBlank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

// Emits `line`, which starts at byte `start` of the source, unless it is blank;
// one trailing '\r' is not part of the sample.
Status EmitLine(PairSink& sink, std::string_view line, uint64_t start) {
  if (IsBlank(line)) return Status::OK();
  uint64_t end = start + line.size();
  if (line.back() == '\r') --end;
  return sink.Add(start, end);
}

// Reads the file in chunks; `carry` keeps the unfinished line.
Status ScanLines(const RandomAccessFile& file, PairSink& sink, const std::function<void(uint64_t)>& progress) {
  std::string carry;
  uint64_t carry_start = 0;
  // A small file gets a buffer of its own size, not a whole (zero-filled) chunk.
  std::vector<char> buf(std::min<uint64_t>(kScanChunk, file.Size()));
  for (uint64_t pos = 0; pos < file.Size(); pos += buf.size()) {
    const size_t n = std::min<uint64_t>(buf.size(), file.Size() - pos);
    PTC_RETURN_IF_ERROR(file.Read(pos, n, buf.data()));
    size_t from = 0;
    while (const void* nl = std::memchr(buf.data() + from, '\n', n - from)) {
      const size_t at = static_cast<const char*>(nl) - buf.data();
      carry.append(buf.data() + from, at - from);
      PTC_RETURN_IF_ERROR(EmitLine(sink, carry, carry_start));
      carry.clear();
      carry_start = pos + at + 1;
      from = at + 1;
    }
    carry.append(buf.data() + from, n - from);
    if (progress) progress(n);
  }
  return EmitLine(sink, carry, carry_start);
}

std::string Header(uint64_t source_size, uint64_t count) {
  std::string h(kJsonlIndexMagic);
  const uint64_t fields[] = {1, source_size, count};
  h.append(reinterpret_cast<const char*>(fields), sizeof fields);
  return h;
}

}  // namespace

Result<JsonlScan> ScanJsonl(Env* env, const std::string& jsonl_path, const std::string& index_path,
                            const std::function<void(uint64_t)>& progress) {
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->OpenRead(jsonl_path));
  std::unique_ptr<WritableFile> out;
  const std::string tmp = index_path + ".tmp";
  if (!index_path.empty()) {
    PTC_ASSIGN_OR_RETURN(out, env->OpenWrite(tmp));
    const std::string placeholder = Header(0, 0);
    PTC_RETURN_IF_ERROR(out->Append(placeholder.data(), placeholder.size()));
  }
  PairSink sink(out.get());
  Status s = ScanLines(*file, sink, progress);
  if (s.ok()) s = sink.Flush();
  JsonlScan scan{sink.count(), file->Size(), sink.digest()};
  if (out != nullptr) {
    const std::string header = Header(scan.source_size, scan.num_samples);
    if (s.ok()) s = out->PWrite(0, header.data(), header.size());
    if (s.ok()) s = out->Sync();
    if (s.ok()) s = out->Close();
    if (s.ok()) s = env->Rename(tmp, index_path);
    if (!s.ok() && env->Exists(tmp)) (void)env->Remove(tmp);
  }
  PTC_RETURN_IF_ERROR(s, jsonl_path);
  return scan;
}

uint64_t JsonlIndexView::start(uint64_t i) const { return Load64(pairs_ + 16 * i); }
uint64_t JsonlIndexView::end(uint64_t i) const { return Load64(pairs_ + 16 * i + 8); }
uint64_t JsonlIndexView::checksum() const { return Xxh64(pairs_, 16 * n_); }

Result<JsonlIndexView> ParseJsonlIndex(std::string_view label, std::span<const uint8_t> bytes, uint64_t source_size) {
  const std::string at(label);
  if (bytes.size() < kJsonlIndexHeaderSize) {
    return CorruptionError(at + ": truncated: " + U(bytes.size()) + " bytes, the header needs 32");
  }
  if (std::memcmp(bytes.data(), kJsonlIndexMagic.data(), 8) != 0) {
    return CorruptionError(at + ": wrong magic: not a ptcfs JSONL index");
  }
  if (Load64(bytes.data() + 8) != 1) return CorruptionError(at + ": version is not 1");
  if (Load64(bytes.data() + 16) != source_size) {
    return CorruptionError(at + ": built for a source of " + U(Load64(bytes.data() + 16)) + " bytes, the source has " +
                           U(source_size));
  }
  JsonlIndexView v;
  v.n_ = Load64(bytes.data() + 24);
  if (v.n_ > (bytes.size() - kJsonlIndexHeaderSize) / 16 || 16 * v.n_ != bytes.size() - kJsonlIndexHeaderSize) {
    return CorruptionError(at + ": count mismatch: " + U(v.n_) + " samples need " +
                           (v.n_ > UINT64_MAX / 32 ? std::string("more than 2^64") : U(32 + 16 * v.n_)) +
                           " bytes, the file has " + U(bytes.size()));
  }
  v.pairs_ = bytes.data() + kJsonlIndexHeaderSize;
  uint64_t prev_end = 0;
  for (uint64_t i = 0; i < v.n_; ++i) {
    const uint64_t s = v.start(i), e = v.end(i);
    if (s > e || e > source_size || (i > 0 && s <= prev_end)) {
      return CorruptionError(at + ": sample " + U(i) + ": range [" + U(s) + ", " + U(e) +
                             ") is reversed, overlaps the previous line or leaves the source of " + U(source_size) +
                             " bytes");
    }
    prev_end = e;
  }
  return v;
}

Result<std::unique_ptr<JsonlIndex>> JsonlIndex::Open(Env* env, const std::string& path, uint64_t source_size) {
  std::unique_ptr<JsonlIndex> j(new JsonlIndex());
  PTC_ASSIGN_OR_RETURN(j->image_, FileImage::Open(env, path));
  PTC_ASSIGN_OR_RETURN(j->view_, ParseJsonlIndex(path, j->image_->bytes(), source_size));
  return j;
}

}  // namespace ptc

#include "ptc/dataset/idx.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <functional>

namespace ptc {

static_assert(std::endian::native == std::endian::little, "the .idx format is little-endian");

namespace {

using u128 = unsigned __int128;

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::string U(uint64_t v) { return std::to_string(v); }

struct DTypeInfo {
  uint8_t code;
  size_t size;
  std::string_view name, short_name;
};
constexpr DTypeInfo kDTypes[] = {
    {1, 1, "uint8", "u8"},  {2, 1, "int8", "i8"},     {3, 2, "int16", "i16"},   {4, 4, "int32", "i32"},
    {5, 8, "int64", "i64"}, {6, 8, "float64", "f64"}, {7, 4, "float32", "f32"}, {8, 2, "uint16", "u16"},
};

const DTypeInfo* FindDType(uint8_t code) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.code == code) return &d;
  }
  return nullptr;
}

Status CheckHeader(std::string_view label, std::span<const uint8_t> bytes) {
  const std::string at(label);
  if (bytes.size() < kIdxHeaderSize) {
    return CorruptionError(at + ": truncated: " + U(bytes.size()) + " bytes, the header alone needs 34");
  }
  if (std::memcmp(bytes.data(), kIdxMagic.data(), kIdxMagic.size()) != 0) {
    return CorruptionError(at + ": wrong magic: not a Megatron indexed dataset (expected \"MMIDIDX\\0\\0\")");
  }
  const uint64_t version = Load<uint64_t>(bytes.data() + 9);
  if (version != 1) return CorruptionError(at + ": version is " + U(version) + "; only version 1 is read");
  const uint8_t code = bytes[17];
  if (FindDType(code) == nullptr) return CorruptionError(at + ": unknown dtype code " + U(code) + " (1..8)");
  return Status::OK();
}

Status CheckCounts(std::string_view label, uint64_t size, const IdxLayout& l) {
  const u128 need = u128{kIdxHeaderSize} + u128{12} * l.num_sequences + u128{8} * l.num_documents;
  if (need == size) return Status::OK();
  const std::string what = need > size ? "truncated or count mismatch" : "count mismatch";
  const std::string need_text = need >> 64 ? "more than 2^64" : U(static_cast<uint64_t>(need));
  return CorruptionError(std::string(label) + ": " + what + ": sequence count " + U(l.num_sequences) +
                         " and document count " + U(l.num_documents) + " need " + need_text + " bytes, the file has " +
                         U(size));
}

Status SequenceError(std::string_view label, uint64_t i, const std::string& what) {
  return CorruptionError(std::string(label) + ": sequence " + U(i) + ": " + what);
}

Status CheckSequences(std::string_view label, const IdxView& v, uint64_t bin_size) {
  for (uint64_t i = 0; i < v.num_sequences(); ++i) {
    const int32_t len = v.length(i);
    const int64_t off = v.offset(i);
    const u128 end = u128(static_cast<uint64_t>(off)) + u128(static_cast<uint32_t>(len)) * v.token_size();
    if (len >= 0 && off >= 0 && end <= bin_size) continue;  // the common case builds no strings
    if (len < 0) return SequenceError(label, i, "length " + std::to_string(len) + " is negative");
    if (off < 0) return SequenceError(label, i, "offset " + std::to_string(off) + " is negative");
    return SequenceError(label, i,
                         "offset " + std::to_string(off) + " + length " + std::to_string(len) + " x " +
                             U(v.token_size()) + " bytes ends past the end of the .bin (" + U(bin_size) + " bytes)");
  }
  return Status::OK();
}

Status CheckDocuments(std::string_view label, const IdxView& v) {
  int64_t prev = 0;
  for (uint64_t j = 0; j < v.num_documents(); ++j) {
    const int64_t d = v.document(j);
    if (d < prev || static_cast<uint64_t>(d) > v.num_sequences()) {
      return CorruptionError(std::string(label) + ": document index entry " + U(j) + " is " + std::to_string(d) +
                             "; entries must be non-decreasing and at most the sequence count " + U(v.num_sequences()));
    }
    prev = d;
  }
  return Status::OK();
}

// Copies the overlap of [offset, offset + n) with an array region of `count`
// elements of `elem` bytes at `region`, filling elements in chunks.
Status RenderArray(uint64_t region, uint64_t count, size_t elem,
                   const std::function<Status(uint64_t, uint64_t, char*)>& fill, uint64_t offset, size_t n, char* dst) {
  const uint64_t lo = std::max(offset, region), hi = std::min(offset + n, region + count * elem);
  if (lo >= hi) return Status::OK();
  constexpr uint64_t kChunk = 8192;
  std::vector<char> buf(kChunk * elem);
  for (uint64_t first = (lo - region) / elem; region + first * elem < hi; first += kChunk) {
    const uint64_t c = std::min(kChunk, count - first);
    PTC_RETURN_IF_ERROR(fill(first, c, buf.data()));
    const uint64_t a = std::max(lo, region + first * elem), b = std::min(hi, region + (first + c) * elem);
    std::memcpy(dst + (a - offset), buf.data() + (a - region - first * elem), b - a);
  }
  return Status::OK();
}

}  // namespace

size_t IdxDTypeSize(uint8_t code) {
  const DTypeInfo* d = FindDType(code);
  return d ? d->size : 0;
}

std::string_view IdxDTypeName(uint8_t code) {
  const DTypeInfo* d = FindDType(code);
  return d ? d->name : "unknown";
}

Result<uint8_t> ParseIdxDType(std::string_view name) {
  for (const DTypeInfo& d : kDTypes) {
    if (name == d.name || name == d.short_name) return d.code;
  }
  return InvalidArgumentError("unknown token dtype '" + std::string(name) + "' (u8, i8, i16, i32, i64, f64, f32, u16)");
}

int32_t IdxView::length(uint64_t i) const { return Load<int32_t>(data_ + layout_.sizes_offset() + 4 * i); }
int64_t IdxView::offset(uint64_t i) const { return Load<int64_t>(data_ + layout_.pointers_offset() + 8 * i); }
int64_t IdxView::document(uint64_t j) const { return Load<int64_t>(data_ + layout_.documents_offset() + 8 * j); }

Result<IdxView> ParseIdx(std::string_view label, std::span<const uint8_t> bytes, uint64_t bin_size) {
  PTC_RETURN_IF_ERROR(CheckHeader(label, bytes));
  IdxView v;
  v.data_ = bytes.data();
  v.dtype_ = bytes[17];
  v.layout_.num_sequences = Load<uint64_t>(bytes.data() + 18);
  v.layout_.num_documents = Load<uint64_t>(bytes.data() + 26);
  PTC_RETURN_IF_ERROR(CheckCounts(label, bytes.size(), v.layout_));
  PTC_RETURN_IF_ERROR(CheckSequences(label, v, bin_size));
  PTC_RETURN_IF_ERROR(CheckDocuments(label, v));
  return v;
}

// ---------------------------------------------------------------- IdxFile

FileImage::~FileImage() {
  if (mapped_) munmap(const_cast<uint8_t*>(data_), size_);
}

Result<std::unique_ptr<FileImage>> FileImage::Open(Env* env, const std::string& path) {
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<RandomAccessFile> file, env->OpenRead(path));
  std::unique_ptr<FileImage> f(new FileImage());
  f->size_ = file->Size();
  if (file->fd() >= 0 && f->size_ > 0) {
    void* p = mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, file->fd(), 0);
    if (p == MAP_FAILED) return ErrnoError(path + ": mmap", errno);
    f->data_ = static_cast<const uint8_t*>(p);
    f->mapped_ = true;
  } else {
    f->copy_.resize(f->size_);
    PTC_RETURN_IF_ERROR(file->Read(0, f->size_, f->copy_.data()));
    f->data_ = reinterpret_cast<const uint8_t*>(f->copy_.data());
  }
  return f;
}

Result<std::unique_ptr<IdxFile>> IdxFile::Open(Env* env, const std::string& path, uint64_t bin_size) {
  std::unique_ptr<IdxFile> f(new IdxFile());
  PTC_ASSIGN_OR_RETURN(f->image_, FileImage::Open(env, path));
  PTC_ASSIGN_OR_RETURN(f->view_, ParseIdx(path, f->bytes(), bin_size));
  return f;
}

// ---------------------------------------------------------------- rendering

std::string EncodeIdxHeader(uint8_t dtype_code, uint64_t num_sequences, uint64_t num_documents) {
  std::string h(kIdxMagic);
  const uint64_t version = 1;
  h.append(reinterpret_cast<const char*>(&version), 8);
  h.push_back(static_cast<char>(dtype_code));
  h.append(reinterpret_cast<const char*>(&num_sequences), 8);
  h.append(reinterpret_cast<const char*>(&num_documents), 8);
  return h;
}

Status RenderIdx(const IdxSource& src, uint64_t offset, size_t n, char* dst) {
  const IdxLayout l = src.layout();
  const std::string header = EncodeIdxHeader(src.dtype_code(), l.num_sequences, l.num_documents);
  if (offset < kIdxHeaderSize) {
    const size_t c = std::min<uint64_t>(n, kIdxHeaderSize - offset);
    std::memcpy(dst, header.data() + offset, c);
  }
  PTC_RETURN_IF_ERROR(RenderArray(
      l.sizes_offset(), l.num_sequences, 4,
      [&](uint64_t f, uint64_t c, char* out) { return src.Lengths(f, c, reinterpret_cast<int32_t*>(out)); }, offset, n,
      dst));
  PTC_RETURN_IF_ERROR(RenderArray(
      l.pointers_offset(), l.num_sequences, 8,
      [&](uint64_t f, uint64_t c, char* out) { return src.Offsets(f, c, reinterpret_cast<int64_t*>(out)); }, offset, n,
      dst));
  return RenderArray(
      l.documents_offset(), l.num_documents, 8,
      [&](uint64_t f, uint64_t c, char* out) { return src.Documents(f, c, reinterpret_cast<int64_t*>(out)); }, offset,
      n, dst);
}

// ---------------------------------------------------------------- MegatronWriter

namespace {
constexpr size_t kWriterChunk = 1 << 20;  // sequences buffered before their lengths/offsets are written
constexpr size_t kBinBuffer = 4 << 20;    // .bin bytes buffered before an Append
}  // namespace

MegatronWriter::~MegatronWriter() = default;

Result<std::unique_ptr<MegatronWriter>> MegatronWriter::Create(Env* env, const std::string& prefix, uint8_t dtype_code,
                                                               uint64_t num_sequences) {
  if (IdxDTypeSize(dtype_code) == 0) return InvalidArgumentError("unknown dtype code " + U(dtype_code));
  std::unique_ptr<MegatronWriter> w(new MegatronWriter());
  w->prefix_ = prefix;
  w->dtype_ = dtype_code;
  w->layout_ = {num_sequences, num_sequences + 1};
  PTC_ASSIGN_OR_RETURN(w->bin_, env->OpenWrite(prefix + ".bin"));
  PTC_ASSIGN_OR_RETURN(w->idx_, env->OpenWrite(prefix + ".idx"));
  const std::string header = EncodeIdxHeader(dtype_code, num_sequences, num_sequences + 1);
  PTC_RETURN_IF_ERROR(w->idx_->PWrite(0, header.data(), header.size()));
  return w;
}

Status MegatronWriter::Add(std::string_view tokens) {
  const size_t ts = IdxDTypeSize(dtype_);
  if (added_ >= layout_.num_sequences) {
    return InvalidArgumentError(prefix_ + ": more than the declared " + U(layout_.num_sequences) + " sequences");
  }
  if (tokens.size() % ts != 0 || tokens.size() / ts > INT32_MAX) {
    return InvalidArgumentError(prefix_ + ": sequence " + U(added_) + " has " + U(tokens.size()) +
                                " bytes, not a whole number of " + U(ts) + "-byte tokens below 2^31");
  }
  bin_buf_.append(tokens);
  if (bin_buf_.size() >= kBinBuffer) {
    PTC_RETURN_IF_ERROR(bin_->Append(bin_buf_.data(), bin_buf_.size()));
    bin_buf_.clear();
  }
  lengths_.push_back(static_cast<int32_t>(tokens.size() / ts));
  offsets_.push_back(static_cast<int64_t>(bin_bytes_));
  bin_bytes_ += tokens.size();
  ++added_;
  if (lengths_.size() >= kWriterChunk) return FlushArrays();
  return Status::OK();
}

Status MegatronWriter::FlushArrays() {
  PTC_RETURN_IF_ERROR(idx_->PWrite(layout_.sizes_offset() + 4 * flushed_, lengths_.data(), 4 * lengths_.size()));
  PTC_RETURN_IF_ERROR(idx_->PWrite(layout_.pointers_offset() + 8 * flushed_, offsets_.data(), 8 * offsets_.size()));
  flushed_ += lengths_.size();
  lengths_.clear();
  offsets_.clear();
  return Status::OK();
}

Status MegatronWriter::Finish() {
  if (finished_) return FailedPreconditionError(prefix_ + ": Finish called twice");
  if (added_ != layout_.num_sequences) {
    return FailedPreconditionError(prefix_ + ": " + U(added_) + " of the declared " + U(layout_.num_sequences) +
                                   " sequences were added");
  }
  finished_ = true;
  PTC_RETURN_IF_ERROR(FlushArrays());
  PTC_RETURN_IF_ERROR(bin_->Append(bin_buf_.data(), bin_buf_.size()));
  bin_buf_.clear();
  std::vector<int64_t> docs;
  for (uint64_t j = 0; j < layout_.num_documents; j += docs.size()) {
    docs.resize(std::min<uint64_t>(kWriterChunk, layout_.num_documents - j));
    for (size_t t = 0; t < docs.size(); ++t) docs[t] = static_cast<int64_t>(j + t);
    PTC_RETURN_IF_ERROR(idx_->PWrite(layout_.documents_offset() + 8 * j, docs.data(), 8 * docs.size()));
  }
  PTC_RETURN_IF_ERROR(bin_->Sync());
  PTC_RETURN_IF_ERROR(bin_->Close());
  PTC_RETURN_IF_ERROR(idx_->Sync());
  return idx_->Close();
}

}  // namespace ptc

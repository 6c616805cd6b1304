#include "fs/virtual_file.h"

#include <algorithm>
#include <cstring>

#include "ptc/npy.h"
#include "ptc/safetensors.h"

namespace ptcfs {
namespace {

using ptc::Box;
using ptc::Index;

uint64_t TensorBytes(const ptc::LocalTensor& t) { return ptc::NumElements(t.shape) * ptc::DTypeSize(t.dtype); }

std::vector<ptc::TensorSpec> Specs(const std::vector<ptc::LocalTensor>& tensors) {
  std::vector<ptc::TensorSpec> specs;
  for (const ptc::LocalTensor& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  return specs;
}

// Appends a one-piece extent to `out`, merged into the last extent when it
// continues it: contiguously, or as the next piece of a strided run.
void Append(const Extent& e, std::vector<Extent>* out) {
  if (e.length == 0) return;
  if (!out->empty()) {
    Extent& last = out->back();
    if (last.end() == e.offset && last.kind == e.kind) {
      if (e.kind == Extent::kZero || (e.kind == Extent::kLiteral && last.literal + last.length == e.literal)) {
        last.length += e.length;
        return;
      }
      if (e.kind == Extent::kShard && last.file == e.file && last.shard == e.shard) {
        if (last.count == 1 && last.file_offset + last.length == e.file_offset) {
          last.length += e.length;
          return;
        }
        if (last.length == e.length && e.file_offset > last.file_offset &&
            (last.count == 1 || e.file_offset == last.file_offset + last.count * last.stride)) {
          if (last.count == 1) last.stride = e.file_offset - last.file_offset;
          ++last.count;
          return;
        }
      }
    }
  }
  out->push_back(e);
}

// Sorts one-piece extents, merges neighbours that continue each other, and
// fills gaps in [begin, end) with zeros.
std::vector<Extent> Normalize(std::vector<Extent> in, uint64_t begin, uint64_t end) {
  std::sort(in.begin(), in.end(), [](const Extent& a, const Extent& b) { return a.offset < b.offset; });
  std::vector<Extent> out;
  uint64_t pos = begin;
  auto push = [&](const Extent& e) { Append(e, &out); };
  for (const Extent& e : in) {
    if (e.offset > pos) push(Extent{pos, e.offset - pos, Extent::kZero});
    push(e);
    pos = e.end();
  }
  if (pos < end) push(Extent{pos, end - pos, Extent::kZero});
  return out;
}

}  // namespace

VirtualFile::VirtualFile(std::string literal, std::vector<Extent> extents, uint64_t size)
    : literal_(std::move(literal)), extents_(std::move(extents)), size_(size) {}

const Extent* VirtualFile::Find(uint64_t offset) const {
  auto it = std::upper_bound(extents_.begin(), extents_.end(), offset,
                             [](uint64_t off, const Extent& e) { return off < e.offset; });
  if (it == extents_.begin()) return nullptr;
  --it;
  return offset < it->end() ? &*it : nullptr;
}

ptc::Result<size_t> VirtualFile::Read(uint64_t offset, size_t n, void* dst, const ShardCheck& check) const {
  if (offset >= size_) return size_t{0};
  n = static_cast<size_t>(std::min<uint64_t>(n, size_ - offset));
  auto* out = static_cast<unsigned char*>(dst);
  size_t done = 0;
  const Extent* e = Find(offset);
  while (done < n && e != nullptr && e < extents_.data() + extents_.size()) {
    const uint64_t pos = offset + done;
    if (pos >= e->end()) {
      ++e;
      continue;
    }
    const uint64_t piece = (pos - e->offset) / e->length, skip = (pos - e->offset) % e->length;
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n - done, e->length - skip));
    switch (e->kind) {
      case Extent::kLiteral: std::memcpy(out + done, literal_.data() + e->literal + skip, take); break;
      case Extent::kZero: std::memset(out + done, 0, take); break;
      case Extent::kShard: {
        const uint64_t at = e->file_offset + piece * e->stride + skip;
        PTC_RETURN_IF_ERROR(check(*e->shard, at - e->shard->offset, take));
        PTC_RETURN_IF_ERROR(e->file->Read(at, take, out + done));
        break;
      }
    }
    done += take;
  }
  return done;
}

VirtualFile::FdRange VirtualFile::SingleShardRange(uint64_t offset, size_t n) const {
  const Extent* e = Find(offset);
  if (e == nullptr || e->kind != Extent::kShard || e->file->fd() < 0) return {};
  const uint64_t piece = (offset - e->offset) / e->length, skip = (offset - e->offset) % e->length;
  if (skip + std::min<uint64_t>(n, size_ - offset) > e->length) return {};
  return {e->file->fd(), e->file_offset + piece * e->stride + skip, e->shard};
}

ptc::Status AppendTensorExtents(const ptc::GenerationReader& reader, const ptc::LocalTensor& tensor, uint64_t base,
                                int prefer_worker, std::vector<Extent>* out) {
  const size_t elem = ptc::DTypeSize(tensor.dtype);
  std::vector<Extent> mine;
  for (const ptc::Segment& seg : tensor.segments) {
    PTC_RETURN_IF_ERROR(reader.Cover(
        seg.tensor, seg.box, prefer_worker,
        [&](const ptc::ShardRecord& shard, const Box& stored, uint64_t data, const Box& part) -> ptc::Status {
          PTC_ASSIGN_OR_RETURN(const ptc::RandomAccessFile* file, reader.File(shard));
          ptc::ForEachRun(part, stored, ptc::DenseLayout(stored), seg.box, seg.layout,
                          [&](Index src, Index dst, Index count) {
                            mine.push_back(Extent{base + dst * elem, static_cast<uint64_t>(count) * elem,
                                                  Extent::kShard, 0, file, data + src * elem, &shard});
                          });
          return ptc::Status::OK();
        }));
  }
  for (Extent& e : Normalize(std::move(mine), base, base + TensorBytes(tensor))) out->push_back(e);
  return ptc::Status::OK();
}

ptc::Result<uint64_t> SafetensorsFileSize(const std::vector<ptc::LocalTensor>& tensors,
                                          const std::map<std::string, std::string>& metadata) {
  PTC_ASSIGN_OR_RETURN(std::string header, ptc::EncodeSafetensorsHeader(Specs(tensors), metadata));
  uint64_t size = header.size();
  for (const ptc::LocalTensor& t : tensors) size += TensorBytes(t);
  return size;
}

uint64_t NpyFileSize(const ptc::LocalTensor& tensor) {
  return ptc::EncodeNpyHeader(tensor.dtype, tensor.shape).size() + TensorBytes(tensor);
}

ptc::Result<std::unique_ptr<VirtualFile>> MakeSafetensorsFile(const ptc::GenerationReader& reader,
                                                             const std::vector<ptc::LocalTensor>& tensors,
                                                             const std::map<std::string, std::string>& metadata,
                                                             int prefer_worker) {
  PTC_ASSIGN_OR_RETURN(std::string header, ptc::EncodeSafetensorsHeader(Specs(tensors), metadata));
  std::vector<Extent> extents = {Extent{0, header.size(), Extent::kLiteral, 0, nullptr, 0}};
  uint64_t pos = header.size();
  for (const ptc::LocalTensor& t : tensors) {
    PTC_RETURN_IF_ERROR(AppendTensorExtents(reader, t, pos, prefer_worker, &extents));
    pos += TensorBytes(t);
  }
  return std::make_unique<VirtualFile>(std::move(header), std::move(extents), pos);
}

ptc::Result<std::unique_ptr<VirtualFile>> MakeNpyFile(const ptc::GenerationReader& reader,
                                                     const ptc::LocalTensor& tensor, int prefer_worker) {
  std::string header = ptc::EncodeNpyHeader(tensor.dtype, tensor.shape);
  std::vector<Extent> extents = {Extent{0, header.size(), Extent::kLiteral, 0, nullptr, 0}};
  PTC_RETURN_IF_ERROR(AppendTensorExtents(reader, tensor, header.size(), prefer_worker, &extents));
  const uint64_t size = header.size() + TensorBytes(tensor);
  return std::make_unique<VirtualFile>(std::move(header), std::move(extents), size);
}

}  // namespace ptcfs

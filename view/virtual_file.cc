#include "view/virtual_file.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <span>

#include "ptc/format/npy.h"
#include "ptc/format/safetensors.h"

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
  for (const Extent& e : in) {
    if (e.offset > pos) Append(Extent{pos, e.offset - pos, Extent::kZero}, &out);
    Append(e, &out);
    pos = e.end();
  }
  if (pos < end) Append(Extent{pos, end - pos, Extent::kZero}, &out);
  return out;
}

}  // namespace

VirtualFile::VirtualFile(std::string literal, std::vector<Extent> extents, uint64_t size, std::vector<PartFn> parts)
    : literal_(std::move(literal)), extents_(std::move(extents)), size_(size) {
  for (PartFn& fn : parts) {
    parts_.push_back(std::make_unique<Part>());
    parts_.back()->build = std::move(fn);
  }
}

namespace {

// A strided extent of short pieces (a column slice: part of every row) is
// read a window of the file at a time, from one piece to a later one, and its
// pieces copied out of the window: a pread per piece of a few KiB costs far
// more than reading the bytes between the pieces too. Gathered when the
// pieces are shorter than kGatherPiece and at most kGatherWaste times as far
// apart as they are long; a window is at most kGatherWindow bytes.
constexpr uint64_t kGatherPiece = 64 << 10;
constexpr uint64_t kGatherWaste = 4;
constexpr uint64_t kGatherWindow = 1 << 20;

// One window per serving thread, kept: a fresh 1 MiB allocation per read
// would be a fresh mapping, faulted in page by page.
unsigned char* Window() {
  thread_local std::unique_ptr<unsigned char[]> window;
  if (!window) window = std::make_unique_for_overwrite<unsigned char[]>(kGatherWindow);
  return window.get();
}

bool Gathered(const Extent& e) {
  return e.kind == Extent::kShard && e.count > 1 && e.length < kGatherPiece && e.stride >= e.length &&
         e.stride <= kGatherWaste * e.length;
}

// The extent of `list` (sorted, tiling) that holds byte `offset`, or nullptr.
const Extent* Find(const std::vector<Extent>& list, uint64_t offset) {
  auto it =
      std::upper_bound(list.begin(), list.end(), offset, [](uint64_t off, const Extent& e) { return off < e.offset; });
  if (it == list.begin()) return nullptr;
  --it;
  return offset < it->end() ? &*it : nullptr;
}

}  // namespace

ptc::Result<const std::vector<Extent>*> VirtualFile::PartExtents(const Extent& lazy) const {
  Part& part = *parts_.at(lazy.literal);
  std::call_once(part.once, [&] { part.status = part.build(&part.extents); });
  PTC_RETURN_IF_ERROR(part.status);
  return &part.extents;
}

ptc::Result<size_t> VirtualFile::Read(uint64_t offset, size_t n, void* dst, const ShardCheck& check) const {
  if (offset >= size_) return size_t{0};
  n = static_cast<size_t>(std::min<uint64_t>(n, size_ - offset));
  return ReadExtents(extents_, offset, n, static_cast<unsigned char*>(dst), check);
}

ptc::Result<size_t> VirtualFile::ReadExtents(const std::vector<Extent>& list, uint64_t offset, size_t n,
                                             unsigned char* out, const ShardCheck& check) const {
  size_t done = 0;
  const Extent* e = Find(list, offset);
  while (done < n && e != nullptr && e < list.data() + list.size()) {
    const uint64_t pos = offset + done;
    if (pos >= e->end()) {
      ++e;
      continue;
    }
    const uint64_t piece = (pos - e->offset) / e->length, skip = (pos - e->offset) % e->length;
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n - done, e->length - skip));
    switch (e->kind) {
      case Extent::kLiteral:
        std::memcpy(out + done, literal_.data() + e->literal + skip, take);
        break;
      case Extent::kZero:
        std::memset(out + done, 0, take);
        break;
      case Extent::kShard: {
        if (Gathered(*e)) {  // every piece of the extent that the read needs
          const size_t all = static_cast<size_t>(std::min<uint64_t>(n - done, e->end() - pos));
          PTC_RETURN_IF_ERROR(ReadGathered(*e, pos, all, out + done, check));
          done += all;
          continue;
        }
        PTC_ASSIGN_OR_RETURN(const size_t batched,
                             ReadBatched(e, list.data() + list.size(), pos, n - done, out + done, check));
        if (batched > 0) {
          done += batched;
          continue;
        }
        const uint64_t at = e->file_offset + piece * e->stride + skip;
        PTC_RETURN_IF_ERROR(check(*e->shard, at - e->shard->offset, take));
        PTC_RETURN_IF_ERROR(e->file->Read(at, take, out + done));
        break;
      }
      case Extent::kLazy: {
        PTC_ASSIGN_OR_RETURN(const std::vector<Extent>* part, PartExtents(*e));
        PTC_ASSIGN_OR_RETURN(size_t got, ReadExtents(*part, pos, take, out + done, check));
        if (got != take) return ptc::InternalError("the extents of a tensor do not tile it");
        break;
      }
    }
    done += take;
  }
  return done;
}

ptc::Status VirtualFile::ReadGathered(const Extent& e, uint64_t offset, size_t n, unsigned char* out,
                                      const ShardCheck& check) const {
  unsigned char* window = Window();
  // File offset of the byte after the last one the read needs.
  const uint64_t last = offset + n - 1 - e.offset;
  const uint64_t need_end = e.file_offset + last / e.length * e.stride + last % e.length + 1;
  uint64_t from = 0, to = 0;  // the file bytes in `window`
  for (size_t done = 0; done < n;) {
    const uint64_t rel = offset + done - e.offset, skip = rel % e.length;
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n - done, e.length - skip));
    const uint64_t at = e.file_offset + rel / e.length * e.stride + skip;
    if (at < from || at + take > to) {
      from = at;
      to = std::max(at + take, std::min(need_end, at + kGatherWindow));  // take < kGatherPiece < kGatherWindow
      PTC_RETURN_IF_ERROR(check(*e.shard, from - e.shard->offset, to - from));
      PTC_RETURN_IF_ERROR(e.file->Read(from, to - from, window));
    }
    std::memcpy(out + done, window + (at - from), take);
    done += take;
  }
  return ptc::Status::OK();
}

// Short pieces that alternate between a few runs of a file (a woven head of
// DCP's torchtitan keys: rows taken in turn from its two halves) would be a
// pread each; read as those runs they are a pread per run.
ptc::Result<size_t> VirtualFile::ReadBatched(const Extent* e, const Extent* end, uint64_t offset, size_t n,
                                             unsigned char* out, const ShardCheck& check) const {
  struct Piece {
    uint64_t at;  // in the file
    size_t take;  // bytes
    size_t done;  // where in `out`
    size_t window = 0;
  };
  std::vector<Piece> pieces;
  const Extent& first = *e;
  size_t done = 0, bytes = 0;
  for (bool full = false; !full && done < n && e < end; ++e) {
    if (e->kind != Extent::kShard || e->file != first.file || e->shard != first.shard || Gathered(*e) ||
        e->length >= kGatherPiece) {
      break;
    }
    while (done < n && offset + done < e->end()) {
      const uint64_t rel = offset + done - e->offset, skip = rel % e->length;
      const size_t take = static_cast<size_t>(std::min<uint64_t>(n - done, e->length - skip));
      if (bytes + take > kGatherWindow) {
        full = true;
        break;
      }
      pieces.push_back({e->file_offset + rel / e->length * e->stride + skip, take, done});
      bytes += take;
      done += take;
    }
  }
  if (pieces.size() < 4) return size_t{0};
  // The runs of the file the pieces come from: by file offset, touching ones merged.
  std::vector<size_t> order(pieces.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return pieces[a].at < pieces[b].at; });
  std::vector<std::pair<uint64_t, uint64_t>> runs;  // [from, to) in the file
  for (size_t i : order) {
    Piece& p = pieces[i];
    if (runs.empty() || p.at > runs.back().second) runs.emplace_back(p.at, p.at + p.take);
    runs.back().second = std::max(runs.back().second, p.at + p.take);
    p.window = runs.size() - 1;  // the run, for now
  }
  if (runs.size() * 2 > pieces.size()) return size_t{0};
  unsigned char* window = Window();
  std::vector<uint64_t> at(runs.size());  // each run's place in the window
  uint64_t used = 0;
  for (size_t r = 0; r < runs.size(); ++r) {
    const auto [from, to] = runs[r];
    PTC_RETURN_IF_ERROR(check(*first.shard, from - first.shard->offset, to - from));
    PTC_RETURN_IF_ERROR(first.file->Read(from, to - from, window + used));
    at[r] = used;
    used += to - from;
  }
  for (const Piece& p : pieces) {
    std::memcpy(out + p.done, window + at[p.window] + (p.at - runs[p.window].first), p.take);
  }
  return done;
}

VirtualFile::FdRange VirtualFile::SingleShardRange(uint64_t offset, size_t n) const {
  const Extent* e = Find(extents_, offset);
  if (e != nullptr && e->kind == Extent::kLazy) {
    auto part = PartExtents(*e);
    e = part.ok() ? Find(**part, offset) : nullptr;
  }
  if (e == nullptr || e->kind != Extent::kShard || e->file->fd() < 0) return {};
  const uint64_t piece = (offset - e->offset) / e->length, skip = (offset - e->offset) % e->length;
  if (skip + std::min<uint64_t>(n, size_ - offset) > e->length) return {};
  return {e->file->fd(), e->file_offset + piece * e->stride + skip, e->shard};
}

ptc::Result<std::vector<std::string>> VirtualFile::VerbatimFiles(
    const std::map<const ptc::ShardRecord*, std::vector<ptc::CopyPlace>>& copies) const {
  std::optional<std::set<std::string>> files;  // those holding every extent so far
  for (const Extent& top : extents_) {
    if (top.kind == Extent::kLiteral || top.kind == Extent::kZero) continue;  // CheckVerbatim's
    std::span<const Extent> part(&top, 1);  // a shard extent itself (a torch file's), or a lazy tensor's parts
    if (top.kind == Extent::kLazy) {
      PTC_ASSIGN_OR_RETURN(const std::vector<Extent>* parts, PartExtents(top));
      part = *parts;
    }
    for (const Extent& e : part) {
      if (e.kind == Extent::kZero) continue;  // padding inside a tensor: a hole of the rank file
      if (e.kind != Extent::kShard || e.count != 1 || e.shard == nullptr) return std::vector<std::string>{};
      const uint64_t in_piece = e.file_offset - e.shard->offset;
      std::set<std::string> here;
      if (e.file_offset == e.offset && e.file->fd() >= 0) here.insert(e.shard->file);
      if (auto it = copies.find(e.shard); it != copies.end()) {
        for (const ptc::CopyPlace& c : it->second) {
          if (c.offset + in_piece == e.offset) here.insert(c.file);
        }
      }
      if (files) std::erase_if(*files, [&](const std::string& f) { return !here.count(f); });
      if (!files) files = std::move(here);
      if (files->empty()) return std::vector<std::string>{};
    }
  }
  if (!files) return std::vector<std::string>{};
  return std::vector<std::string>(files->begin(), files->end());
}

ptc::Status VirtualFile::CheckVerbatim(const ptc::RandomAccessFile& file) const {
  // The bytes first, as far as the file reaches: other bytes there are
  // another file's (a Corruption: not this one's backing file, as a rank file
  // of another format with pieces at the same offsets); the same bytes and
  // another size, this file damaged.
  const uint64_t size = file.Size();
  std::string buf;
  for (const Extent& e : extents_) {
    if (e.kind != Extent::kLiteral && e.kind != Extent::kZero) continue;  // tensors' zeros: as written
    const uint64_t length = e.offset >= size ? 0 : std::min(e.length, size - e.offset);
    for (uint64_t at = 0; at < length;) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(length - at, 1 << 20));
      buf.resize(n);
      PTC_RETURN_IF_ERROR(file.Read(e.offset + at, n, buf.data()));
      const bool same = e.kind == Extent::kLiteral ? std::memcmp(buf.data(), literal_.data() + e.literal + at, n) == 0
                                                   : buf.find_first_not_of('\0') == std::string::npos;
      if (!same)
        return ptc::CorruptionError(file.path() + ": differs from the file it backs at " + std::to_string(e.offset));
      at += n;
    }
  }
  if (size != size_) {
    return ptc::IOError(file.path() + ": holds " + std::to_string(size) + " bytes, the file it backs " +
                        std::to_string(size_) + " (truncated under the mount?)");
  }
  return ptc::Status::OK();
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

namespace {

// A lazy extent for `tensor` at `base`: its extents are built on first read.
void AppendLazyTensor(const ptc::GenerationReader& reader, const ptc::LocalTensor& tensor, uint64_t base,
                      int prefer_worker, std::vector<Extent>* extents, std::vector<VirtualFile::PartFn>* parts) {
  const uint64_t bytes = TensorBytes(tensor);
  if (bytes == 0) return;
  extents->push_back(Extent{base, bytes, Extent::kLazy, parts->size(), nullptr, 0});
  parts->push_back([&reader, tensor, base, prefer_worker](std::vector<Extent>* out) {
    return AppendTensorExtents(reader, tensor, base, prefer_worker, out);
  });
}

}  // namespace

ptc::Result<std::unique_ptr<VirtualFile>> MakeSafetensorsFile(const ptc::GenerationReader& reader,
                                                              const std::vector<ptc::LocalTensor>& tensors,
                                                              const std::map<std::string, std::string>& metadata,
                                                              int prefer_worker) {
  PTC_ASSIGN_OR_RETURN(std::string header, ptc::EncodeSafetensorsHeader(Specs(tensors), metadata));
  std::vector<Extent> extents = {Extent{0, header.size(), Extent::kLiteral, 0, nullptr, 0}};
  std::vector<VirtualFile::PartFn> parts;
  uint64_t pos = header.size();
  for (const ptc::LocalTensor& t : tensors) {
    AppendLazyTensor(reader, t, pos, prefer_worker, &extents, &parts);
    pos += TensorBytes(t);
  }
  return std::make_unique<VirtualFile>(std::move(header), std::move(extents), pos, std::move(parts));
}

ptc::Result<std::unique_ptr<VirtualFile>> MakeNpyFile(const ptc::GenerationReader& reader,
                                                      const ptc::LocalTensor& tensor, int prefer_worker) {
  std::string header = ptc::EncodeNpyHeader(tensor.dtype, tensor.shape);
  std::vector<Extent> extents = {Extent{0, header.size(), Extent::kLiteral, 0, nullptr, 0}};
  std::vector<VirtualFile::PartFn> parts;
  AppendLazyTensor(reader, tensor, header.size(), prefer_worker, &extents, &parts);
  const uint64_t size = header.size() + TensorBytes(tensor);
  return std::make_unique<VirtualFile>(std::move(header), std::move(extents), size, std::move(parts));
}

ptc::Status WriteVirtualFile(const VirtualFile& file, ptc::WritableFile& out, const std::string& path,
                             const std::function<void(uint64_t)>& progress) {
  std::vector<char> buf(1 << 20);
  const ShardCheck verified_when_opened = [](const ptc::ShardRecord&, uint64_t, uint64_t) { return ptc::Status::OK(); };
  for (uint64_t off = 0; off < file.size();) {
    PTC_ASSIGN_OR_RETURN(size_t n, file.Read(off, buf.size(), buf.data(), verified_when_opened), path);
    if (n == 0) return ptc::InternalError(path + ": short read");
    PTC_RETURN_IF_ERROR(out.Append(buf.data(), n), path);
    if (progress) progress(n);
    off += n;
  }
  return ptc::Status::OK();
}

}  // namespace ptcfs

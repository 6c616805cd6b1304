#include "view/dcp_file.h"

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

#include "ptc/format/zip_writer.h"

namespace ptcfs {
namespace {

// The chunk as a local tensor: its box of the global tensor, densely (in the
// key's shape: a stacked key's chunk has a leading 1); a flat key's tensor.
ptc::LocalTensor ChunkTensor(const ptc::dcp::Plan& plan, const ptc::dcp::Chunk& c) {
  if (c.flat >= 0) return plan.flats[static_cast<size_t>(c.flat)].local;
  const ptc::dcp::Tensor& t = plan.tensors[c.tensor];
  return ptc::LocalTensor{t.key, t.dtype, ptc::dcp::KeyBox(t, c.box).shape(), ptc::dcp::ChunkSegments(t, c.box)};
}

}  // namespace

ptc::Result<DcpChunkBytes> LayDcpChunk(const ptc::dcp::Plan& plan, const ptc::dcp::Chunk& c) {
  DcpChunkBytes out;
  if (c.object >= 0) {  // a pickled object: its bytes
    out.literals.emplace_back(c.offset, plan.objects[static_cast<size_t>(c.object)].bytes);
    return out;
  }
  const ptc::LocalTensor chunk = ChunkTensor(plan, c);
  PTC_ASSIGN_OR_RETURN(ptc::TorchFilePlan torch, ptc::dcp::ChunkFile(chunk.dtype, ptc::Box::Full(chunk.shape)),
                       chunk.name);
  PTC_ASSIGN_OR_RETURN(ptc::ZipLayout layout, ptc::LayoutTorchFile(torch), chunk.name);
  if (layout.size != c.size) return ptc::InternalError("a chunk of " + chunk.name + " changed size");
  for (const ptc::ZipPiece& piece : layout.pieces) {
    if (piece.size == 0) continue;
    const uint64_t at = c.offset + piece.offset;
    std::string_view bytes = piece.literal;
    if (!piece.is_literal()) {
      const auto member = static_cast<size_t>(piece.member);
      if (torch.member_storage[member] >= 0) {  // the storage (a chunk has one)
        out.storage_offset = at;
        out.storage_size = piece.size;
        continue;
      }
      bytes = std::string_view(torch.contents[member]).substr(piece.member_offset, piece.size);
    }
    if (!out.literals.empty() && out.literals.back().first + out.literals.back().second.size() == at) {
      out.literals.back().second.append(bytes);  // adjacent: one range
    } else {
      out.literals.emplace_back(at, std::string(bytes));
    }
  }
  return out;
}

ptc::Result<std::unique_ptr<VirtualFile>> MakeDcpFile(const ptc::GenerationReader& reader, const ptc::dcp::Plan& plan,
                                                      size_t file, int prefer_worker) {
  if (file >= plan.files.size()) return ptc::InternalError("no DCP file " + std::to_string(file));
  const ptc::dcp::File& f = plan.files[file];
  std::string literal;
  std::vector<Extent> extents;
  std::vector<VirtualFile::PartFn> parts;
  for (const ptc::dcp::Chunk& c : f.chunks) {
    PTC_ASSIGN_OR_RETURN(DcpChunkBytes bytes, LayDcpChunk(plan, c), f.name);
    const size_t first = extents.size();
    for (const auto& [at, text] : bytes.literals) {
      extents.push_back(Extent{at, text.size(), Extent::kLiteral, literal.size(), nullptr, 0});
      literal.append(text);
    }
    if (bytes.storage_size > 0) {
      extents.push_back(Extent{bytes.storage_offset, bytes.storage_size, Extent::kLazy, parts.size(), nullptr, 0});
      parts.push_back([&reader, tensor = ChunkTensor(plan, c), at = bytes.storage_offset,
                       prefer_worker](std::vector<Extent>* out) {
        return AppendTensorExtents(reader, tensor, at, prefer_worker, out);
      });
    }
    std::sort(extents.begin() + static_cast<std::ptrdiff_t>(first), extents.end(),
              [](const Extent& a, const Extent& b) { return a.offset < b.offset; });
  }
  return std::make_unique<VirtualFile>(std::move(literal), std::move(extents), f.size, std::move(parts));
}

}  // namespace ptcfs

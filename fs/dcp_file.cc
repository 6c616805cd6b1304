#include "fs/dcp_file.h"

#include <utility>
#include <vector>

#include "ptc/format/zip_writer.h"

namespace ptcfs {
namespace {

// The chunk as a local tensor: its box of the global tensor, densely (in the
// key's shape: a stacked key's chunk has a leading 1).
ptc::LocalTensor ChunkTensor(const ptc::dcp::Tensor& t, const ptc::Box& box) {
  return ptc::LocalTensor{t.key, t.dtype, ptc::dcp::KeyBox(t, box).shape(), ptc::dcp::ChunkSegments(t, box)};
}

}  // namespace

ptc::Result<std::unique_ptr<VirtualFile>> MakeDcpFile(const ptc::GenerationReader& reader, const ptc::dcp::Plan& plan,
                                                      size_t file, int prefer_worker) {
  if (file >= plan.files.size()) return ptc::InternalError("no DCP file " + std::to_string(file));
  const ptc::dcp::File& f = plan.files[file];
  std::string literal;
  std::vector<Extent> extents;
  std::vector<VirtualFile::PartFn> parts;
  for (const ptc::dcp::Chunk& c : f.chunks) {
    if (c.object >= 0) {  // a pickled object: its bytes
      const std::string& bytes = plan.objects[static_cast<size_t>(c.object)].bytes;
      extents.push_back(Extent{c.offset, bytes.size(), Extent::kLiteral, literal.size(), nullptr, 0});
      literal.append(bytes);
      continue;
    }
    const ptc::dcp::Tensor& t = plan.tensors[c.tensor];
    PTC_ASSIGN_OR_RETURN(ptc::TorchFilePlan torch, ptc::dcp::ChunkFile(t.dtype, ptc::dcp::KeyBox(t, c.box)), f.name);
    PTC_ASSIGN_OR_RETURN(ptc::ZipLayout layout, ptc::LayoutTorchFile(torch), f.name);
    if (layout.size != c.size) return ptc::InternalError(f.name + ": a chunk of " + t.name + " changed size");
    for (const ptc::ZipPiece& piece : layout.pieces) {
      if (piece.size == 0) continue;
      const uint64_t at = c.offset + piece.offset;
      std::string_view bytes;
      if (piece.is_literal()) {
        bytes = piece.literal;
      } else if (torch.member_storage[static_cast<size_t>(piece.member)] < 0) {
        bytes =
            std::string_view(torch.contents[static_cast<size_t>(piece.member)]).substr(piece.member_offset, piece.size);
      } else {
        extents.push_back(Extent{at, piece.size, Extent::kLazy, parts.size(), nullptr, 0});
        parts.push_back([&reader, tensor = ChunkTensor(t, c.box), at, prefer_worker](std::vector<Extent>* out) {
          return AppendTensorExtents(reader, tensor, at, prefer_worker, out);
        });
        continue;
      }
      extents.push_back(Extent{at, bytes.size(), Extent::kLiteral, literal.size(), nullptr, 0});
      literal.append(bytes);
    }
  }
  return std::make_unique<VirtualFile>(std::move(literal), std::move(extents), f.size, std::move(parts));
}

ptc::Status ExportDcp(ptc::Env* env, const ptc::Store& store, std::shared_ptr<const ptc::GenerationManifest> generation,
                      const std::string& out_dir, const ptc::ProgressFn& progress, ptc::dcp::Keys keys) {
  PTC_ASSIGN_OR_RETURN(ptc::dcp::Plan plan, ptc::dcp::PlanCheckpoint(*generation, keys));
  ptc::GenerationReader reader(store, generation, /*verify=*/true);
  PTC_ASSIGN_OR_RETURN(std::unique_ptr<ptc::OutputDir> out, env->OpenOutputDir(out_dir));
  for (size_t i = 0; i < plan.files.size(); ++i) {
    const std::string path = ptc::JoinPath(out->path(), plan.files[i].name);
    PTC_ASSIGN_OR_RETURN(std::unique_ptr<VirtualFile> file, MakeDcpFile(reader, plan, i, -1));
    PTC_ASSIGN_OR_RETURN(auto dst, out->NewWritableFile(plan.files[i].name));
    PTC_RETURN_IF_ERROR(WriteVirtualFile(*file, *dst, path, progress));
    PTC_RETURN_IF_ERROR(dst->Close(), path);
  }
  // .metadata last: a directory without it is no checkpoint.
  return ptc::WriteFileAtomic(*out, ptc::dcp::kMetadataFile, ptc::dcp::EncodeMetadata(plan));
}

}  // namespace ptcfs

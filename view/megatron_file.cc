#include "view/megatron_file.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <tuple>

#include "ptc/base/crc32.h"
#include "ptc/format/zip_writer.h"

namespace ptcfs {
namespace {

constexpr size_t kChunk = 1 << 20;

uint64_t TensorBytes(const ptc::LocalTensor& t) { return ptc::NumElements(t.shape) * ptc::DTypeSize(t.dtype); }

// One local tensor alone, as a file of its bytes.
ptc::Result<std::unique_ptr<VirtualFile>> TensorFile(const ptc::GenerationReader& reader, const ptc::LocalTensor& t,
                                                     int prefer_worker) {
  std::vector<Extent> extents;
  PTC_RETURN_IF_ERROR(AppendTensorExtents(reader, t, 0, prefer_worker, &extents));
  return std::make_unique<VirtualFile>(std::string(), std::move(extents), TensorBytes(t));
}

// The CRC-32 of bytes [offset, offset + n) of `file`, read (through `check`) into `buf`.
ptc::Result<uint32_t> ReadCrc(const VirtualFile& file, uint64_t offset, uint64_t n, const ShardCheck& check,
                              std::vector<char>& buf) {
  uint32_t crc = 0;
  for (const uint64_t end = offset + n; offset < end;) {
    PTC_ASSIGN_OR_RETURN(size_t got,
                         file.Read(offset, std::min<uint64_t>(buf.size(), end - offset), buf.data(), check));
    if (got == 0) return ptc::InternalError("short read of a tensor for its CRC-32");
    crc = ptc::Crc32(crc, buf.data(), got);
    offset += got;
  }
  return crc;
}

// The CRC-32 of extent `e` of `file` (a tensor's bytes): a run of one shard
// that recorded its block CRC-32s is composed from those of the blocks it
// covers whole, reading only the bytes of blocks it covers in part; zeros
// are computed; anything else (a strided run, a shard without block CRCs) is
// read.
ptc::Result<uint32_t> ExtentCrc(const VirtualFile& file, const Extent& e, const ShardCheck& check,
                                std::vector<char>& buf) {
  if (e.kind == Extent::kZero) return ptc::Crc32Zeros(e.end() - e.offset);
  const ptc::ShardRecord* shard = e.shard;
  if (e.kind != Extent::kShard || e.count != 1 || shard == nullptr ||
      shard->block_crc32s.size() != ptc::BlockCount(*shard) || e.file_offset < shard->offset ||
      e.file_offset - shard->offset + e.length > shard->nbytes) {
    return ReadCrc(file, e.offset, e.end() - e.offset, check, buf);
  }
  const uint64_t begin = e.file_offset - shard->offset;  // in the shard
  const uint64_t end = begin + e.length;
  uint32_t crc = 0;
  for (uint64_t pos = begin; pos < end;) {
    const size_t block = ptc::BlockOf(*shard, pos);
    const uint64_t stop = std::min(end, ptc::BlockEnd(*shard, block));
    uint32_t part;
    if (pos == ptc::BlockBegin(*shard, block) && stop == ptc::BlockEnd(*shard, block)) {
      part = shard->block_crc32s[block];
    } else {
      PTC_ASSIGN_OR_RETURN(part, ReadCrc(file, e.offset + (pos - begin), stop - pos, check, buf));
    }
    crc = ptc::Crc32Combine(crc, part, stop - pos);
    pos = stop;
  }
  return crc;
}

std::vector<ptc::TorchStorageSpec> StorageSpecs(const ptc::megatron::RankState& state) {
  std::vector<ptc::TorchStorageSpec> specs;
  for (const auto& s : state.storages) {
    if (s.tensor != nullptr) {
      specs.push_back({s.key, s.tensor->dtype, static_cast<uint64_t>(ptc::NumElements(s.tensor->shape)), 0});
    } else {
      specs.push_back({s.key, s.carried->dtype, s.carried->numel, 0});
    }
  }
  return specs;
}

}  // namespace

ptc::Result<MegatronFilePlan> PlanMegatronFile(const ptc::ModelSpec& spec, const ptc::ParallelConfig& config,
                                               const ptc::RankView& view, const ptc::megatron::MegatronState& state,
                                               ptc::megatron::NameSet names) {
  MegatronFilePlan plan;
  PTC_ASSIGN_OR_RETURN(plan.state, ptc::megatron::BuildRankState(spec, config, view, state, names));
  PTC_ASSIGN_OR_RETURN(plan.torch, ptc::PlanTorchFile(kMegatronArchive, plan.state.root, StorageSpecs(plan.state)));
  PTC_ASSIGN_OR_RETURN(ptc::ZipLayout layout, ptc::LayoutTorchFile(plan.torch));
  plan.size = layout.size;
  return plan;
}

ptc::Result<std::vector<uint32_t>> StorageCrcs(const ptc::GenerationReader& reader, const MegatronFilePlan& plan,
                                               int prefer_worker, const ShardCheck& check) {
  std::vector<uint32_t> crcs;
  std::vector<char> buf(kChunk);
  for (const auto& storage : plan.state.storages) {
    if (storage.carried != nullptr) {
      crcs.push_back(ptc::Crc32(0, storage.carried->bytes.data(), storage.carried->bytes.size()));
      continue;
    }
    std::vector<Extent> extents;
    PTC_RETURN_IF_ERROR(AppendTensorExtents(reader, *storage.tensor, 0, prefer_worker, &extents));
    const VirtualFile file(std::string(), extents, TensorBytes(*storage.tensor));
    uint32_t crc = 0;
    for (const Extent& e : extents) {
      PTC_ASSIGN_OR_RETURN(const uint32_t part, ExtentCrc(file, e, check, buf));
      crc = ptc::Crc32Combine(crc, part, e.end() - e.offset);
    }
    crcs.push_back(crc);
  }
  return crcs;
}

ptc::Result<MegatronFileBytes> LayMegatronFile(const MegatronFilePlan& plan, const std::vector<uint32_t>& crcs) {
  ptc::TorchFilePlan torch = plan.torch;
  if (crcs.size() != torch.storage_members.size()) return ptc::InternalError("one CRC per storage expected");
  for (size_t i = 0; i < crcs.size(); ++i) torch.members[torch.storage_members[i]].crc32 = crcs[i];
  PTC_ASSIGN_OR_RETURN(ptc::ZipLayout layout, ptc::LayoutTorchFile(torch));
  MegatronFileBytes out;
  out.size = layout.size;
  auto add_literal = [&](uint64_t offset, std::string_view bytes) {
    MegatronFilePart* last = out.parts.empty() ? nullptr : &out.parts.back();
    if (last != nullptr && last->tensor == nullptr && last->offset + last->literal.size() == offset) {
      last->literal.append(bytes);
    } else {
      out.parts.push_back({offset, std::string(bytes), nullptr});
    }
  };
  for (const ptc::ZipPiece& piece : layout.pieces) {
    if (piece.size == 0) continue;
    if (piece.is_literal()) {
      add_literal(piece.offset, piece.literal);
      continue;
    }
    const size_t member = static_cast<size_t>(piece.member);
    const int64_t storage = torch.member_storage[member];
    if (storage < 0) {
      add_literal(piece.offset, std::string_view(torch.contents[member]).substr(piece.member_offset, piece.size));
      continue;
    }
    const auto& s = plan.state.storages[static_cast<size_t>(storage)];
    if (s.carried != nullptr) {
      add_literal(piece.offset, std::string_view(s.carried->bytes).substr(piece.member_offset, piece.size));
      continue;
    }
    if (piece.member_offset != 0 || piece.size != TensorBytes(*s.tensor)) {
      return ptc::InternalError("a storage member split across zip pieces");
    }
    out.parts.push_back({piece.offset, {}, s.tensor});
  }
  return out;
}

ptc::Result<std::unique_ptr<VirtualFile>> MakeMegatronFile(const ptc::GenerationReader& reader,
                                                           const MegatronFilePlan& plan,
                                                           const std::vector<uint32_t>& crcs, int prefer_worker) {
  PTC_ASSIGN_OR_RETURN(MegatronFileBytes bytes, LayMegatronFile(plan, crcs));
  std::string literal;
  std::vector<Extent> extents;
  for (const MegatronFilePart& part : bytes.parts) {
    if (part.tensor != nullptr) {
      PTC_RETURN_IF_ERROR(AppendTensorExtents(reader, *part.tensor, part.offset, prefer_worker, &extents));
      continue;
    }
    extents.push_back(Extent{part.offset, part.literal.size(), Extent::kLiteral, literal.size(), nullptr, 0});
    literal.append(part.literal);
  }
  return std::make_unique<VirtualFile>(std::move(literal), std::move(extents), bytes.size);
}

std::vector<size_t> MegatronRanks(const std::vector<ptc::RankView>& views) {
  // (pp, tp, ep) -> view of the lowest expert-data-parallel index (for a
  // dense model, the lowest dp then cp index)
  std::map<std::tuple<int, int, int>, size_t> first;
  for (size_t i = 0; i < views.size(); ++i) {
    const ptc::RankCoords& c = views[i].coords;
    auto [it, inserted] = first.try_emplace({c.pp, c.tp, c.ep}, i);
    const ptc::RankCoords& was = views[it->second].coords;
    if (!inserted && std::tie(was.edp, was.dp, was.cp) > std::tie(c.edp, c.dp, c.cp)) it->second = i;
  }
  std::vector<size_t> out;
  for (const auto& [key, index] : first) out.push_back(index);
  std::sort(out.begin(), out.end(), [&](size_t a, size_t b) { return views[a].rank < views[b].rank; });
  return out;
}

std::string MegatronRankDir(const ptc::RankView& view, const ptc::ParallelConfig& config) {
  return ptc::megatron::RankDirName(view.coords.tp, view.coords.pp, config.pp, view.coords.ep, config.ep);
}

ptc::Result<std::vector<ptc::RankView>> MegatronTreeViews(const ptc::ModelLayout& layout) {
  PTC_RETURN_IF_ERROR(ptc::megatron::CheckLegacySave(layout.config()));
  std::vector<ptc::RankView> views;
  for (int rank = 0; rank < layout.config().world_size(); ++rank) {
    PTC_ASSIGN_OR_RETURN(ptc::RankView view, layout.View(rank));
    views.push_back(std::move(view));
  }
  std::vector<ptc::RankView> tree;
  for (size_t v : MegatronRanks(views)) tree.push_back(std::move(views[v]));
  return tree;
}

ptc::Status WriteMegatronFile(const ptc::GenerationReader& reader, const MegatronFilePlan& plan, ptc::OutputDir& dir,
                              const ptc::ProgressFn& progress) {
  const std::string path = ptc::JoinPath(dir.path(), ptc::megatron::kRankFile);
  std::vector<std::unique_ptr<VirtualFile>> tensors(plan.state.storages.size());
  auto read = [&](size_t storage, uint64_t offset, size_t n, void* dst) -> ptc::Status {
    const auto& s = plan.state.storages[storage];
    if (s.carried != nullptr) {
      std::memcpy(dst, s.carried->bytes.data() + offset, n);
      return ptc::Status::OK();
    }
    if (!tensors[storage]) {
      PTC_ASSIGN_OR_RETURN(tensors[storage], TensorFile(reader, *s.tensor, -1));
    }
    PTC_ASSIGN_OR_RETURN(size_t got,
                         tensors[storage]->Read(offset, n, dst, [](const ptc::ShardRecord&, uint64_t, uint64_t) {
                           return ptc::Status::OK();  // the reader verifies each shard when it opens it
                         }));
    if (got != n) return ptc::InternalError(path + ": short tensor read");
    if (progress) progress(n);
    return ptc::Status::OK();
  };
  PTC_ASSIGN_OR_RETURN(auto file, dir.NewWritableFile(std::string(ptc::megatron::kRankFile)));
  PTC_RETURN_IF_ERROR(
      ptc::WriteTorchFile(*file, kMegatronArchive, plan.state.root, StorageSpecs(plan.state), read, path));
  return file->Close().WithContext(path);
}

}  // namespace ptcfs

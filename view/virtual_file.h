// Virtual files: a file of the mount rendered on read from stored shards.
//
// A VirtualFile is a list of extents tiling [0, size): literal bytes (a
// safetensors or npy header), zeros (ZeRO padding), or a byte range of one
// stored shard file. A read of [a, b) copies literals and preads shard
// ranges; a read that falls inside one shard extent can be handed to the
// kernel as a file-descriptor buffer (splice) instead. Nothing is rendered
// whole in memory: the extents are metadata. A tensor's extents are built
// when a read first reaches it (a lazy extent), so opening a file costs
// its header, not a walk over every shard it reads from.
//
// Thread safety: Read and SingleShardRange may run concurrently (a lazy
// extent is built once).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ptc/model/view.h"
#include "ptc/store/rank_files.h"
#include "ptc/store/store_reader.h"

namespace ptcfs {

// Bytes [offset, end()) of a virtual file: `count` pieces of `length` bytes,
// one after another. A kShard extent of several pieces is a strided run of a
// shard file (the rows of a column slice): piece i is at file_offset + i * stride.
struct Extent {
  uint64_t offset = 0;  // in the virtual file
  uint64_t length = 0;  // of each piece
  enum Kind { kLiteral, kZero, kShard, kLazy } kind = kZero;
  uint64_t literal = 0;                         // kLiteral: offset into the literal bytes; kLazy: part index
  const ptc::RandomAccessFile* file = nullptr;  // kShard
  uint64_t file_offset = 0;                     // kShard: of piece 0
  const ptc::ShardRecord* shard = nullptr;      // kShard: the record, for checksum checks
  uint64_t count = 1;                           // > 1 only for kShard
  uint64_t stride = 0;                          // kShard with count > 1

  uint64_t end() const { return offset + count * length; }
};

// Checks bytes [offset, offset + n) of a shard before they are served (the
// checksums of the blocks that hold them).
using ShardCheck = std::function<ptc::Status(const ptc::ShardRecord&, uint64_t offset, uint64_t n)>;

class VirtualFile {
 public:
  // Builds the extents that tile the bytes of one kLazy extent.
  using PartFn = std::function<ptc::Status(std::vector<Extent>*)>;

  // `parts[i]` builds the kLazy extent whose `literal` is i.
  VirtualFile(std::string literal, std::vector<Extent> extents, uint64_t size, std::vector<PartFn> parts = {});

  uint64_t size() const { return size_; }

  // Copies [offset, offset + n) clipped to the file into dst; returns bytes
  // copied. Every shard range touched passes `check` first.
  // \error as `check`, RandomAccessFile::Read (naming the shard file) and a lazy extent's PartFn.
  ptc::Result<size_t> Read(uint64_t offset, size_t n, void* dst, const ShardCheck& check) const;

  // When [offset, offset + n) lies inside one shard extent: its descriptor
  // and position, for a zero-copy reply. Otherwise (or when a lazy extent
  // fails to build: Read reports it) fd = -1.
  struct FdRange {
    int fd = -1;
    uint64_t position = 0;
    const ptc::ShardRecord* shard = nullptr;
  };
  FdRange SingleShardRange(uint64_t offset, size_t n) const;

  // The stored files (relative to the store root) whose bytes at this file's
  // offsets are this file's tensor bytes (a rank file of a compacted
  // generation: view/rank_files.h): each tensor byte there either in its
  // stored piece or in a copy of it (`copies`, by piece), so that a reader
  // may read one of them instead (FUSE passthrough) if CheckVerbatim agrees
  // (several files may hold the same bytes at the same offsets, data-parallel
  // replicas, with different headers). Empty when there is none. Builds every
  // lazy extent; reads nothing.
  // \error as a lazy extent's PartFn.
  ptc::Result<std::vector<std::string>> VerbatimFiles(
      const std::map<const ptc::ShardRecord*, std::vector<ptc::CopyPlace>>& copies) const;
  // That `file` (from VerbatimFiles) holds this file: the literal ranges
  // (headers; a torch file's zip records and pickle) and zero ranges read
  // from it and compared (as far as it reaches), and its size.
  // \error Corruption when the bytes differ (another file's), else IOError
  //        when its size differs (naming both: damaged); as RandomAccessFile::Read.
  ptc::Status CheckVerbatim(const ptc::RandomAccessFile& file) const;

 private:
  struct Part {
    PartFn build;
    std::once_flag once;
    ptc::Status status;
    std::vector<Extent> extents;  // tiling the lazy extent's bytes
  };
  // The extents of a kLazy extent, built on first use.
  ptc::Result<const std::vector<Extent>*> PartExtents(const Extent& lazy) const;
  ptc::Result<size_t> ReadExtents(const std::vector<Extent>& list, uint64_t offset, size_t n, unsigned char* out,
                                  const ShardCheck& check) const;
  // Copies [offset, offset + n) (inside `e`, a strided kShard extent of short
  // pieces) into out, reading the file a window of pieces at a time.
  ptc::Status ReadGathered(const Extent& e, uint64_t offset, size_t n, unsigned char* out,
                           const ShardCheck& check) const;
  // Copies the bytes from `offset` (in `e`, a kShard extent) that the short
  // pieces of `e` and of the extents after it in one shard file hold, at most
  // a window of them and `n`, reading the file as the few contiguous runs the
  // pieces come from. 0: not worth it (fewer pieces than runs, or few).
  ptc::Result<size_t> ReadBatched(const Extent* e, const Extent* end, uint64_t offset, size_t n, unsigned char* out,
                                  const ShardCheck& check) const;

  std::string literal_;
  std::vector<Extent> extents_;  // sorted, tiling [0, size_)
  uint64_t size_;
  std::vector<std::unique_ptr<Part>> parts_;
};

// Writes the whole of `file` into `out` (named `path` in errors), calling
// `progress` with each block's bytes. Shard ranges are not checked here:
// for a GenerationReader that verifies, each shard was checked when opened.
// \error as VirtualFile::Read and WritableFile::Append, naming `path`.
ptc::Status WriteVirtualFile(const VirtualFile& file, ptc::WritableFile& out, const std::string& path,
                             const std::function<void(uint64_t)>& progress);

// The bytes a local tensor occupies in the virtual file, mapped onto shards.
// Appends extents for `tensor` placed at virtual offset `base`.
// \error as GenerationReader::Cover / File (Corruption for a shard whose checksum fails).
ptc::Status AppendTensorExtents(const ptc::GenerationReader& reader, const ptc::LocalTensor& tensor, uint64_t base,
                                int prefer_worker, std::vector<Extent>* out);

// A rank's safetensors file of `tensors` (model or optimizer part), each tensor
// a lazy extent. `reader` must outlive the file.
// \error as EncodeSafetensorsHeader; a tensor's errors come with the reads that reach it.
ptc::Result<std::unique_ptr<VirtualFile>> MakeSafetensorsFile(const ptc::GenerationReader& reader,
                                                              const std::vector<ptc::LocalTensor>& tensors,
                                                              const std::map<std::string, std::string>& metadata,
                                                              int prefer_worker);
// One tensor as a .npy file, as MakeSafetensorsFile.
ptc::Result<std::unique_ptr<VirtualFile>> MakeNpyFile(const ptc::GenerationReader& reader,
                                                      const ptc::LocalTensor& tensor, int prefer_worker);

// Sizes without building extents (for stat before any read).
ptc::Result<uint64_t> SafetensorsFileSize(const std::vector<ptc::LocalTensor>& tensors,
                                          const std::map<std::string, std::string>& metadata);
uint64_t NpyFileSize(const ptc::LocalTensor& tensor);

}  // namespace ptcfs

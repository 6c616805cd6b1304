// The chunk files of a DCP checkpoint (ptc/checkpoint/dcp/dcp.h) rendered from the
// store: the mount's dcp/ and `ptcfs export --format dcp`.
//
// A chunk is a torch.save file of one box of a global tensor; its storage
// member is the box's bytes, read from the stored piece it was cut from (or a
// replica of it, the preferred worker's first). The zip records around it are
// literals; the storage's CRC is 0, as torch writes it with CRC-32 off, so no
// tensor byte is read before a reader asks for it.
//
// Thread safety: pure functions, and reads of the store.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ptc/base/env.h"
#include "ptc/checkpoint/checkpoint.h"
#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/store/store.h"
#include "ptc/store/store_reader.h"
#include "view/virtual_file.h"

namespace ptcfs {

// Where the bytes of chunk `c` of `plan` lie in its file: literal ranges (zip
// records, the pickle and the other small members; an object's bytes), each
// at its file offset, and the range of its tensor's storage (0 bytes for an
// object or an empty box).
struct DcpChunkBytes {
  std::vector<std::pair<uint64_t, std::string>> literals;
  uint64_t storage_offset = 0;
  uint64_t storage_size = 0;
};
// \error as ChunkFile and LayoutTorchFile; InternalError when the layout's
//        size is not the chunk's.
ptc::Result<DcpChunkBytes> LayDcpChunk(const ptc::dcp::Plan& plan, const ptc::dcp::Chunk& c);

// File `file` of `plan`, each chunk's storage a lazy extent. `reader` and
// `plan` must outlive the file.
// \error as ChunkFile and LayoutTorchFile; a chunk's read errors come with the reads that reach it.
ptc::Result<std::unique_ptr<VirtualFile>> MakeDcpFile(const ptc::GenerationReader& reader, const ptc::dcp::Plan& plan,
                                                      size_t file, int prefer_worker);

}  // namespace ptcfs

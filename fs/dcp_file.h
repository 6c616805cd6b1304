// The chunk files of a DCP checkpoint (ptc/checkpoint/dcp.h) rendered from the
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

#include <memory>
#include <string>

#include "fs/virtual_file.h"
#include "ptc/base/env.h"
#include "ptc/checkpoint/checkpoint.h"
#include "ptc/checkpoint/dcp.h"
#include "ptc/store/store.h"
#include "ptc/store/store_reader.h"

namespace ptcfs {

// File `file` of `plan`, each chunk's storage a lazy extent. `reader` and
// `plan` must outlive the file.
// \error as ChunkFile and LayoutTorchFile; a chunk's read errors come with the reads that reach it.
ptc::Result<std::unique_ptr<VirtualFile>> MakeDcpFile(const ptc::GenerationReader& reader, const ptc::dcp::Plan& plan,
                                                      size_t file, int prefer_worker);

// `ptcfs export --format dcp`: OUT/.metadata and OUT/__W_0.distcp of the generation
// (keys as `keys` says: Megatron-Core's are the DCP part of a torch_dist directory).
// \error as PlanCheckpoint, the store reads and the Env (naming the file).
ptc::Status ExportDcp(ptc::Env* env, const ptc::Store& store, std::shared_ptr<const ptc::GenerationManifest> generation,
                      const std::string& out_dir, const ptc::ProgressFn& progress = {},
                      ptc::dcp::Keys keys = ptc::dcp::Keys::kTorch);

}  // namespace ptcfs

// The files of a Hugging Face model (ptc/checkpoint/hf/hf.h) rendered from the
// store: the mount's hf/ and `ptcfs export --format hf`.
//
// A shard is a safetensors file whose tensors are HF's (q_proj, gate_proj,
// ...), each a LocalTensor of boxes of the global tensors: its bytes are read
// from the stored pieces that hold those boxes (the preferred worker's first),
// nothing is assembled in memory. config.json and the index are literals.
//
// Thread safety: pure functions, and reads of the store.
#pragma once

#include <memory>
#include <string>

#include "ptc/base/env.h"
#include "ptc/checkpoint/checkpoint.h"
#include "ptc/checkpoint/hf/hf.h"
#include "ptc/store/store.h"
#include "ptc/store/store_reader.h"
#include "view/virtual_file.h"

namespace ptcfs {

// The plan of the generation `m`: its model (SpecFromManifest), config.json
// carried from its import (extra["hf"]["config"]) with the model's sizes.
// \error as SpecFromManifest and PlanExport.
ptc::Result<ptc::hf::Plan> PlanHf(const ptc::GenerationManifest& m, uint64_t max_shard_bytes);

// Shard `shard` of `plan`, each tensor a lazy extent. `reader` must outlive the file.
// \error as EncodeSafetensorsHeader; a tensor's read errors come with the reads that reach it.
ptc::Result<std::unique_ptr<VirtualFile>> MakeHfShardFile(const ptc::GenerationReader& reader,
                                                          const ptc::hf::Plan& plan, size_t shard, int prefer_worker);
// Its size, without building extents.
// \error as EncodeSafetensorsHeader.
ptc::Result<uint64_t> HfShardFileSize(const ptc::hf::Plan& plan, size_t shard);

}  // namespace ptcfs

// `ptcfs export`: the committed generation of a store as a per-rank
// checkpoint of any parallel config, in safetensors or npy.
//
// Every tensor is read from the stored shards (checksums verified on first
// use); each rank's files are written one local tensor at a time. The output
// directory must not exist or be empty; on failure it is removed again. Every
// file is created new in its directory (Env::OpenOutputDir): a symbolic link
// planted in the tree while it is written is refused, never followed.
#pragma once

#include <functional>
#include <string>

#include "ptc/checkpoint/checkpoint.h"
#include "ptc/store/store.h"

namespace ptc {

// `layout`: the store's model (SpecFromManifest) in the config to export.
// \error InvalidArgument when out_dir exists and is not empty; as
//        CheckCheckpointWrite; as GenerationReader::Read (Corruption for a bad
//        shard); as WriteRankCheckpoint.
Status ExportCheckpoint(const Store& store, const ModelLayout& layout, const std::string& out_dir,
                        CheckpointFormat format, const ProgressFn& progress = {});
// The same in `config`, the store's model checked against it here.
// \error FailedPrecondition for a store without a generation; as SpecFromManifest and ModelLayout::Make.
Status ExportCheckpoint(const Store& store, const ParallelConfig& config, const std::string& out_dir,
                        CheckpointFormat format, const ProgressFn& progress = {});

// Runs `write` to fill `out_dir`, which must not exist or be empty; on failure
// removes what it wrote (an empty directory that existed stays).
// \error InvalidArgument when out_dir exists and is not empty; as `write`.
Status WriteFreshDirectory(Env* env, const std::string& out_dir, const std::function<Status()>& write);

}  // namespace ptc

// The generation manifest a store holding a model in one layout would have,
// without the data: for planning from model dims and a config alone
// (`ptcfs plan --from`), at the size of real jobs.
//
// Pure function; thread-compatible.
#pragma once

#include "ptc/base/status.h"
#include "ptc/model/model_layout.h"
#include "ptc/store/manifest.h"

namespace ptc::transform {

// Generation 1 of `layout`: the model described (DescribeModel: schema, dims,
// config, tensor table) and one stored shard per TargetShardKeys entry (each
// worker's pieces, replicas included), as an import or a compaction would
// write them, with made-up file names, offsets and checksums (one per 4 MiB
// block, so that EncodeManifest gives a manifest of the real size). No file
// exists for it: plan with it, never execute.
// \error as TargetShardKeys and DescribeModel.
Result<GenerationManifest> LayoutManifest(const ModelLayout& layout);

}  // namespace ptc::transform

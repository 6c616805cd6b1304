// What `ptcfs verify` checks beyond the shard bytes: that the current
// generation can be served in its config.
#pragma once

#include <string>
#include <vector>

#include "ptc/store/manifest.h"

namespace ptcfs::worker {

// The problems that keep generation `m` from being served in its own config,
// one line each (empty: none). Checked: the schema, dims and config parse and
// the config partitions the model; the tensor table is exactly the tensors the
// schema and dims give (names, dtypes, shapes); and on every worker the config
// has, the shards of that worker cover every region its ranks read.
// A generation that holds no tensors (only a dataset) has none of these.
std::vector<std::string> ServingProblems(const ptc::GenerationManifest& m);

}  // namespace ptcfs::worker

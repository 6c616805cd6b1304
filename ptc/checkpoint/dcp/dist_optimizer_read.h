// The bucket states of Megatron-Core's DistributedOptimizer in a torch_dist
// save (its dp_reshardable form, megatron/dp_reshardable_save.h) read as
// pieces of the store's optimizer tensors (docs/megatron_format.md, "The
// distributed optimizer in torch_dist"): each run of a chunk that holds a box
// of a parameter's state is one piece of the chunk's bytes.
//
// Thread safety: pure functions, and the reads `bytes` makes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ptc/base/env.h"
#include "ptc/base/status.h"
#include "ptc/checkpoint/dcp/read.h"
#include "ptc/checkpoint/megatron/dist_optimizer.h"
#include "ptc/checkpoint/megatron/names.h"
#include "ptc/format/pickle.h"
#include "ptc/model/config.h"
#include "ptc/model/view.h"

namespace ptc::dcp {

// Whether `key` is one of the form's ([chained_k.]optimizer.distributed.*).
bool DistributedOptimizerKey(std::string_view key);

// Where the tensor bytes of chunk `c` of `t` lie: (index into the source's
// files, byte offset); nullopt when its file is another worker's.
using ChunkBytesFn =
    std::function<Result<std::optional<std::pair<size_t, uint64_t>>>(const SavedTensor& t, const SavedChunk& c)>;

// The pieces of the save's bucket keys `buckets` into source->chunks, checked
// against `layout` (LayOutDpReshardable of the save's model in the config
// `config` names): every key the layout's and every key of the layout saved,
// float32 of its [numel_unpadded], its chunks tiling it.
// \error InvalidArgument naming `what` and the key: a key the layout does not
//        have (several buckets or buffers named as such), a missing key, a
//        dtype or size other than the layout's, elements no chunk holds or
//        two do; as `bytes`.
Status AddBucketChunks(const std::vector<SavedTensor>& buckets, const megatron::DpReshardableLayout& layout,
                       const std::string& config, const ChunkBytesFn& bytes, const std::string& what,
                       DcpSource* source);

// The save's ShardedObjects of the form (groups, step, bucket sizes) in
// `dir` (a torch_dist save's directory; its .metadata and the files at hand:
// in a job this worker's) checked against the layout of `spec` (with the
// save's parameter dtype and optimizer state) in `config` and the
// registration order of `names`, and made into common.pt's 'optimizer' entry
// (megatron::DpReshardableSavedCommon) that ReadMcoreOptimizerCommon reads.
// \error as ReadMetadata, ParseMetadata, ModelLayout::Make,
//        LayOutDpReshardable and DpReshardableSavedCommon; InvalidArgument
//        naming the key of an object that is missing, has no storage record,
//        lies past its file's end or is no torch.save([object]).
Result<pickle::Value> ReadDpReshardableCommon(Env* env, const std::string& dir, const ModelSpec& spec,
                                              const ParallelConfig& config, megatron::NameSet names);

}  // namespace ptc::dcp

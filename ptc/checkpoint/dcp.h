// PyTorch Distributed Checkpoint (DCP) of a generation: what
// `torch.distributed.checkpoint.load(state_dict, checkpoint_id=DIR)` reads
// with its default FileSystemReader (docs/dcp_format.md):
//
//   DIR/.metadata          a pickle of torch.distributed.checkpoint.metadata.Metadata
//   DIR/__W_0.distcp       the chunks of the pieces stored on worker W, one
//                          after another, each a torch.save file of one tensor
//
// Chunks are cut where the stored pieces are cut: every box of every stored
// piece, replicas once, so DCP's load planner reads of each chunk only what a
// loading rank needs, at any world size and sharding. The plan is a function
// of the generation's manifest alone, so every worker's mount shows the same
// checkpoint.
//
// Keys (how torch flattens {"model": model.state_dict(), "optim": optimizer
// state by parameter name}):
//   parameter P                 model.P
//   P.exp_avg, P.exp_avg_sq     optim.state.P.exp_avg, optim.state.P.exp_avg_sq
//   P.fp32 (the fp32 master)    optim.state.P.fp32
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ptc/base/status.h"
#include "ptc/format/torch_file.h"
#include "ptc/model/box.h"
#include "ptc/model/dtype.h"
#include "ptc/store/manifest.h"

namespace ptc::dcp {

inline constexpr const char* kMetadataFile = ".metadata";

struct Tensor {
  std::string name;               // the global tensor
  std::string key;                // its DCP key (above)
  std::vector<std::string> path;  // the key's path in the nested state dict ("optim", "state", P, "exp_avg")
  DType dtype = DType::kF32;
  Shape shape;
};

struct Chunk {
  size_t tensor = 0;    // index into Plan::tensors
  Box box;              // of the global tensor
  uint64_t offset = 0;  // of its torch.save bytes in the file
  uint64_t size = 0;
};

struct File {
  std::string name;           // "__W_0.distcp"
  std::vector<Chunk> chunks;  // by offset
  uint64_t size = 0;
};

struct Plan {
  std::vector<Tensor> tensors;  // in manifest order
  std::vector<File> files;      // by worker
};

// The DCP key of every global tensor of `m`, and where `m`'s stored pieces are.
// \error InvalidArgument naming the tensor when its pieces overlap in a way no
//        disjoint choice of their boxes resolves or leave part of it uncovered,
//        or when a key repeats.
Result<Plan> PlanCheckpoint(const GenerationManifest& m);

// Disjoint boxes covering what `stored` covers, each with the index of the
// stored box it is part of: a box that does not meet an earlier one is kept
// whole, one already covered is dropped (a replica), and of one partly
// covered the uncovered rest is kept as smaller boxes.
std::vector<std::pair<Box, size_t>> DisjointBoxes(const std::vector<Box>& stored);

// The torch.save file of one chunk: a tensor of `box`'s shape in `dtype`, its
// storage (key "0", CRC 0: as torch writes with
// torch.serialization.set_crc32_options(False)) supplied by the caller.
// \error as PlanTorchFile.
Result<TorchFilePlan> ChunkFile(DType dtype, const Box& box);

// The .metadata pickle of `plan`.
std::string EncodeMetadata(const Plan& plan);

}  // namespace ptc::dcp

// Reading a PyTorch DCP checkpoint that torch wrote (`dcp.save` with the
// default FileSystemWriter): its .metadata, and the chunk files it points at
// (docs/dcp_format.md, "Importing").
//
// ParseMetadata reads the pickle with ptcfs's restricted unpickler (DCP's
// metadata classes are on its allowlist, kept opaque; nothing runs) and takes
// out what a store needs: per key the dtype, the global shape and the chunks
// (box, file, byte range). ImportDcp checks every chunk against the model
// before the store is touched and writes each chunk as one stored piece.
//
// Thread safety: pure functions, and reads of the Env.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ptc/base/env.h"
#include "ptc/base/status.h"
#include "ptc/checkpoint/checkpoint.h"
#include "ptc/checkpoint/dcp/dcp.h"
#include "ptc/checkpoint/import.h"
#include "ptc/checkpoint/megatron/megatron.h"
#include "ptc/checkpoint/megatron/names.h"
#include "ptc/model/box.h"
#include "ptc/model/config.h"
#include "ptc/model/dtype.h"
#include "ptc/model/model_layout.h"
#include "ptc/store/generation_writer.h"
#include "ptc/store/model_spec.h"

namespace ptc::dcp {

struct SavedChunk {
  Box box;           // of the global tensor
  std::string file;  // relative_path: a file name in the checkpoint directory
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct SavedTensor {
  std::string key;
  DType dtype = DType::kF32;
  Shape shape;
  std::vector<SavedChunk> chunks;
};

// A BytesStorageMetadata entry: a pickled object's torch.save bytes.
struct SavedBytes {
  std::string key;
  std::string file{};  // empty: the metadata has no storage record for it
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct SavedCheckpoint {
  std::vector<SavedTensor> tensors;  // in the metadata's order
  std::vector<SavedBytes> bytes;
};

// Whether no two chunks of `t` share an element (empty chunks hold none).
// Row blocks, column blocks and grids of chunks (what DCP's planners write)
// cost O(n log n) to O(n sqrt n), not the O(n^2) of comparing every pair
// (bench/RESULTS.md, "DCP chunk check").
// \error InvalidArgument "WHAT: key K, chunk BOX (...) overlaps chunk BOX".
Status CheckChunksDisjoint(const SavedTensor& t, const std::string& what);

// \error InvalidArgument naming `what` and the entry at fault: a pickle the
//        unpickler refuses (a global off the allowlist among them); a root
//        that is not a Metadata; a tensor entry without its properties, size
//        or chunks, of a dtype ptcfs does not carry, with a chunk whose
//        offsets and sizes do not fit its size; a chunk without its storage
//        record, or a storage record whose file is not a plain name, or
//        carries transforms (compression, ...).
Result<SavedCheckpoint> ParseMetadata(std::string_view data, const std::string& what);

// The store tensor of a DCP key (the inverse of the rule in dcp.h): "model.P"
// -> P, "optim.state.P.K" -> "P.K" for K in exp_avg, exp_avg_sq, fp32. Empty
// for another key.
std::string TensorOfKey(const std::string& key);

// The bytes of one entry SavedOptimizer reads (a step's chunk, a param
// group's setting) where its file holds them: what a cluster worker carries
// of the save's files written on it to the others (docs/cluster.md).
struct EntryBytes {
  std::string file;
  uint64_t file_size = 0;
  uint64_t offset = 0;
  std::string bytes;
  friend bool operator==(const EntryBytes&, const EntryBytes&) = default;
};

// An entry of a DCP save that is neither a tensor of the model nor Adam's:
// torchtitan's train_state, lr_scheduler and dataloader, or any other object
// a save holds (a BytesStorageMetadata entry). The store keeps its bytes as
// saved (dcp/entries.h) and dcp/ shows it again, so that a job resumes whole.
struct CarriedEntry {
  std::string key;
  bool scalar = false;        // a tensor of `dtype` (0-dim but for `shape`), else an object
  DType dtype = DType::kF32;  // of a scalar
  std::string bytes;          // its torch.save bytes, as the save's file held them
  Shape shape{};              // of a carried tensor with dims (torchtitan's expert_bias_E), in one chunk
  friend bool operator==(const CarriedEntry&, const CarriedEntry&) = default;
};

// What a cluster worker's part of a save knows of Adam's steps and the param
// groups: the save's entries, the model's keys, and the bytes of the entries
// in the worker's files (PartsOptimizer reads them with the other parts').
struct OptimizerPart {
  std::shared_ptr<const SavedCheckpoint> saved;
  std::vector<Tensor> model;
  Keys keys = Keys::kTorch;
  std::vector<EntryBytes> entries;
};

// A DCP checkpoint checked against a model, ready to write into a store.
struct DcpSource {
  ModelLayout layout;  // the model (the save's dtype and optimizer state) in the config asked for
  std::vector<std::unique_ptr<RandomAccessFile>> files;
  struct Chunk {
    std::string tensor;  // the store's
    DType dtype = DType::kF32;
    Box box;
    size_t file = 0;      // index into files
    uint64_t offset = 0;  // of the chunk's tensor bytes (dense) in the file
    uint64_t size = 0;
    // Empty: the bytes are `box`, densely. Else they hold these boxes of
    // `tensor` where their layouts say (rows woven: torchtitan's RoPE order),
    // stored as one piece of the boxes, densely in order.
    std::vector<Segment> woven{};
  };
  std::vector<Chunk> chunks;            // in the model's key order
  std::vector<std::string> file_names;  // per files: its name in the checkpoint directory
  std::set<std::string> all_files;      // OpenDcpPart: every file the metadata names
  // Adam's steps and the param groups the save holds (SavedOptimizer), which
  // WriteDcp keeps in the manifest; none when it holds neither, or for a part.
  std::optional<megatron::OptimizerMeta> optimizer{};
  // A part's (OpenDcpPart with `part`, but kMegatronCore, whose common.pt
  // holds them).
  std::optional<OptimizerPart> optimizer_part{};
  // The save's other entries (SavedEntries), which WriteDcp keeps in the
  // manifest; none for a part (PartsEntries reads them from every part's).
  std::vector<CarriedEntry> entries{};
};

// Adam's steps and the param groups of a kTorch or kTorchtitan save, as the
// store keeps them (megatron::OptimizerMeta, rendered back by
// OptimizerObjects): each parameter's step (a 0-dim tensor or a number; the
// keys of one global tensor, torchtitan's wq, wk and wv, must agree), and the
// groups' settings as Megatron's: one group, or two split as Megatron splits
// them (weight decay for 2-D parameters, none for 1-D ones and biases).
// `model`: the model's keys (NameTensors, TorchtitanTensors); `open` gives a
// file of the checkpoint by name. nullopt when the save holds neither.
// \error InvalidArgument naming the key: a step that is no number or one-element
//        tensor, steps of one global tensor that differ, a group entry that
//        does not unpickle, groups ptcfs cannot keep as Megatron's (named).
Result<std::optional<megatron::OptimizerMeta>> SavedOptimizer(
    const SavedCheckpoint& saved, const std::vector<Tensor>& model, Keys keys,
    const std::function<Result<const RandomAccessFile*>(const std::string& file)>& open, const std::string& what);

// Whether SavedOptimizer may read entry `key`: a step (optim.state.P.step,
// optimizer.state.P.step) or a param group's setting.
bool OptimizerEntryKey(const std::string& key);

// SavedOptimizer of a save taken on many workers: `part` (any worker's) with
// what it reads of the files served from `entries` (every part's).
// \error as SavedOptimizer; InvalidArgument naming the key whose bytes no
//        part carries.
Result<std::optional<megatron::OptimizerMeta>> PartsOptimizer(const OptimizerPart& part,
                                                              const std::vector<EntryBytes>& entries,
                                                              const std::string& what);

// Whether `dir`'s metadata.json is Megatron-Core's for a torch_dist
// checkpoint: {"sharded_backend": "torch_dist", "common_backend": "torch", ...}.
// \error InvalidArgument naming the file and the field (not JSON, a key twice,
//        another backend); NotFound and IOError from the Env.
Status CheckMcoreMetadata(Env* env, const std::string& dir);

// The .metadata of the checkpoint in `dir`.
// \error InvalidArgument when larger than kMaxTorchPickleSize; as the Env.
Result<std::string> ReadMetadata(Env* env, const std::string& dir);

// Opens the DCP checkpoint in `dir` as a generation of `schema` and `dims` in
// `config`, checking everything (below) and writing nothing. Every key must
// name a tensor of the model by `keys`' rule (dcp.h; kTorch takes torchtitan's
// keys too, told by its tok_embeddings.weight: then the fp32 masters are the
// float32 parameters, and its train_state, lr_scheduler and dataloader tensors
// are carried), but Adam's steps and the param_groups objects, which
// SavedOptimizer reads, and the other entries SavedEntries carries (objects;
// none of them for a part, whose bytes PartsOptimizer and PartsEntries read;
// never with kMegatronCore, whose common.pt holds its state and whose
// _extra_state objects are not read). The parameters must share one
// dtype, and the optimizer state must be Adam's, whole or absent. Every chunk
// is checked: the chunks of a tensor tile it exactly, each is a torch.save
// file of one contiguous tensor of its box's shape and the tensor's dtype,
// inside its file.
// \error InvalidArgument naming the key and chunk (file and byte range) at
//        fault, or as SavedOptimizer; NotFound naming a missing file; as
//        ModelLayout::Make.
// With kMegatronCore the optimizer state may be Megatron-Core's
// DistributedOptimizer's dp_reshardable form (its bucket states, read by the
// buffer layout of `config` in the registration order of `names`:
// dist_optimizer_read.h) instead of its keys of the parameters.
// \error as above, LayOutDpReshardable and AddBucketChunks (naming the key).
Result<DcpSource> OpenDcp(Env* env, const std::string& dir, const Schema& schema, const ModelDims& dims,
                          const ParallelConfig& config, Keys keys = Keys::kTorch,
                          megatron::NameSet names = megatron::NameSet::kTe);

// As OpenDcp with the metadata given (`metadata`, named as `dir`'s). With
// `part`, the files of `dir` are one worker's share of a save taken on many
// (docs/cluster.md): the chunks of a file absent from `dir` are left out
// (every check of the metadata still made), `all_files` names every file,
// and `optimizer_part` holds the bytes of the steps, the param groups and the
// carried entries in the files that are (PartsOptimizer and PartsEntries read
// them with the other parts').
Result<DcpSource> OpenDcpPart(Env* env, const std::string& dir, std::string_view metadata, const Schema& schema,
                              const ModelDims& dims, const ParallelConfig& config, Keys keys, bool part,
                              megatron::NameSet names = megatron::NameSet::kTe);

// Writes the chunks of `source` into `writer`, each one stored piece on `worker`.
// \error as the writer and the reads of the files.
Status WriteDcpChunks(GenerationWriter& writer, const DcpSource& source, int worker, ImportResult* result,
                      const ProgressFn& progress = {});

// Writes `source` into `store` as a new generation, each chunk one stored piece
// on the worker of its config's rank 0, with `extra` as the manifest's: its
// carried entries and `save_name` (the save's directory name in dcp/, "" for
// none) in place of any before (dcp/entries.h).
// \error as the store's writer and the reads of the files.
Result<ImportResult> WriteDcp(Store* store, const DcpSource& source, nlohmann::json extra, const std::string& save_name,
                              const ProgressFn& progress = {});

// OpenDcp, then WriteDcp into the store at `store_path` (created when absent;
// its extra kept).
// \error as OpenDcp, WriteDcp and ImportWith.
Result<ImportResult> ImportDcp(Env* env, const std::string& dir, const std::string& store_path, const Schema& schema,
                               const ModelDims& dims, const ParallelConfig& config, const ProgressFn& progress = {});

}  // namespace ptc::dcp
